package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The socket load balancer (bpf/sock.c): cgroup sock_addr programs that give
// the node's own processes and hostNetwork pods the services the packet path
// gives pods, on the same maps (lk_lb_svc, lk_lb_backends, the Maglev tables,
// lk_lb_affinity). Its links are pinned like the others; a restarted agent
// updates them in place.

// SockLBConfig is where and for whom the socket load balancer works.
type SockLBConfig struct {
	// Cgroup is a cgroup2 directory: sockets of processes in it and below
	// it are load-balanced. A node attaches to its cgroup2 root; the lab
	// and tests attach to a child cgroup of their own.
	Cgroup string
	// NodeAddr is the node's address: the frontend a NodePort on loopback
	// stands for, and the client address ClientIP affinity sees.
	NodeAddr netip.Addr
	// NetnsCookie is the node's network namespace: sockets of any other
	// namespace are never translated. 0: the calling thread's.
	NetnsCookie uint64
}

// sockHook is one attach point of the socket load balancer.
type sockHook struct {
	name   string // pin suffix and counter name
	index  uint32 // enum lk_sock_hook
	attach ebpf.AttachType
	prog   func(*sockObjects) *ebpf.Program
}

const pinSockLink = "lk_sock_" // + hook name

var sockHooks = []sockHook{
	{"connect4", uint32(sockLkSockHookSOCK_HOOK_CONNECT4), ebpf.AttachCGroupInet4Connect,
		func(o *sockObjects) *ebpf.Program { return o.LkSockConnect4 }},
	{"sendmsg4", uint32(sockLkSockHookSOCK_HOOK_SENDMSG4), ebpf.AttachCGroupUDP4Sendmsg,
		func(o *sockObjects) *ebpf.Program { return o.LkSockSendmsg4 }},
	{"recvmsg4", uint32(sockLkSockHookSOCK_HOOK_RECVMSG4), ebpf.AttachCGroupUDP4Recvmsg,
		func(o *sockObjects) *ebpf.Program { return o.LkSockRecvmsg4 }},
	{"getpeername4", uint32(sockLkSockHookSOCK_HOOK_GETPEERNAME4), ebpf.AttachCgroupInet4GetPeername,
		func(o *sockObjects) *ebpf.Program { return o.LkSockGetpeername4 }},
	// IPv6 sockets: IPv4 services named by IPv4-mapped addresses.
	{"connect6", uint32(sockLkSockHookSOCK_HOOK_CONNECT6), ebpf.AttachCGroupInet6Connect,
		func(o *sockObjects) *ebpf.Program { return o.LkSockConnect6 }},
	{"sendmsg6", uint32(sockLkSockHookSOCK_HOOK_SENDMSG6), ebpf.AttachCGroupUDP6Sendmsg,
		func(o *sockObjects) *ebpf.Program { return o.LkSockSendmsg6 }},
	{"recvmsg6", uint32(sockLkSockHookSOCK_HOOK_RECVMSG6), ebpf.AttachCGroupUDP6Recvmsg,
		func(o *sockObjects) *ebpf.Program { return o.LkSockRecvmsg6 }},
	{"getpeername6", uint32(sockLkSockHookSOCK_HOOK_GETPEERNAME6), ebpf.AttachCgroupInet6GetPeername,
		func(o *sockObjects) *ebpf.Program { return o.LkSockGetpeername6 }},
}

// SockHookNames are the socket load balancer's hooks, in counter order.
func SockHookNames() []string {
	out := make([]string, len(sockHooks))
	for i, h := range sockHooks {
		out[i] = h.name
	}
	return out
}

// SockCounters are one socket hook's counters, summed over CPUs.
type SockCounters struct {
	Translated uint64 // forward: frontend -> backend; reverse: backend -> frontend
	NoBackend  uint64 // the call failed with ECONNREFUSED: the frontend has no backend
	SrcRange   uint64 // the call failed with EPERM: loadBalancerSourceRanges leave the node out
}

// NetnsCookie returns the calling thread's network namespace cookie.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	return c, nil
}

// EnsureCgroup2 makes dir a cgroup2 directory: an existing one (a mount or a
// cgroup below one) is used as it is; a missing dir below a cgroup2 mount is
// created (a child cgroup); otherwise the cgroup2 hierarchy is mounted at dir
// (created if missing; only on an empty directory), as Cilium does when the
// node has no cgroup2 mount.
func EnsureCgroup2(dir string) error {
	dir = filepath.Clean(dir)
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			if st.Type == unix.CGROUP2_SUPER_MAGIC {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
				return nil
			}
			break
		}
		if !errors.Is(err, unix.ENOENT) || d == filepath.Dir(d) {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup2 at %s: %w", dir, err)
	}
	// Never over something: a cgroup v1 tree, a populated directory.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) > 0 {
		return fmt.Errorf("cgroup2 at %s: not a cgroup2 directory, and not empty to mount one (%v)", dir, err)
	}
	if err := unix.Mount("none", dir, "cgroup2", 0, ""); err != nil {
		return fmt.Errorf("mount cgroup2 at %s: %w", dir, err)
	}
	return nil
}

