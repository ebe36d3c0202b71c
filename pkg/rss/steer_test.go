package rss

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

const (
	testTap    = "lkrss0"
	testQueues = 4
)

// steerEnv is a netns with a persistent 4-queue tap, the test holding every
// queue fd (as QEMU would), addresses and permanent neighbours so the stack
// routes packets out of the tap without ARP/ND.
type steerEnv struct {
	netns  ns.NetNS
	name   string
	queues []*os.File
}

func newSteerEnv(t *testing.T) *steerEnv {
	t.Helper()
	e := newSteerEnvNoQueues(t)
	e.openQueues(t)
	return e
}

// newSteerEnvNoQueues creates the netns and the persistent tap with no queue
// attached (a tap made ready before the VM starts).
func newSteerEnvNoQueues(t *testing.T) *steerEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: netns, multiqueue tap, TUNSETSTEERINGEBPF")
	}
	e := &steerEnv{netns: netnstest.New(t, "rss"), name: netnstest.Name("rss")}
	e.ip(t, "tuntap", "add", "dev", testTap, "mode", "tap", "multi_queue")
	return e
}

func (e *steerEnv) ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", e.name}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// openQueues attaches testQueues queues, as QEMU does. The tap stays down:
// nothing leaves it before up.
func (e *steerEnv) openQueues(t *testing.T) {
	t.Helper()
	err := e.netns.Do(func(ns.NetNS) error {
		for i := 0; i < testQueues; i++ {
			f, err := OpenTapQueue(testTap)
			if err != nil {
				return err
			}
			e.queues = append(e.queues, f)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, f := range e.queues {
			f.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// up brings the tap up with addresses and permanent neighbours. Every frame
// the tap carries, the ones the stack sends by itself (MLD reports, router
// solicitations, ARP) included, leaves after up: a test that attaches and
// configures steering before up knows the configuration every frame met.
func (e *steerEnv) up(t *testing.T) {
	t.Helper()
	ip := func(args ...string) { t.Helper(); e.ip(t, args...) }
	ip("link", "set", testTap, "up")
	ip("addr", "add", "10.77.0.1/24", "dev", testTap)
	ip("addr", "add", "fd77::1/64", "dev", testTap, "nodad")
	ip("neigh", "add", "10.77.0.2", "lladdr", "02:00:00:00:77:02", "dev", testTap, "nud", "permanent")
	ip("neigh", "add", "fd77::2", "lladdr", "02:00:00:00:77:02", "dev", testTap, "nud", "permanent")
}

// udpSocket is a UDP socket created in the env's netns, bound to port.
func (e *steerEnv) udpSocket(t *testing.T, v6 bool, port int) int {
	t.Helper()
	var fd int
	err := e.netns.Do(func(ns.NetNS) error {
		var err error
		if v6 {
			fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				err = unix.Bind(fd, &unix.SockaddrInet6{Port: port, Addr: netip.MustParseAddr("fd77::1").As16()})
			}
		} else {
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				err = unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{10, 77, 0, 1}})
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("udp socket port %d: %v", port, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// sendFlows sends packets of UDP flows 10.77.0.1:sport -> 10.77.0.2:dport
// (and the IPv6 twins) through the netns stack: they leave through the tap.
// It returns how many packets it sent.
func (e *steerEnv) sendFlows(t *testing.T, flows, perFlow int) int {
	t.Helper()
	sent := 0
	for i := 0; i < flows; i++ {
		v6 := i%3 == 2
		fd := e.udpSocket(t, v6, 20000+i)
		var to unix.Sockaddr = &unix.SockaddrInet4{Port: 5000 + i%5, Addr: [4]byte{10, 77, 0, 2}}
		if v6 {
			to = &unix.SockaddrInet6{Port: 5000 + i%5, Addr: netip.MustParseAddr("fd77::2").As16()}
		}
		for j := 0; j < perFlow; j++ {
			if err := unix.Sendto(fd, []byte(fmt.Sprintf("flow %d pkt %d", i, j)), 0, to); err != nil {
				t.Fatalf("send flow %d: %v", i, err)
			}
			sent++
		}
	}
	return sent
}

// frame is one frame read from a tap queue.
type frame struct {
	queue int
	data  []byte
}

// drain reads every queue until at least want TCP/UDP frames arrived and the
// queues are empty, or 5 s passed (a bound, not an assertion: the test checks
// the counts).
func (e *steerEnv) drain(t *testing.T, want int) []frame {
	t.Helper()
	var out []frame
	udp := 0
	buf := make([]byte, 4096)
	deadline := time.Now().Add(5 * time.Second)
	for got := true; (got || udp < want) && time.Now().Before(deadline); {
		got = false
		for q, f := range e.queues {
			n, err := unix.Read(int(f.Fd()), buf)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if err != nil {
				t.Fatalf("read queue %d: %v", q, err)
			}
			got = true
			out = append(out, frame{queue: q, data: append([]byte{}, buf[:n]...)})
			if isL4(FrameInput(buf[:n], AllTypes)) {
				udp++
			}
		}
		if !got {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out
}

// isL4 reports whether a FrameInput result is a TCP/UDP one.
func isL4(_ Flow, r Report) bool {
	return r == ReportTCPv4 || r == ReportUDPv4 || r == ReportTCPv6 || r == ReportUDPv6
}

func loadTestSteering(t *testing.T) (*Steering, string) {
	t.Helper()
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lanekit-test-rss-%d", os.Getpid()), testTap)
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(pin)) })
	s, err := LoadSteering(pin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, pin
}

// TestTapSteering steers a real 4-queue tap: every flow (UDP and TCP, IPv4
// and IPv6, sent through the netns stack) lands on table[hash % len] as the Go
// model computes it, a flow never spreads over two queues, and frames without
// a hash (ARP) land on the default queue. The setter's own queue fd is closed
// before any traffic: the program stays with the device.
func TestTapSteering(t *testing.T) {
	e := newSteerEnv(t)
	s, _ := loadTestSteering(t)
	key, cfg := randomSteering(14)
	if err := s.Update(key, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.AttachTap(e.name, testTap); err != nil {
		t.Fatal(err)
	}
	e.up(t)
	checkSteering(t, e, s, key, cfg)
}

// TestTapSteeringSetBeforeQueues sets the program on a persistent tap with
// no queue attached (the tap exists before its VM starts), then attaches the
// VM's queues: the program is still there and steers.
func TestTapSteeringSetBeforeQueues(t *testing.T) {
	e := newSteerEnvNoQueues(t)
	s, _ := loadTestSteering(t)
	key, cfg := randomSteering(15)
	if err := s.Update(key, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.AttachTap(e.name, testTap); err != nil {
		t.Fatal(err)
	}
	e.openQueues(t)
	e.up(t)
	checkSteering(t, e, s, key, cfg)
}

// randomSteering is a shuffled key and a random 128-entry table over the
// test's queues, default queue 3.
func randomSteering(seed uint64) (Key, Config) {
	rng := rand.New(rand.NewPCG(seed, 2))
	table := make([]uint16, TableSize)
	for i := range table {
		table[i] = uint16(rng.IntN(testQueues))
	}
	key := DefaultKey
	rng.Shuffle(len(key), func(i, j int) { key[i], key[j] = key[j], key[i] })
	return key, Config{Redirect: true, HashTypes: AllTypes, Table: table, DefaultQueue: 3}
}

// checkSteering sends UDP flows, TCP SYNs and one ARP-triggering datagram
// through the netns stack and checks where every frame read from the tap
// landed, the ones the stack sent by itself (MLD reports, router
// solicitations: IPv6 with extension headers, ICMPv6) included: the queue the
// model (FrameInput, the Go twin of the BPF parser, and the reference
// Toeplitz) gives for cfg, or the default queue for frames with no hash.
func checkSteering(t *testing.T, e *steerEnv, s *Steering, key Key, cfg Config) {
	t.Helper()
	const flows, perFlow, tcpFlows = 60, 4, 16
	sent := e.sendFlows(t, flows, perFlow)
	sent += e.sendSYNs(t, tcpFlows)
	// One IPv4 packet to an address without a neighbour entry makes the
	// stack send ARP requests out of the tap: no hash, default queue.
	e.sendTo(t, netip.MustParseAddrPort("10.77.0.3:9"))
	frames := e.drain(t, sent)

	flowQueue := map[Flow]int{}
	perQueue := make([]int, testQueues)
	l4, arp, unhashed := 0, 0, 0
	byType := map[Report]int{}
	for _, fr := range frames {
		f, r := FrameInput(fr.data, cfg.HashTypes)
		byType[r]++
		want := int(cfg.DefaultQueue)
		if r != ReportNone {
			want = int(cfg.Table[refToeplitz(key, f.Input(r))%uint32(len(cfg.Table))])
		} else {
			unhashed++
		}
		if binary.BigEndian.Uint16(fr.data[12:]) == 0x0806 {
			arp++
		}
		if fr.queue != want {
			t.Errorf("%s frame %x on queue %d, want %d", r, fr.data[:min(len(fr.data), 80)], fr.queue, want)
		}
		if !isL4(f, r) {
			continue
		}
		l4++
		perQueue[fr.queue]++
		if q, seen := flowQueue[f]; seen && q != fr.queue {
			t.Errorf("flow %v on queues %d and %d", f, q, fr.queue)
		}
		flowQueue[f] = fr.queue
	}
	if l4 < sent || len(flowQueue) != flows+tcpFlows {
		t.Fatalf("read %d TCP/UDP frames of %d flows, sent %d of %d", l4, len(flowQueue), sent, flows+tcpFlows)
	}
	for _, r := range []Report{ReportUDPv4, ReportUDPv6, ReportTCPv4, ReportTCPv6} {
		if byType[r] == 0 {
			t.Errorf("no %s frame read", r)
		}
	}
	if arp == 0 {
		t.Errorf("no ARP frame read: the default-queue case was not exercised")
	}
	used := 0
	for _, n := range perQueue {
		if n > 0 {
			used++
		}
	}
	if used < 3 {
		t.Errorf("TCP/UDP frames per queue %v: want the flows spread over at least 3 of %d queues", perQueue, testQueues)
	}
	hashed, dflt, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The program also counts frames still queued or dropped by a full queue,
	// so the counts are lower bounds.
	if hashed < uint64(len(frames)-unhashed) || dflt < uint64(unhashed) {
		t.Errorf("stats hashed %d default %d, want >= %d and >= %d", hashed, dflt, len(frames)-unhashed, unhashed)
	}
	t.Logf("%d frames: %d flows, %d TCP/UDP frames, by type %v, per queue %v, %d ARP frames", len(frames), len(flowQueue), l4, byType, perQueue, arp)
}

// sendSYNs starts TCP connections 10.77.0.1:30000+i -> 10.77.0.2:80 (odd i:
// the IPv6 twins): each sends a SYN out of the tap. It returns the flows.
func (e *steerEnv) sendSYNs(t *testing.T, flows int) int {
	t.Helper()
	for i := 0; i < flows; i++ {
		v6 := i%2 == 1
		var fd int
		err := e.netns.Do(func(ns.NetNS) error {
			var err error
			var local, to unix.Sockaddr
			dom := unix.AF_INET
			local = &unix.SockaddrInet4{Port: 30000 + i, Addr: [4]byte{10, 77, 0, 1}}
			to = &unix.SockaddrInet4{Port: 80, Addr: [4]byte{10, 77, 0, 2}}
			if v6 {
				dom = unix.AF_INET6
				local = &unix.SockaddrInet6{Port: 30000 + i, Addr: netip.MustParseAddr("fd77::1").As16()}
				to = &unix.SockaddrInet6{Port: 80, Addr: netip.MustParseAddr("fd77::2").As16()}
			}
			if fd, err = unix.Socket(dom, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
				return err
			}
			if err = unix.Bind(fd, local); err != nil {
				return err
			}
			if err = unix.Connect(fd, to); err != nil && !errors.Is(err, unix.EINPROGRESS) {
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatalf("tcp flow %d: %v", i, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
	}
	return flows
}

// sendTo sends one UDP datagram from the netns to ap.
func (e *steerEnv) sendTo(t *testing.T, ap netip.AddrPort) {
	t.Helper()
	err := e.netns.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("arp please"))
		return err
	})
	if err != nil {
		t.Fatalf("send to %s: %v", ap, err)
	}
}

// TestTapSteeringUpdateThroughPins re-opens the pinned maps (as the agent or
// a second `lanekit tap steer` does) and narrows the hash types to TCPv4:
// UDP flows then get no hash and all land on the default queue.
func TestTapSteeringUpdateThroughPins(t *testing.T) {
	e := newSteerEnv(t)
	s, pin := loadTestSteering(t)
	cfg := Config{Redirect: true, HashTypes: AllTypes, Table: RoundRobin(testQueues, TableSize), DefaultQueue: 1}
	if err := s.Update(DefaultKey, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.AttachTap(e.name, testTap); err != nil {
		t.Fatal(err)
	}
	s2, err := LoadSteering(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	cfg.HashTypes = TypeTCPv4
	if err := s2.Update(DefaultKey, cfg); err != nil {
		t.Fatal(err)
	}
	// The first handle sees the second one's write: both hold the pinned maps.
	gotKey, gotCfg, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if gotKey != DefaultKey || gotCfg.HashTypes != TypeTCPv4 || gotCfg.DefaultQueue != 1 || !slices.Equal(gotCfg.Table, cfg.Table) {
		t.Fatalf("read back key %s config %+v, want %s %+v", gotKey, gotCfg, DefaultKey, cfg)
	}
	e.up(t) // after the update: every frame meets the tcpv4-only config
	sent := e.sendFlows(t, 24, 2)
	frames := e.drain(t, sent)
	udp := 0
	for _, fr := range frames {
		// Only TCPv4 is on: everything here (UDP, ICMPv6, ARP) has no hash.
		if _, r := FrameInput(fr.data, cfg.HashTypes); r != ReportNone {
			t.Errorf("frame %x gets %s with only tcpv4 enabled", fr.data[:min(len(fr.data), 80)], r)
		}
		if fr.queue != int(cfg.DefaultQueue) {
			t.Errorf("frame %x on queue %d with only tcpv4 enabled, want default queue %d", fr.data[:min(len(fr.data), 80)], fr.queue, cfg.DefaultQueue)
		}
		if isL4(FrameInput(fr.data, AllTypes)) {
			udp++
		}
	}
	if udp != sent {
		t.Fatalf("read %d UDP frames, sent %d", udp, sent)
	}
}
