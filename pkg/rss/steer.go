package rss

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PinRoot holds the steering maps of every tap lanekit steers:
// PinRoot/<netns>/<tap>/<map>, where <netns> is "host" for the caller's own
// namespace. The agent (or QEMU, whose rss.bpf.c uses the same value
// layouts) updates a tap's steering by writing these maps.
const PinRoot = "/sys/fs/bpf/lanekit/tap"

// Map names in the pin directory.
const (
	MapConfig = "lk_tap_rss_config" // struct rss_config_t (QEMU layout), 1 entry
	MapKey    = "lk_tap_rss_key"    // Toeplitz key (QEMU layout), 1 entry
	MapTable  = "lk_tap_rss_table"  // 128 x u16 indirection table
	MapStats  = "lk_tap_rss_stats"  // per-CPU u64: [0] hashed, [1] default queue
)

// PinDir is the pin directory of tap in netns (a name under /run/netns, a
// path, or "" for the caller's namespace).
func PinDir(netns, tap string) string {
	n := "host"
	if netns != "" {
		n = filepath.Base(netns)
	}
	return filepath.Join(PinRoot, n, tap)
}

// Steering is a loaded bpf/tun_steer.c with its maps.
type Steering struct {
	objs   tunsteerObjects
	pinDir string
}

// LoadSteering loads the tap steering program. With pinDir set, maps already
// pinned there are reused (so a second `lanekit tap steer` updates the same
// maps QEMU or the agent hold) and new ones are pinned there.
func LoadSteering(pinDir string) (*Steering, error) {
	spec, err := loadTunsteer()
	if err != nil {
		return nil, fmt.Errorf("load tap steering spec: %w", err)
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	defer func() {
		for _, m := range opts.MapReplacements {
			m.Close()
		}
	}()
	if pinDir != "" {
		for _, name := range []string{MapConfig, MapKey, MapTable, MapStats} {
			m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("open pinned map %s: %w", name, err)
			}
			opts.MapReplacements[name] = m
		}
	}
	s := &Steering{pinDir: pinDir}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("load tap steering program (needs root or CAP_BPF+CAP_NET_ADMIN): %w", err)
		}
		return nil, fmt.Errorf("load tap steering program: %w", err)
	}
	if pinDir == "" {
		return s, nil
	}
	if err := os.MkdirAll(pinDir, 0o755); err != nil {
		s.Close()
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	for name, m := range map[string]*ebpf.Map{MapConfig: s.objs.LkTapRssConfig, MapKey: s.objs.LkTapRssKey,
		MapTable: s.objs.LkTapRssTable, MapStats: s.objs.LkTapRssStats} {
		if _, ok := opts.MapReplacements[name]; ok {
			continue
		}
		if err := m.Pin(filepath.Join(pinDir, name)); err != nil {
			s.Close()
			return nil, fmt.Errorf("pin %s: %w", name, err)
		}
	}
	return s, nil
}

// Close releases this process's handles; pinned maps and a program attached
// to a tap stay.
func (s *Steering) Close() error { return s.objs.Close() }

// Unpin removes the pinned maps (the pin directory).
func (s *Steering) Unpin() error {
	if s.pinDir == "" {
		return nil
	}
	return os.RemoveAll(s.pinDir)
}

// Update writes key, table and configuration; the configuration goes last so
// a packet never sees a table length larger than the written table.
func (s *Steering) Update(key Key, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	zero := uint32(0)
	if err := s.objs.LkTapRssKey.Put(zero, key.qemuBytes()); err != nil {
		return fmt.Errorf("write rss key: %w", err)
	}
	for i, q := range cfg.Table {
		if err := s.objs.LkTapRssTable.Put(uint32(i), q); err != nil {
			return fmt.Errorf("write indirection table entry %d: %w", i, err)
		}
	}
	if err := s.objs.LkTapRssConfig.Put(zero, cfg.qemuBytes()); err != nil {
		return fmt.Errorf("write rss config: %w", err)
	}
	return nil
}

