package datapath

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// liveEnv is a small real topology: a node namespace with the datapath, two
// pod namespaces on it, and a remote namespace across the uplink.
//
//	pod1 (10.244.1.10) --veth-- node --uplink veth-- remote (10.77.0.2, 10.244.2.1)
//	pod2 (10.244.1.11) --veth--/
type liveEnv struct {
	node, pod1, pod2, remote netns.NsHandle
	orig                     netns.NsHandle
	dp                       *Loader
	pinDir                   string
	ep1, ep2                 Endpoint
}

// in runs f with the calling goroutine's thread inside ns.
func (e *liveEnv) in(t *testing.T, ns netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := netns.Set(ns); err != nil {
		t.Fatalf("setns: %v", err)
	}
	defer netns.Set(e.orig)
	f()
}

func newLiveEnv(t *testing.T) *liveEnv {
	t.Helper()
	testutil.RequireBPFFS(t)
	e := &liveEnv{}
	var err error
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.orig, err = netns.Get(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*netns.NsHandle{&e.node, &e.pod1, &e.pod2, &e.remote} {
		if *h, err = netns.New(); err != nil {
			t.Fatal(err)
		}
	}
	netns.Set(e.orig)
	e.pinDir = filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-live-%d", os.Getpid()))
	t.Cleanup(func() {
		if e.dp != nil {
			e.dp.Close()
		}
		Unpin(e.pinDir)
		for _, h := range []netns.NsHandle{e.node, e.pod1, e.pod2, e.remote} {
			h.Close()
		}
		e.orig.Close()
	})
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	setup := func(ns netns.NsHandle, f func()) {
		must("setns", netns.Set(ns))
		f()
	}
	// Pod namespaces: eth0 with IP/32 and the link-local gateway.
	pod := func(ns netns.NsHandle, ip string) {
		setup(ns, func() {
			lo, _ := netlink.LinkByName("lo")
			must("lo up", netlink.LinkSetUp(lo))
			l, err := netlink.LinkByName("eth0")
			must("eth0", err)
			must("eth0 up", netlink.LinkSetUp(l))
			a, _ := netlink.ParseAddr(ip + "/32")
			must("addr", netlink.AddrAdd(l, a))
			gw := DefaultGatewayIP.AsSlice()
			must("gw route", netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}))
			must("default route", netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}))
		})
	}
	var h1, h2, up netlink.Link
	setup(e.node, func() {
		must("ip_forward", os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644))
		lo, _ := netlink.LinkByName("lo")
		must("lo up", netlink.LinkSetUp(lo))
		mk := func(name, peer string, peerNS netns.NsHandle) netlink.Link {
			must("veth "+name, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}))
			p, err := netlink.LinkByName(peer)
			must("peer", err)
			must("move peer", netlink.LinkSetNsFd(p, int(peerNS)))
			l, err := netlink.LinkByName(name)
			must("link", err)
			must("up", netlink.LinkSetUp(l))
			return l
		}
		h1 = mk("lk-lv-h1", "eth0", e.pod1)
		h2 = mk("lk-lv-h2", "eth0", e.pod2)
		up = mk("lk-lv-up", "lk-lv-wire", e.remote)
		a, _ := netlink.ParseAddr("10.77.0.1/24")
		must("uplink addr", netlink.AddrAdd(up, a))
		_, remotePods, _ := net.ParseCIDR("10.244.2.0/24")
		must("route", netlink.RouteAdd(&netlink.Route{Dst: remotePods, Gw: net.ParseIP("10.77.0.2"), LinkIndex: up.Attrs().Index}))
		for _, hp := range []struct {
			l  netlink.Link
			ip string
		}{{h1, "10.244.1.10"}, {h2, "10.244.1.11"}} {
			must("pod route", netlink.RouteAdd(&netlink.Route{LinkIndex: hp.l.Attrs().Index, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: net.ParseIP(hp.ip).To4(), Mask: net.CIDRMask(32, 32)}}))
		}
	})
	setup(e.remote, func() {
		lo, _ := netlink.LinkByName("lo")
		must("lo up", netlink.LinkSetUp(lo))
		l, err := netlink.LinkByName("lk-lv-wire")
		must("wire", err)
		must("wire up", netlink.LinkSetUp(l))
		a, _ := netlink.ParseAddr("10.77.0.2/24")
		must("addr", netlink.AddrAdd(l, a))
		a2, _ := netlink.ParseAddr("10.244.2.1/32")
		must("addr2", netlink.AddrAdd(l, a2))
		_, pods, _ := net.ParseCIDR("10.244.1.0/24")
		must("route", netlink.RouteAdd(&netlink.Route{Dst: pods, Gw: net.ParseIP("10.77.0.1"), LinkIndex: l.Attrs().Index}))
	})
	pod(e.pod1, "10.244.1.10")
	pod(e.pod2, "10.244.1.11")
	podMAC := func(ns netns.NsHandle) net.HardwareAddr {
		var mac net.HardwareAddr
		setup(ns, func() {
			l, err := netlink.LinkByName("eth0")
			must("eth0", err)
			mac = l.Attrs().HardwareAddr
		})
		return mac
	}
	e.ep1 = Endpoint{ID: 1, Mode: ModeVeth, IfName: "lk-lv-h1", IfIndex: h1.Attrs().Index, IP: mustAddr("10.244.1.10"), MAC: podMAC(e.pod1), HostMAC: h1.Attrs().HardwareAddr}
	e.ep2 = Endpoint{ID: 2, Mode: ModeVeth, IfName: "lk-lv-h2", IfIndex: h2.Attrs().Index, IP: mustAddr("10.244.1.11"), MAC: podMAC(e.pod2), HostMAC: h2.Attrs().HardwareAddr}
	setup(e.node, func() { e.open(t) })
	must("back", netns.Set(e.orig))
	return e
}

