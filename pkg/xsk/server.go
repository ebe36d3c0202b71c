package xsk

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/peercred"
)

// Request is what the backend sends after connecting.
type Request struct {
	Version int    `json:"version"`
	VM      string `json:"vm"`
	// RSS: the backend takes the VM's RSS map. Only then does the offer
	// carry it, so a backend that predates it gets the reply it expects.
	RSS bool `json:"rss,omitempty"`
	// TxMeta: the backend writes AF_XDP TX metadata (struct xsk_tx_metadata,
	// checksum offload) in front of its TX frames, so the UMEM may be
	// registered with tx_metadata_len (the offer says whether it was). Only
	// then: a backend that predates it puts TX frames at offset 0 of a chunk,
	// which the kernel refuses on such a UMEM.
	TxMeta bool `json:"tx_meta,omitempty"`
	// TxGSO: the backend sends TSO/USO frames whole through a per-queue GSO
	// socket (OpenGSO) when the offer has one (QueueConfig.GSO). Only then:
	// a backend that predates it would not expect the extra fds.
	TxGSO bool `json:"tx_gso,omitempty"`
	// RxGSO: the backend receives whole packets through a per-queue
	// AF_PACKET socket (OpenRxGSO) when the offer has one
	// (QueueConfig.RxGSO); the agent then steers the VM's frames there, not
	// to the AF_XDP sockets. Only then: a backend that predates it would
	// neither expect the fds nor read them.
	RxGSO bool `json:"rx_gso,omitempty"`
}

// SizesFor is DefaultSizes with TX metadata room when the backend asked for it.
func SizesFor(req Request) Sizes {
	sz := DefaultSizes
	if req.TxMeta {
		sz.TxMetadataLen = TxMetadataLen
	}
	return sz
}

// Offer is the agent's answer; the fds travel alongside as SCM_RIGHTS.
type Offer struct {
	Version int           `json:"version"`
	Queues  []QueueConfig `json:"queues,omitempty"`
	Error   string        `json:"error,omitempty"`
	// RSS is present when the VM's RSS configuration map travels too (its
	// fd is the last one).
	RSS *RSSInfo `json:"rss,omitempty"`
}

// RSSInfo describes the VM's RSS map in an offer: a one-entry
// BPF_F_MMAPABLE array whose value is struct lk_vm_rss_cfg
// (bpf/lib/vm_rss.h) of ValueSize bytes. The backend writes its guest's RSS
// configuration there through an mmap of the fd.
type RSSInfo struct {
	ValueSize int `json:"value_size"`
}

// RSSProvider returns an fd of the VM's RSS map for one backend connection
// (the server closes it once sent) and the map's value size.
type RSSProvider func() (fd int, valueSize int, err error)

// Provider creates the sockets for one backend connection (in the VM's
// netns) and publishes them in the XSKMAP. The server sends them and closes
// its copies.
type Provider func(req Request) ([]*Socket, error)

// maxRequest bounds what a (possibly hostile) peer can make the agent read.
const maxRequest = 4096

// Server hands out sockets for one VM.
type Server struct {
	path    string
	vm      string
	ln      *net.UnixListener
	provide Provider
	rss     RSSProvider
	log     *slog.Logger
	wg      sync.WaitGroup
	// peerUID is the one non-root uid served (SetPeerUID); -1: root only.
	peerUID atomic.Int64
	refused atomic.Uint64
}

// SetPeerUID makes the server hand sockets to connectors running as uid
// (SO_PEERCRED; the VM's backend user) besides root. Everyone else is
// refused, logged and counted (Refused).
func (s *Server) SetPeerUID(uid uint32) { s.peerUID.Store(int64(uid)) }

// Refused counts connectors refused for their credentials.
func (s *Server) Refused() uint64 { return s.refused.Load() }

// checkPeer refuses a connector that is neither root nor the VM's uid.
func (s *Server) checkPeer(c *net.UnixConn) error {
	cred, err := peercred.Of(c)
	if err != nil {
		return err
	}
	if cred.Uid == 0 || int64(cred.Uid) == s.peerUID.Load() {
		return nil
	}
	s.refused.Add(1)
	return fmt.Errorf("%w: pid %d uid %d is not vm %s's backend user", ErrPeerRefused, cred.Pid, cred.Uid, s.vm)
}

// ErrPeerRefused: a connector whose credentials are not the VM's backend's.
var ErrPeerRefused = errors.New("peer refused")

// Listen creates the socket file at path, mode 0600 inside a 0700 directory,
// replacing a stale one.
func Listen(path, vm string, provide Provider, log *slog.Logger) (*Server, error) {
	return ListenRSS(path, vm, provide, nil, log)
}