// cgroupID is the ID of the cgroup2 directory dir (its inode number).
func cgroupID(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// loadSock loads the socket programs on the pinned service maps, configured
// for c.
func (l *Loader) loadSock(c SockLBConfig) (*sockObjects, error) {
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	var addr [4]byte
	if c.NodeAddr.Is4() {
		addr = c.NodeAddr.As4()
	}
	if err := spec.Variables[sockVarSockNodeAddr4].Set(addr); err != nil {
		return nil, fmt.Errorf("set sock_node_addr4: %w", err)
	}
	if err := spec.Variables[sockVarSockNetnsCookie].Set(c.NetnsCookie); err != nil {
		return nil, fmt.Errorf("set sock_netns_cookie: %w", err)
	}
	if err := l.migrate(spec); err != nil {
		return nil, err
	}
	var objs sockObjects
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.PinDir}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load socket programs: %w", mapIncompatibleHint(err, l.cfg.PinDir))
	}
	return &objs, nil
}

// AttachSockLB attaches the socket load balancer to c.Cgroup, or updates the
// programs behind its pinned links in place (a restarted agent). Links
// pinned for another cgroup are replaced.
func (l *Loader) AttachSockLB(c SockLBConfig) error {
	if c.Cgroup == "" {
		return errors.New("socket lb: no cgroup")
	}
	if c.NodeAddr.IsValid() && !c.NodeAddr.Is4() {
		return fmt.Errorf("socket lb: node address %s is not IPv4", c.NodeAddr)
	}
	if c.NetnsCookie == 0 {
		var err error
		if c.NetnsCookie, err = NetnsCookie(); err != nil {
			return fmt.Errorf("socket lb: %w", err)
		}
	}
	cg, err := cgroupID(c.Cgroup)
	if err != nil {
		return fmt.Errorf("socket lb: cgroup %s: %w", c.Cgroup, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	objs, err := l.loadSock(c)
	if err != nil {
		return fmt.Errorf("socket lb: %w", err)
	}
	defer objs.Close()
	for _, h := range sockHooks {
		if err := l.attachCgroup(pinSockLink+h.name, c.Cgroup, cg, h.attach, h.prog(objs)); err != nil {
			return fmt.Errorf("socket lb: %s: %w", h.name, err)
		}
	}
	if l.sock != nil {
		l.sock.Close()
	}
	maps := objs.sockMaps
	l.sock = &maps
	objs.sockMaps = sockMaps{} // kept open for the counters
	l.log.Info("socket load balancer attached", "cgroup", c.Cgroup, "node_addr", c.NodeAddr, "netns_cookie", c.NetnsCookie)
	return nil
}

// attachCgroup makes prog the program behind the cgroup link pinned as pin.
func (l *Loader) attachCgroup(pin, dir string, cg uint64, at ebpf.AttachType, prog *ebpf.Program) error {
	path := filepath.Join(l.cfg.PinDir, pin)
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		same := false
		if info, err := old.Info(); err == nil && info.Cgroup() != nil {
			same = info.Cgroup().CgroupId == cg
		}
		if same {
			err := old.Update(prog)
			old.Close()
			if err == nil {
				return nil
			}
			l.log.Warn("pinned cgroup link update failed, re-attaching", "pin", pin, "err", err)
		} else {
			old.Close()
		}
		if err := l.detach(pin); err != nil {
			return err
		}
	}
	lnk, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: at, Program: prog})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("attach to cgroup %s: %w", dir, ErrNotSupported)
		}
		return fmt.Errorf("attach to cgroup %s: %w", dir, err)
	}
	defer lnk.Close()
	if err := lnk.Pin(path); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// DetachSockLB detaches the socket load balancer (unpins its links).
func (l *Loader) DetachSockLB() error {
	var errs []error
	for _, h := range sockHooks {
		errs = append(errs, l.detach(pinSockLink+h.name))
	}
	return errors.Join(errs...)
}

// SockLBStats returns the socket load balancer's counters by hook name
// (empty before AttachSockLB).
func (l *Loader) SockLBStats() (map[string]SockCounters, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sockStats()
}

// sockStats is SockLBStats under l.mu.
func (l *Loader) sockStats() (map[string]SockCounters, error) {
	out := map[string]SockCounters{}
	if l.sock == nil || l.sock.LkSockStats == nil {
		return out, nil
	}
	sum := func(k uint32) (uint64, error) {
		var per []uint64
		if err := l.sock.LkSockStats.Lookup(k, &per); err != nil {
			return 0, fmt.Errorf("socket lb counters: %w", err)
		}
		var n uint64
		for _, c := range per {
			n += c
		}
		return n, nil
	}
	stride := uint32(sockLkSockStatSOCK_STAT_MAX)
	for _, h := range sockHooks {
		var c SockCounters
		var err error
		if c.Translated, err = sum(h.index*stride + uint32(sockLkSockStatSOCK_STAT_TRANSLATED)); err != nil {
			return nil, err
		}
		if c.NoBackend, err = sum(h.index*stride + uint32(sockLkSockStatSOCK_STAT_NO_BACKEND)); err != nil {
			return nil, err
		}
		if c.SrcRange, err = sum(h.index*stride + uint32(sockLkSockStatSOCK_STAT_SRC_RANGE)); err != nil {
			return nil, err
		}
		out[h.name] = c
	}
	return out, nil
}
