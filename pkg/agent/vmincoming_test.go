package agent

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// routeFromUplink is how the node routes a packet that came in on up0 for
// ip: "blackhole", "via GW", "dev N" or the error.
func (n *migNode) routeFromUplink(t *testing.T, ip netip.Addr) string {
	t.Helper()
	var out string
	n.fx.nodeNS.Do(func(ns.NetNS) error {
		src := net.ParseIP("192.0.2.9")
		if ip.Is6() {
			src = net.ParseIP("2001:db8::9")
		}
		rs, err := netlink.RouteGetWithOptions(ip.AsSlice(), &netlink.RouteGetOptions{Iif: "up0", SrcAddr: src})
		switch {
		case errors.Is(err, unix.EINVAL):
			out = "blackhole" // a blackhole rule's input lookup: EINVAL (fib4_rule_action)
		case err != nil:
			out = "error: " + err.Error()
		case len(rs) == 0:
			out = "none"
		case rs[0].Type == unix.RTN_BLACKHOLE:
			out = "blackhole"
		case rs[0].Gw != nil:
			out = "via " + rs[0].Gw.String()
		default:
			if l, err := netlink.LinkByIndex(rs[0].LinkIndex); err == nil {
				out = "dev " + l.Attrs().Name
			}
		}
		return nil
	})
	return out
}

// TestVMIncomingDropsFromUplink: what comes in on the uplink for an
// incoming VM endpoint's addresses is dropped (blackhole), not routed back
// to the source as the node's own traffic still is; the rules survive a
// restart, a stale one goes then, and activation and removal take them.
func TestVMIncomingDropsFromUplink(t *testing.T) {
	testutil.RequireRoot(t)
	n := startMigNodeUplink(t, "indrop", "10.78.0.0/28", "fd00:78::/64", "up0")
	vmIP, vmIP6 := netip.MustParseAddr("10.77.0.5"), netip.MustParseAddr("fd00:77::5")
	v, err := n.a.AddVM(AddVMRequest{Name: "vm1", Netns: netnstest.New(t, "indrop-vm").Path(), Queues: 1,
		MAC: "02:00:00:cc:00:05", Incoming: true, Address: vmIP, Address6: vmIP6, Generation: 5})
	if err != nil {
		t.Fatal(err)
	}
	// The source's claim: the node's own traffic goes there.
	src := []EndpointRoute{{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.2"), Generation: 3, VM: "vm1", Node: "a"},
		{Addr: vmIP6, Via: netip.MustParseAddr("2001:db8::2"), Generation: 3, VM: "vm1", Node: "a"}}
	if _, _, err := n.a.SyncEndpointRoutes(src); err != nil {
		t.Fatal(err)
	}
	check := func(what string, want4, want6, own4, own6 string) {
		t.Helper()
		for _, c := range []struct {
			ip              netip.Addr
			wantUp, wantOwn string
		}{{vmIP, want4, own4}, {vmIP6, want6, own6}} {
			if got := n.routeFromUplink(t, c.ip); got != c.wantUp {
				t.Errorf("%s: %s from the uplink: %s, want %s", what, c.ip, got, c.wantUp)
			}
			if got := n.route(t, c.ip); got != c.wantOwn {
				t.Errorf("%s: the node's route to %s: %q, want %q", what, c.ip, got, c.wantOwn)
			}
		}
	}
	check("incoming", "blackhole", "blackhole", "via 192.0.2.2", "via 2001:db8::2")

	// A stale rule (an endpoint that went while the agent was down) goes at
	// the restart; the incoming endpoint's stay.
	stale := netip.MustParseAddr("10.77.0.9")
	if err := n.fx.nodeNS.Do(func(ns.NetNS) error { return netlink.RuleAdd(n.a.incomingDropRule(stale)) }); err != nil {
		t.Fatal(err)
	}
	if err := n.a.Close(); err != nil {
		t.Fatal(err)
	}
	n.restart(t)
	if got := n.routeFromUplink(t, stale); got == "blackhole" {
		t.Errorf("the stale rule for %s survived the restart", stale)
	}
	if got := n.routeFromUplink(t, vmIP); got != "blackhole" {
		t.Errorf("after the restart: %s from the uplink: %s, want blackhole", vmIP, got)
	}

	if _, err := n.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	host := "dev " + v.Endpoint.HostIfName
	check("active", host, host, host, host)

	// An incoming endpoint removed (a failed migration): its rules go.
	if _, err := n.a.AddVM(AddVMRequest{Name: "vm2", Netns: netnstest.New(t, "indrop-vm2").Path(), Queues: 1,
		MAC: "02:00:00:cc:00:06", Incoming: true, Address: stale, Generation: 7}); err != nil {
		t.Fatal(err)
	}
	if got := n.routeFromUplink(t, stale); got != "blackhole" {
		t.Errorf("vm2 incoming: %s from the uplink: %s, want blackhole", stale, got)
	}
	if _, err := n.a.DelVM("vm2"); err != nil {
		t.Fatal(err)
	}
	if got := n.routeFromUplink(t, stale); got == "blackhole" {
		t.Errorf("vm2 removed: %s from the uplink still dropped", stale)
	}
}