// ListenRSS is Listen that also hands the VM's RSS map (rss nil: none).
func ListenRSS(path, vm string, provide Provider, rss RSSProvider, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("xsk server %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("xsk server: remove stale %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("xsk server: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("xsk server: chmod %s: %w", path, err)
	}
	s := &Server{path: path, vm: vm, ln: ln, provide: provide, rss: rss, log: log.With("vm", vm, "socket", path)}
	s.peerUID.Store(-1)
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("accept", "err", err)
			}
			return
		}
		if err := s.handle(c); err != nil {
			s.log.Warn("backend connection", "err", err)
		}
		c.Close()
	}
}

func (s *Server) handle(c *net.UnixConn) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	peerErr := s.checkPeer(c)
	buf := make([]byte, maxRequest)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if peerErr != nil {
		// Refused whatever it asked; the request is read first so the
		// reply reaches a connector still sending it (closing before
		// would reset its send).
		return s.refuse(c, peerErr)
	}
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return s.refuse(c, fmt.Errorf("request over %d bytes", maxRequest))
	}
	var req Request
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		return s.refuse(c, fmt.Errorf("malformed request: %w", err))
	}
	if req.Version != ProtocolVersion {
		return s.refuse(c, fmt.Errorf("protocol version %d, agent speaks %d", req.Version, ProtocolVersion))
	}
	if req.VM != s.vm {
		return s.refuse(c, fmt.Errorf("this socket serves vm %q, not %q", s.vm, req.VM))
	}
	socks, err := s.provide(req)
	if err != nil {
		return s.refuse(c, err)
	}
	defer CloseAll(socks)
	offer := Offer{Version: ProtocolVersion}
	var fds []int
	for _, sk := range socks {
		offer.Queues = append(offer.Queues, sk.Config)
		fds = append(fds, sk.FD, sk.UmemFD)
		if sk.Config.GSO {
			fds = append(fds, sk.GSOFD)
		}
		if sk.Config.RxGSO {
			fds = append(fds, sk.RxGSOFD)
		}
	}
	if s.rss != nil && req.RSS {
		fd, size, err := s.rss()
		if err != nil {
			return s.refuse(c, fmt.Errorf("rss map: %w", err))
		}
		defer unix.Close(fd)
		offer.RSS = &RSSInfo{ValueSize: size}
		fds = append(fds, fd)
	}
	body, err := json.Marshal(offer)
	if err != nil {
		return err
	}
	if _, _, err := c.WriteMsgUnix(body, unix.UnixRights(fds...), nil); err != nil {
		return fmt.Errorf("send sockets: %w", err)
	}
	s.log.Info("sockets handed to backend", "queues", len(socks))
	return nil
}

func (s *Server) refuse(c *net.UnixConn, cause error) error {
	body, _ := json.Marshal(Offer{Version: ProtocolVersion, Error: cause.Error()})
	c.Write(body)
	return cause
}

// Close stops accepting and removes the socket file.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	os.Remove(s.path)
	return err
}

// Fetch is the backend's side of the protocol, for tests and tools written in
// Go: it returns the offer and the received fds (the caller closes them).
func Fetch(path, vm string, timeout time.Duration) (Offer, []int, error) {
	return FetchRSS(path, vm, false, timeout)
}

// FetchRSS is Fetch that also asks for the VM's RSS map (its fd comes last).
func FetchRSS(path, vm string, rss bool, timeout time.Duration) (Offer, []int, error) {
	return FetchRequest(path, Request{Version: ProtocolVersion, VM: vm, RSS: rss}, timeout)
}

// FetchRequest is Fetch with the whole request given; the fds come in the
// offer's order: per queue [xsk, umem, gso if the queue's GSO is set, rx
// gso if its RxGSO is set], then the RSS map.
func FetchRequest(path string, r Request, timeout time.Duration) (Offer, []int, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return Offer{}, nil, fmt.Errorf("connect %s: %w", path, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	req, _ := json.Marshal(r)
	if _, err := c.Write(req); err != nil {
		return Offer{}, nil, fmt.Errorf("send request: %w", err)
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*(3*256+1)))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return Offer{}, nil, fmt.Errorf("read offer: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return Offer{}, nil, fmt.Errorf("parse control message: %w", err)
		}
		for _, m := range msgs {
			f, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, f...)
			}
		}
	}
	var offer Offer
	if err := json.Unmarshal(buf[:n], &offer); err != nil {
		closeFDs(fds)
		return Offer{}, nil, fmt.Errorf("malformed offer: %w", err)
	}
	if offer.Error != "" {
		closeFDs(fds)
		return offer, nil, fmt.Errorf("agent refused: %s", offer.Error)
	}
	want := 2 * len(offer.Queues)
	for _, q := range offer.Queues {
		if q.GSO {
			want++ // the queue's GSO socket, after its pair
		}
		if q.RxGSO {
			want++ // its wire -> guest socket, next
		}
	}
	if offer.RSS != nil {
		want++ // the RSS map, last
	}
	if len(fds) != want {
		closeFDs(fds)
		return offer, nil, fmt.Errorf("offer has %d queues (rss map: %t) but %d fds", len(offer.Queues), offer.RSS != nil, len(fds))
	}
	return offer, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
