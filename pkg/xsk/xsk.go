// Package xsk creates AF_XDP sockets for a VM's queues on the agent's side and
// hands them to the unprivileged lanekit-vhost backend over a unix socket, so
// the backend needs neither CAP_NET_RAW nor CAP_BPF.
//
// # Fd-passing protocol (version 1)
//
// The agent listens on a unix SOCK_SEQPACKET socket (mode 0600), one per VM.
// The backend connects and sends one message, a JSON request:
//
//	{"version":1,"vm":"<name>","rss":true}
//
// ("rss" optional: the backend takes the VM's RSS map; "tx_meta":true optional:
// the backend writes AF_XDP TX metadata, see TxMetadataLen; "tx_gso":true: it
// takes a GSO socket per queue, see OpenGSO; "rx_gso":true: it receives through
// a packet socket per queue, see OpenRxGSO.)
//
// The agent answers with ONE message: a JSON body
//
//	{"version":1,"queues":[{"queue":0,"umem_size":N,"frame_size":2048,"frame_count":N,
//	  "fill_size":2048,"comp_size":2048,"rx_size":2048,"tx_size":2048}, ...]}
//
// carrying SCM_RIGHTS fds ordered [xsk0, umem0, xsk1, umem1, ...], a queue's
// GSO socket ("gso":true) and then its wire -> guest socket ("rx_gso":true)
// right after its pair. When the
// backend asked for it ("rss":true) and the agent has the VM's RSS map, the
// body also has "rss":{"value_size":N} and the map's fd comes last (see
// RSSInfo). Each xsk is already bound (copy mode) to queue i of the VM's device and inserted into
// the XSKMAP; its UMEM is the memfd umem_i, registered in aligned mode with
// headroom 0 and chunk = frame_size; when the request had "tx_meta":true and the
// kernel takes it (>= 6.8), with XDP_UMEM_TX_METADATA_LEN and tx_metadata_len
// TxMetadataLen, and the queue entry then says "tx_metadata_len":24 (absent: 0,
// the backend falls back to software checksums). The backend mmaps the memfd and the four
// rings (getsockopt XDP_MMAP_OFFSETS), owns every frame (it fills the fill ring
// itself and uses the rest for tx). On an error the agent answers
// {"version":1,"error":"..."} without fds. Each connection gets fresh sockets:
// a backend that reconnects after a restart gets new ones, and the old ones
// leave the XSKMAP when their last fd closes.
package xsk

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ProtocolVersion is the fd-passing protocol version.
const ProtocolVersion = 1

// Sizes are a socket's UMEM and ring sizes. Ring sizes must be powers of two.
type Sizes struct {
	FrameSize  uint32
	FrameCount uint32
	FillSize   uint32
	CompSize   uint32
	RxSize     uint32
	TxSize     uint32
	// TxMetadataLen > 0: register the UMEM with this much TX metadata room
	// in front of every TX frame (falls back to 0 when the kernel refuses).
	TxMetadataLen uint32
}

// TxMetadataLen is the room for struct xsk_tx_metadata (24 bytes since 6.15,
// 16 before; the kernel takes any multiple of 8 below 256).
const TxMetadataLen = 24

// DefaultSizes: 4096 frames of 2 KiB (8 MiB of UMEM per queue), 2048-entry rings.
var DefaultSizes = Sizes{FrameSize: 2048, FrameCount: 4096, FillSize: 2048, CompSize: 2048, RxSize: 2048, TxSize: 2048}

func (s Sizes) validate() error {
	pow2 := func(v uint32) bool { return v != 0 && v&(v-1) == 0 }
	if !pow2(s.FillSize) || !pow2(s.CompSize) || !pow2(s.RxSize) || !pow2(s.TxSize) {
		return fmt.Errorf("ring sizes must be powers of two: %+v", s)
	}
	if s.FrameSize < 2048 || s.FrameSize > 4096 || !pow2(s.FrameSize) {
		return fmt.Errorf("frame size %d: must be 2048 or 4096 in aligned mode", s.FrameSize)
	}
	if s.FrameCount < s.FillSize {
		return fmt.Errorf("%d frames cannot fill a %d-entry fill ring", s.FrameCount, s.FillSize)
	}
	return nil
}

// QueueConfig describes one socket in the agent's answer.
type QueueConfig struct {
	Queue      uint32 `json:"queue"`
	UmemSize   uint64 `json:"umem_size"`
	FrameSize  uint32 `json:"frame_size"`
	FrameCount uint32 `json:"frame_count"`
	FillSize   uint32 `json:"fill_size"`
	CompSize   uint32 `json:"comp_size"`
	RxSize     uint32 `json:"rx_size"`
	TxSize     uint32 `json:"tx_size"`
	// TxMetadataLen is the UMEM's tx_metadata_len (0: none).
	TxMetadataLen uint32 `json:"tx_metadata_len,omitempty"`
	// GSO: the queue's GSO socket (OpenGSO) follows its pair of fds.
	GSO bool `json:"gso,omitempty"`
	// RxGSO: the queue's wire -> guest socket (OpenRxGSO) follows, after
	// the GSO socket if any.
	RxGSO bool `json:"rx_gso,omitempty"`
}

