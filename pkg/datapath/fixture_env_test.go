package datapath

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// fixtureEnv is a private network namespace, entered by the test's locked OS
// thread, holding two pod devices, an uplink with routes and neighbours, and
// a loaded datapath. BPF_PROG_TEST_RUN consults this namespace's FIB.
type fixtureEnv struct {
	dp             *Loader
	pinDir         string
	h1, h2, h3, up netlink.Link // pod 1, pod 2 and VM 3 host ends, uplink
	ep1, ep2, ep3  Endpoint
	ep4            Endpoint         // an L3 netkit pod (map entries only: this kernel may lack netkit)
	ep5            Endpoint         // a VM with 4 queues (map entries only)
	neighMAC       net.HardwareAddr // permanent neighbour 10.77.0.2
	tunnel         bool             // tunnel mode (tunnelFixtureEnv): runFixtures checks the tunnel counters
	origNS, newNS  netns.NsHandle
}

var (
	pod1MAC  = mustMAC("02:00:00:01:00:0a")
	pod2MAC  = mustMAC("02:00:00:01:00:0b")
	vm3MAC   = mustMAC("02:00:00:01:00:0c")
	neighMAC = mustMAC("02:00:00:77:00:02")
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// newFixtureEnv builds the namespace. It locks the calling goroutine to its
// thread for the rest of the test.
func newFixtureEnv(t *testing.T) *fixtureEnv {
	t.Helper()
	return newFixtureEnvCfg(t, nil)
}

// newFixtureEnvCfg is newFixtureEnv with a hook that adjusts the datapath
// configuration before it is opened.
func newFixtureEnvCfg(t *testing.T, adjust func(*Config)) *fixtureEnv {
	t.Helper()
	testutil.RequireBPFFS(t)
	runtime.LockOSThread()
	e := &fixtureEnv{}
	var err error
	if e.origNS, err = netns.Get(); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	if e.newNS, err = netns.New(); err != nil {
		e.origNS.Close()
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	// No IPv6 in the fixture namespace: the kernel's router solicitations and
	// neighbour discovery on the test devices would pass through the programs
	// under test and add counters and events the tests do not expect.
	for _, f := range []string{"all", "default"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", []byte("1"), 0); err != nil {
			t.Logf("disable IPv6 in the fixture netns: %v", err)
		}
	}
	t.Cleanup(func() {
		if e.dp != nil {
			e.dp.Close()
		}
		Unpin(e.pinDir)
		netns.Set(e.origNS)
		e.newNS.Close() // last reference: the namespace and its links go away
		e.origNS.Close()
		runtime.UnlockOSThread()
	})

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("ip_forward", os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644))
	lo, err := netlink.LinkByName("lo")
	must("lo", err)
	must("lo up", netlink.LinkSetUp(lo))

	e.h1 = addVeth(t, "lk-fx-h1", "lk-fx-p1")
	e.h2 = addVeth(t, "lk-fx-h2", "lk-fx-p2")
	e.h3 = addVeth(t, "lk-fx-h3", "lk-fx-p3")
	e.up = addVeth(t, "lk-fx-up", "lk-fx-wire")
	addr, _ := netlink.ParseAddr("10.77.0.1/24")
	must("uplink addr", netlink.AddrAdd(e.up, addr))
	must("neigh", netlink.NeighAdd(&netlink.Neigh{LinkIndex: e.up.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("10.77.0.2"), HardwareAddr: neighMAC, Family: netlink.FAMILY_V4}))
	e.neighMAC = neighMAC
	route := func(cidr, gw string, typ int) {
		_, dst, _ := net.ParseCIDR(cidr)
		r := &netlink.Route{Dst: dst, Type: typ}
		if gw != "" {
			r.Gw = net.ParseIP(gw)
			r.LinkIndex = e.up.Attrs().Index
		}
		must("route "+cidr, netlink.RouteAdd(r))
	}
	route("10.244.2.0/24", "10.77.0.2", 0)
	route("10.244.3.0/24", "10.77.0.3", 0) // no neighbour: NO_NEIGH
	route("10.99.0.0/16", "", 6)           // RTN_BLACKHOLE
	route("10.98.0.0/16", "", 7)           // RTN_UNREACHABLE
	route("10.97.0.0/16", "", 8)           // RTN_PROHIBIT
	route("0.0.0.0/0", "10.77.0.2", 0)     // a default route, as nodes have: multicast/broadcast must not follow it

	e.pinDir = filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-%d-%s", os.Getpid(), sanitize(t.Name())))
	cfg := Config{PinDir: e.pinDir, Uplink: "lk-fx-up", traceRedirects: true}
	if adjust != nil {
		adjust(&cfg)
	}
	e.dp, err = Open(cfg, nil)
	must("open datapath", err)

	e.ep1 = Endpoint{ID: 1, Mode: ModeVeth, IfName: "lk-fx-h1", IfIndex: e.h1.Attrs().Index,
		IP: mustAddr("10.244.1.10"), MAC: pod1MAC, HostMAC: e.h1.Attrs().HardwareAddr}
	e.ep2 = Endpoint{ID: 2, Mode: ModeVeth, IfName: "lk-fx-h2", IfIndex: e.h2.Attrs().Index,
		IP: mustAddr("10.244.1.11"), MAC: pod2MAC, HostMAC: e.h2.Attrs().HardwareAddr}
	e.ep3 = Endpoint{ID: 3, Mode: ModeVeth, IfName: "lk-fx-h3", IfIndex: e.h3.Attrs().Index,
		IP: mustAddr("10.244.1.12"), MAC: vm3MAC, HostMAC: e.h3.Attrs().HardwareAddr, Queues: 1, VM: true}
	must("upsert ep1", e.dp.UpsertEndpoint(e.ep1))
	must("upsert ep3", e.dp.UpsertEndpoint(e.ep3))
	must("upsert ep2", e.dp.UpsertEndpoint(e.ep2))

	// A netkit L3 device has the all-zero MAC on both ends. The pod program
	// is the same; only the endpoint's mode differs. Its entries are written
	// directly (attaching would need netkit in the kernel), on a device of
	// its own so that the fixtures run the program as if on that device.
	h4 := addVeth(t, "lk-fx-h4", "lk-fx-p4")
	zero := make(net.HardwareAddr, 6)
	e.ep4 = Endpoint{ID: 4, Mode: ModeNetkit, IfName: "lk-fx-h4", IfIndex: h4.Attrs().Index,
		IP: mustAddr("10.244.1.13"), MAC: zero, HostMAC: zero}
	e.ep5 = Endpoint{ID: 5, Mode: ModeVeth, IfName: "lk-fx-h5", IfIndex: 999, // never transmitted on: test runs only
		IP: mustAddr("10.244.1.14"), MAC: mustMAC("02:00:00:01:00:0e"), HostMAC: mustMAC("02:00:00:01:00:0f"), Queues: 4, VM: true}
	for _, ep := range []Endpoint{e.ep4, e.ep5} {
		info := ep.info()
		must("endpoint by ifindex", e.dp.pod.LkEpByIfindex.Put(uint32(ep.IfIndex), info))
		must("endpoint by ip", e.dp.pod.LkEndpoints.Put(info.Ip, info))
	}
	return e
}

// enter moves the calling goroutine (a subtest's own) into the namespace for
// the rest of the test.
func (e *fixtureEnv) enter(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	if err := netns.Set(e.newNS); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("enter netns: %v", err)
	}
	t.Cleanup(func() {
		netns.Set(e.origNS)
		runtime.UnlockOSThread()
	})
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}

func addVeth(t *testing.T, name, peer string) netlink.Link {
	t.Helper()
	return addVethSpec(t, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer})
}

// addVethSpec adds the veth pair v describes, sets both ends up and returns
// the first end.
func addVethSpec(t *testing.T, v *netlink.Veth) netlink.Link {
	t.Helper()
	name := v.Name
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	for _, n := range []string{name, v.PeerName} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatalf("link %s: %v", n, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatalf("up %s: %v", n, err)
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l
}