// Stats is how many packets the program steered through the table and how
// many went to the default queue.
func (s *Steering) Stats() (hashed, dflt uint64, err error) {
	sum := func(i uint32) (uint64, error) {
		var per []uint64
		if err := s.objs.LkTapRssStats.Lookup(i, &per); err != nil {
			return 0, fmt.Errorf("read steering stats: %w", err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n, nil
	}
	if hashed, err = sum(0); err != nil {
		return 0, 0, err
	}
	dflt, err = sum(1)
	return hashed, dflt, err
}

// OpenTapQueue attaches a new queue to the multiqueue tap name in the
// calling thread's network namespace (creating the tap if it does not exist,
// as QEMU does) and returns its fd, non-blocking. Only one queue is created
// per call; the device keeps IFF_MULTI_QUEUE semantics.
func OpenTapQueue(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("attach a queue to tap %s (TUNSETIFF, IFF_MULTI_QUEUE; is it a multiqueue tap?): %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// inNetns runs fn in netns ("" = here; a name under /run/netns or a path) on
// a locked OS thread.
func inNetns(netns string, fn func() error) error {
	if netns == "" {
		return fn()
	}
	path := netns
	if filepath.Base(path) == path {
		path = filepath.Join("/run/netns", netns)
	}
	return netdev.InNetns(path, fn)
}

// setSteering attaches a queue fd to tap, sets the steering program (progFD,
// or -1 to remove it) and closes the fd again. The program belongs to the
// tun device, not to the queue: it stays until it is replaced or the device
// is destroyed (a persistent tap, or one whose other queues are open,
// outlives our queue).
func setSteering(netns, tap string, progFD int) error {
	return inNetns(netns, func() error {
		// TUNSETIFF would create a missing tap: look first.
		link, err := netlink.LinkByName(tap)
		if err != nil {
			return fmt.Errorf("find tap %s: %w", tap, err)
		}
		if link.Type() != "tuntap" {
			return fmt.Errorf("%s is a %s device, not a tap", tap, link.Type())
		}
		f, err := OpenTapQueue(tap)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.TUNSETSTEERINGEBPF, progFD); err != nil {
			return fmt.Errorf("TUNSETSTEERINGEBPF on %s: %w", tap, err)
		}
		return nil
	})
}

// AttachTap makes the program steer the multiqueue tap in netns.
func (s *Steering) AttachTap(netns, tap string) error {
	return setSteering(netns, tap, s.objs.TunSteer.FD())
}

// DetachTap removes any steering program from the tap (the kernel falls back
// to its flow hash).
func DetachTap(netns, tap string) error { return setSteering(netns, tap, -1) }

// Read returns the key and configuration in the maps.
func (s *Steering) Read() (Key, Config, error) {
	var key Key
	var cfg Config
	zero := uint32(0)
	var kb, cb []byte
	if err := s.objs.LkTapRssKey.Lookup(zero, &kb); err != nil {
		return key, cfg, fmt.Errorf("read rss key: %w", err)
	}
	if err := s.objs.LkTapRssConfig.Lookup(zero, &cb); err != nil {
		return key, cfg, fmt.Errorf("read rss config: %w", err)
	}
	if len(kb) != KeySize || len(cb) != 10 {
		return key, cfg, fmt.Errorf("read rss maps: value sizes %d and %d, want %d and 10", len(kb), len(cb), KeySize)
	}
	binary.BigEndian.PutUint32(key[:4], binary.LittleEndian.Uint32(kb[:4]))
	copy(key[4:], kb[4:])
	cfg.Redirect = cb[0] != 0
	cfg.PopulateHash = cb[1] != 0
	cfg.HashTypes = HashTypes(binary.LittleEndian.Uint32(cb[2:6]))
	n := int(binary.LittleEndian.Uint16(cb[6:8]))
	cfg.DefaultQueue = binary.LittleEndian.Uint16(cb[8:10])
	if n > TableSize {
		return key, cfg, fmt.Errorf("read rss config: table length %d > %d", n, TableSize)
	}
	cfg.Table = make([]uint16, n)
	for i := range cfg.Table {
		if err := s.objs.LkTapRssTable.Lookup(uint32(i), &cfg.Table[i]); err != nil {
			return key, cfg, fmt.Errorf("read indirection table entry %d: %w", i, err)
		}
	}
	return key, cfg, nil
}

// OpenPinnedSteering opens the maps a previous LoadSteering pinned in
// pinDir; it fails when there are none.
func OpenPinnedSteering(pinDir string) (*Steering, error) {
	for _, name := range []string{MapConfig, MapKey, MapTable, MapStats} {
		if _, err := os.Stat(filepath.Join(pinDir, name)); err != nil {
			return nil, fmt.Errorf("no steering maps in %s (run 'lanekit tap steer' first): %w", pinDir, err)
		}
	}
	return LoadSteering(pinDir)
}