// open loads the datapath (as an agent start would) inside the node netns,
// which the calling thread must be in.
func (e *liveEnv) open(t *testing.T) {
	t.Helper()
	dp, err := Open(Config{PinDir: e.pinDir, Uplink: "lk-lv-up"}, nil)
	if err != nil {
		t.Fatalf("open datapath: %v", err)
	}
	e.dp = dp
	for _, ep := range []Endpoint{e.ep1, e.ep2} {
		if err := dp.UpsertEndpoint(ep); err != nil {
			t.Fatalf("upsert: %v", err)
		}
	}
}

// echo starts a TCP echo server in ns (one line per connection) and returns
// its address.
func (e *liveEnv) echo(t *testing.T, ns netns.NsHandle, ip string) string {
	t.Helper()
	return e.lineServer(t, ns, ip+":0", func(c net.Conn, line string) { c.Write([]byte(line)) }).String()
}

// lineServer listens on addr (TCP) in ns until the test ends, reads the
// first line of each connection (5 s at most) and answers it with reply.
func (e *liveEnv) lineServer(t *testing.T, ns netns.NsHandle, addr string, reply func(c net.Conn, line string)) net.Addr {
	t.Helper()
	var ln net.Listener
	e.in(t, ns, func() {
		var err error
		if ln, err = net.Listen("tcp4", addr); err != nil {
			t.Fatalf("listen: %v", err)
		}
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					reply(c, line)
				}
			}()
		}
	}()
	return ln.Addr()
}

// roundTrip dials addr from ns and checks the echo.
func (e *liveEnv) roundTrip(t *testing.T, ns netns.NsHandle, addr string) error {
	t.Helper()
	var c net.Conn
	var err error
	e.in(t, ns, func() {
		c, err = net.DialTimeout("tcp4", addr, 3*time.Second)
	})
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ping\n" {
		return fmt.Errorf("echo from %s: %q, %v", addr, line, err)
	}
	return nil
}

func TestLiveForwarding(t *testing.T) {
	e := newLiveEnv(t)
	pod2 := e.echo(t, e.pod2, "10.244.1.11")
	remote := e.echo(t, e.remote, "10.244.2.1")
	pod1 := e.echo(t, e.pod1, "10.244.1.10")
	cases := []struct {
		name string
		from netns.NsHandle
		to   string
	}{
		{"pod to local pod", e.pod1, pod2},
		{"pod to remote node", e.pod1, remote},
		{"remote node to pod (uplink redirect_peer)", e.remote, pod1},
		{"node to pod (host stack)", e.node, pod2},
	}
	for _, c := range cases {
		if err := e.roundTrip(t, c.from, c.to); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	c1, err := e.dp.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := e.dp.Counters(2)
	if c1.FromPackets == 0 || c1.ToPackets == 0 || c2.ToPackets == 0 {
		t.Errorf("counters did not move: ep1 %+v ep2 %+v", c1, c2)
	}

	// Agent restart: handles closed, datapath reloaded from the pins. The
	// links are updated in place: still exactly one program per device, and
	// the counters survive.
	e.dp.Close()
	e.dp = nil
	if err := e.roundTrip(t, e.pod1, remote); err != nil {
		t.Errorf("forwarding while the agent is down: %v", err)
	}
	e.in(t, e.node, func() { e.open(t) })
	e.in(t, e.node, func() {
		for _, ifx := range []int{e.ep1.IfIndex, e.ep2.IfIndex} {
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} { // from_pod, to_pod
				res, err := link.QueryPrograms(link.QueryOptions{Target: ifx, Attach: at})
				if err != nil {
					t.Fatalf("query tcx: %v", err)
				}
				if len(res.Programs) != 1 {
					t.Errorf("ifindex %d has %d %s programs after re-adopt, want 1", ifx, len(res.Programs), at)
				}
			}
		}
	})
	c1b, _ := e.dp.Counters(1)
	if c1b.FromPackets < c1.FromPackets {
		t.Errorf("counters lost over restart: %d -> %d", c1.FromPackets, c1b.FromPackets)
	}
	if err := e.roundTrip(t, e.pod1, pod2); err != nil {
		t.Errorf("after re-adopt: %v", err)
	}

	// Delete leaves nothing: no program on the device, no map entries.
	for _, ep := range []Endpoint{e.ep1, e.ep2} {
		if err := e.dp.DeleteEndpoint(ep); err != nil {
			t.Fatal(err)
		}
		if err := e.dp.DeleteEndpoint(ep); err != nil {
			t.Fatalf("second delete must succeed: %v", err)
		}
	}
	n1, n2, n3, err := e.dp.MapEntryCount()
	if err != nil {
		t.Fatal(err)
	}
	if n1+n2 != 0 {
		t.Errorf("map entries left after delete: endpoints %d, by ifindex %d", n1, n2)
	}
	if n3 != 0 {
		// Drops not attributable to an endpoint (id 0) may remain; endpoint ones may not.
		for _, id := range []uint32{1, 2} {
			c, _ := e.dp.Counters(id)
			if c.FromPackets+c.ToPackets != 0 {
				t.Errorf("counters of endpoint %d left after delete", id)
			}
		}
	}
	e.in(t, e.node, func() {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: e.ep1.IfIndex, Attach: at})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Programs) != 0 {
				t.Errorf("%d %s programs still attached after delete", len(res.Programs), at)
			}
		}
	})
}