// Socket is a bound AF_XDP socket and the memfd backing its UMEM, the
// queue's GSO socket when Config.GSO (AddGSO) and its wire -> guest socket
// when Config.RxGSO (AddRxGSO).
type Socket struct {
	FD      int
	UmemFD  int
	GSOFD   int
	RxGSOFD int
	Config  QueueConfig
}

// Close closes the agent's copies of the fds.
func (s *Socket) Close() error {
	var err error
	if s.FD >= 0 {
		err = unix.Close(s.FD)
		s.FD = -1
	}
	if s.UmemFD >= 0 {
		if e := unix.Close(s.UmemFD); err == nil {
			err = e
		}
		s.UmemFD = -1
	}
	if e := s.closeGSO(); err == nil {
		err = e
	}
	if e := s.closeRxGSO(); err == nil {
		err = e
	}
	return err
}

// Open creates an AF_XDP socket with a memfd UMEM and binds it in copy mode
// to queue of the device ifindex. The calling thread must be in the device's
// network namespace. The agent's mapping of the UMEM is dropped before
// returning: the kernel keeps the pages pinned, the backend maps the memfd.
func Open(ifindex int, queue uint32, sz Sizes) (_ *Socket, err error) {
	if err := sz.validate(); err != nil {
		return nil, fmt.Errorf("open xsk: %w", err)
	}
	umemSize := uint64(sz.FrameSize) * uint64(sz.FrameCount)
	s := &Socket{FD: -1, UmemFD: -1, GSOFD: -1, RxGSOFD: -1, Config: QueueConfig{Queue: queue, UmemSize: umemSize, FrameSize: sz.FrameSize,
		FrameCount: sz.FrameCount, FillSize: sz.FillSize, CompSize: sz.CompSize, RxSize: sz.RxSize, TxSize: sz.TxSize}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	s.UmemFD, err = unix.MemfdCreate(fmt.Sprintf("lanekit-umem-q%d", queue), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("open xsk: memfd: %w", err)
	}
	if err := unix.Ftruncate(s.UmemFD, int64(umemSize)); err != nil {
		return nil, fmt.Errorf("open xsk: size umem: %w", err)
	}
	mem, err := unix.Mmap(s.UmemFD, 0, int(umemSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("open xsk: map umem: %w", err)
	}
	defer unix.Munmap(mem)

	s.FD, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if err == unix.EAFNOSUPPORT {
			return nil, fmt.Errorf("open xsk: kernel without AF_XDP: %w", err)
		}
		return nil, fmt.Errorf("open xsk: socket: %w", err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptrOf(mem)), Len: umemSize, Size: sz.FrameSize}
	if sz.TxMetadataLen > 0 {
		meta := reg
		meta.Flags, meta.Tx_metadata_len = unix.XDP_UMEM_TX_METADATA_LEN, sz.TxMetadataLen
		// Kernels before 6.8 refuse the flag (EINVAL): register without.
		if err := setsockoptUmemReg(s.FD, &meta); err == nil {
			s.Config.TxMetadataLen = sz.TxMetadataLen
		} else if err != unix.EINVAL {
			return nil, fmt.Errorf("open xsk: register umem with tx metadata: %w", err)
		}
	}
	if s.Config.TxMetadataLen == 0 {
		if err := setsockoptUmemReg(s.FD, &reg); err != nil {
			return nil, fmt.Errorf("open xsk: register umem: %w", err)
		}
	}
	for _, o := range []struct {
		opt  int
		size uint32
		name string
	}{
		{unix.XDP_UMEM_FILL_RING, sz.FillSize, "fill"},
		{unix.XDP_UMEM_COMPLETION_RING, sz.CompSize, "completion"},
		{unix.XDP_RX_RING, sz.RxSize, "rx"},
		{unix.XDP_TX_RING, sz.TxSize, "tx"},
	} {
		if err := unix.SetsockoptInt(s.FD, unix.SOL_XDP, o.opt, int(o.size)); err != nil {
			return nil, fmt.Errorf("open xsk: %s ring: %w", o.name, err)
		}
	}
	sa := &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(ifindex), QueueID: queue}
	if err := unix.Bind(s.FD, sa); err != nil {
		return nil, fmt.Errorf("open xsk: bind ifindex %d queue %d: %w", ifindex, queue, err)
	}
	return s, nil
}

// OpenQueues opens one socket per queue 0..n-1 of ifindex.
func OpenQueues(ifindex, n int, sz Sizes) ([]*Socket, error) {
	var socks []*Socket
	for q := 0; q < n; q++ {
		s, err := Open(ifindex, uint32(q), sz)
		if err != nil {
			CloseAll(socks)
			return nil, err
		}
		socks = append(socks, s)
	}
	return socks, nil
}

// CloseAll closes the agent's copies of every socket.
func CloseAll(socks []*Socket) {
	for _, s := range socks {
		s.Close()
	}
}
