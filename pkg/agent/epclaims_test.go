package agent

import (
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/policy"
)

// tunnelMap is a node map that outlives an agent (the pinned
// lk_tunnel_nodes): entries by prefix, as the LPM trie keys them.
type tunnelMap struct {
	mu    sync.Mutex
	nodes map[netip.Prefix]datapath.TunnelNode
}

// tunnelFake is the memory datapath with a tunnel node map.
type tunnelFake struct {
	*fakeDatapath
	m *tunnelMap
}

func (f *tunnelFake) SetTunnelNodes(nodes []datapath.TunnelNode) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	f.m.nodes = map[netip.Prefix]datapath.TunnelNode{}
	for _, n := range nodes {
		f.m.nodes[n.PodCIDR] = n
	}
	return nil
}

func (f *tunnelFake) TunnelNodes() ([]datapath.TunnelNode, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	var out []datapath.TunnelNode
	for _, n := range f.m.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PodCIDR.String() < out[j].PodCIDR.String() })
	return out, nil
}

func (f *tunnelFake) TunnelStats() (datapath.TunnelStats, error) { return datapath.TunnelStats{}, nil }

func (f *tunnelFake) SetTunnelIdentities(map[policy.Identity]policy.IdentityInfo) error { return nil }

// lookup is the LPM lookup tunnel_route does: the longest prefix holding ip.
func (m *tunnelMap) lookup(ip netip.Addr) (datapath.TunnelNode, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var best datapath.TunnelNode
	found := false
	for p, n := range m.nodes {
		if p.Contains(ip) && (!found || p.Bits() > best.PodCIDR.Bits()) {
			best, found = n, true
		}
	}
	return best, found
}

// claimEntries are the map's claim entries as "ADDR/32=UNDERLAY".
func (m *tunnelMap) claimEntries() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p, n := range m.nodes {
		if n.Claim {
			out = append(out, p.String()+"="+n.Underlay.String())
		}
	}
	sort.Strings(out)
	return out
}

// tunNode is a tunnel-mode agent on the memory datapath in its own node
// netns; its node map survives restarts.
type tunNode struct {
	migNode
	cidr  netip.Prefix
	peers []datapath.TunnelNode
	m     *tunnelMap
}

func (n *tunNode) start(t *testing.T) {
	t.Helper()
	n.dp = newFake()
	tf := &tunnelFake{fakeDatapath: n.dp, m: n.m}
	a, err := New(Config{
		StateDir: n.fx.stateDir, Socket: filepath.Join(n.fx.stateDir, "agent.sock"), PodCIDR: n.cidr,
		MTU: 1400, HostNetns: n.fx.nodeNS.Path(), VMSocketDir: filepath.Join(n.fx.stateDir, "vm"),
		RoutingMode: RoutingTunnel, TunnelNodes: n.peers,
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return tf, nil },
	}, quietLog())
	if err != nil {
		t.Fatalf("start tunnel agent: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	n.a = a
}

func startTunNode(t *testing.T, name, cidr string, peers ...datapath.TunnelNode) *tunNode {
	t.Helper()
	n := &tunNode{migNode: migNode{fx: &fixture{stateDir: t.TempDir(), nodeNS: netnstest.New(t, name)}},
		cidr: netip.MustParsePrefix(cidr), peers: peers, m: &tunnelMap{}}
	n.start(t)
	return n
}

// tunnelRoute is the node's route to ip/32 into the tunnel device with
// the agent's protocol ("" when none).
func (n *tunNode) tunnelRoute(t *testing.T, ip netip.Addr) string {
	t.Helper()
	var out string
	n.fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(TunnelDevice)
		if err != nil {
			t.Error(err)
			return nil
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: host32(ip), LinkIndex: l.Attrs().Index,
			Protocol: tunnelRouteProto}, netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			t.Error(err)
		}
		if len(rs) > 0 {
			out = "dev " + TunnelDevice
		}
		return nil
	})
	return out
}

// TestVMMigrationTunnelClaims: in tunnel mode the winning claims of moved
// VM addresses become /32 entries of the node map next to the pod CIDRs
// (the owner's underlay address) and /32 routes into the tunnel device,
// written by the same code that writes the node CIDRs: a superseded
// source routes the address through the tunnel to the target, the target
// delivers it itself, a rewrite of the peers keeps the claims, a restarted
// agent keeps its predecessor's claims until the next sync, and a
// withdrawn claim goes (the CIDRs stay).
func TestVMMigrationTunnelClaims(t *testing.T) {
	testutil.RequireRoot(t)
	srcUnder, dstUnder := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	srcCIDR, dstCIDR := netip.MustParsePrefix("10.77.0.0/28"), netip.MustParsePrefix("10.78.0.0/28")
	src := startTunNode(t, "tunsrc", srcCIDR.String(), datapath.TunnelNode{PodCIDR: dstCIDR, Underlay: dstUnder})
	dst := startTunNode(t, "tundst", dstCIDR.String(), datapath.TunnelNode{PodCIDR: srcCIDR, Underlay: srcUnder})
	srcNS, dstNS := netnstest.New(t, "tunvm-a"), netnstest.New(t, "tunvm-b")
	labels := map[string]string{"app": "db"}

	sv, err := src.a.AddVM(AddVMRequest{Name: "vm1", Netns: srcNS.Path(), Queues: 1, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	vmIP := sv.Endpoint.IP
	// Before the move every node finds the address under the source's CIDR.
	if n, ok := dst.m.lookup(vmIP); !ok || n.Underlay != srcUnder || n.Claim {
		t.Fatalf("target node map before the move: %s -> %+v (%v)", vmIP, n, ok)
	}

	dv, err := dst.a.AddVM(AddVMRequest{Name: "vm1", Netns: dstNS.Path(), Queues: 1, MAC: sv.Endpoint.MAC, Labels: labels,
		Incoming: true, Address: vmIP, Generation: 5, GatewayMAC: sv.Endpoint.HostMAC})
	if err != nil {
		t.Fatalf("incoming vm: %v", err)
	}
	if _, err := dst.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	claims := []EndpointRoute{{Addr: vmIP, Via: dstUnder, Generation: 5, VM: "vm1", Node: "dst"}}
	// The target's own claim: no entry, it delivers the address itself.
	if n, sup, err := dst.a.SyncEndpointRoutes(claims); err != nil || n != 0 || len(sup) != 0 {
		t.Errorf("target sync: %d, superseded %v, %v", n, sup, err)
	}
	if e := dst.m.claimEntries(); len(e) != 0 {
		t.Errorf("target node map claims its own address away: %v", e)
	}
	if !dst.inDatapath(t, dv.Endpoint.ID) || dst.route(t, vmIP) != "dev "+dv.Endpoint.HostIfName {
		t.Errorf("target: datapath %v, route %q", dst.inDatapath(t, dv.Endpoint.ID), dst.route(t, vmIP))
	}

	// The source is superseded: the node map sends the address to the
	// target's underlay, the node's own traffic goes into the tunnel.
	want := []string{netip.PrefixFrom(vmIP, 32).String() + "=" + dstUnder.String()}
	checkSource := func(when string) {
		t.Helper()
		if e := src.m.claimEntries(); !slices.Equal(e, want) {
			t.Errorf("%s: source node map claims %v, want %v", when, e, want)
		}
		if n, ok := src.m.lookup(vmIP); !ok || n.Underlay != dstUnder || n.Self {
			t.Errorf("%s: source node map lookup of %s: %+v (%v), want the target's underlay %s", when, vmIP, n, ok, dstUnder)
		}
		if r := src.tunnelRoute(t, vmIP); r != "dev "+TunnelDevice {
			t.Errorf("%s: source route %s: %q, want into %s", when, vmIP, src.route(t, vmIP), TunnelDevice)
		}
		// The node CIDRs are all there too.
		if n, ok := src.m.lookup(srcCIDR.Addr().Next().Next()); !ok || !n.Self {
			t.Errorf("%s: source node map lost its own CIDR: %+v", when, n)
		}
		if n, ok := src.m.lookup(dstCIDR.Addr().Next()); !ok || n.Underlay != dstUnder || n.Claim {
			t.Errorf("%s: source node map lost the peer's CIDR: %+v", when, n)
		}
		if src.inDatapath(t, sv.Endpoint.ID) {
			t.Errorf("%s: the moved vm is in the source's datapath", when)
		}
		if h := src.holder(t, vmIP); h != movedOwner("vm1") {
			t.Errorf("%s: source ipam: %s held by %q", when, vmIP, h)
		}
	}
	n, sup, err := src.a.SyncEndpointRoutes(claims)
	if err != nil || n != 1 || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("source sync: %d, superseded %v, %v", n, sup, err)
	}
	checkSource("after the supersede")
	// The node CIDRs rewritten (Node objects): the claim stays.
	if err := src.a.SetTunnelPeers([]datapath.TunnelNode{{PodCIDR: dstCIDR, Underlay: dstUnder}}); err != nil {
		t.Fatal(err)
	}
	checkSource("after a rewrite of the peers")
	// ... and the claims rewritten: the CIDRs stay (checkSource).
	if _, _, err := src.a.SyncEndpointRoutes(claims); err != nil {
		t.Fatal(err)
	}
	checkSource("after a second sync")

	// A restarted source agent keeps the claim its predecessor wrote
	// (before and after it rewrites the node CIDRs) and leaves the moved VM
	// out of the datapath.
	if err := src.a.Close(); err != nil {
		t.Fatal(err)
	}
	src.start(t)
	checkSource("after a restart")
	if err := src.a.SetTunnelPeers([]datapath.TunnelNode{{PodCIDR: dstCIDR, Underlay: dstUnder}}); err != nil {
		t.Fatal(err)
	}
	checkSource("after a restart and a rewrite of the peers")

	// A third node's claim of an address in the target's CIDR joins; a
	// lower one of the same address does not win.
	other := netip.MustParseAddr("10.78.0.9")
	more := append(slices.Clone(claims),
		EndpointRoute{Addr: other, Via: netip.MustParseAddr("192.0.2.3"), Generation: 7, VM: "vm2", Node: "third"},
		EndpointRoute{Addr: vmIP, Via: netip.MustParseAddr("192.0.2.3"), Generation: 4, VM: "vm1", Node: "third"})
	if n, _, err := src.a.SyncEndpointRoutes(more); err != nil || n != 2 {
		t.Fatalf("sync of two claims: %d, %v", n, err)
	}
	want = []string{netip.PrefixFrom(vmIP, 32).String() + "=" + dstUnder.String(), netip.PrefixFrom(other, 32).String() + "=192.0.2.3"}
	checkSource("with a third node's claim")

	// The claims go: entries and routes go, the CIDRs stay, the hold goes.
	if n, _, err := src.a.SyncEndpointRoutes(nil); err != nil || n != 0 {
		t.Fatalf("empty sync: %d, %v", n, err)
	}
	if e := src.m.claimEntries(); len(e) != 0 {
		t.Errorf("source node map claims after the claims went: %v", e)
	}
	if r := src.tunnelRoute(t, vmIP); r != "" {
		t.Errorf("source route %s into the tunnel after the claims went", vmIP)
	}
	if n, ok := src.m.lookup(dstCIDR.Addr().Next()); !ok || n.Underlay != dstUnder {
		t.Errorf("source node map lost the peer's CIDR: %+v", n)
	}
	if n, ok := src.m.lookup(vmIP); !ok || !n.Self {
		t.Errorf("source node map lookup of %s after the claims went: %+v, want its own CIDR", vmIP, n)
	}

	// The move back: the source's incoming VM takes the address back from
	// the target (a higher claim), the target routes it through the tunnel.
	if _, err := src.a.DelVM("vm1"); err != nil {
		t.Fatal(err)
	}
	back := []EndpointRoute{{Addr: vmIP, Via: srcUnder, Generation: 9, VM: "vm1", Node: "src"}}
	sv2, err := src.a.AddVM(AddVMRequest{Name: "vm1", Netns: srcNS.Path(), Queues: 1, MAC: sv.Endpoint.MAC, Labels: labels,
		Incoming: true, Address: vmIP, Generation: 9, GatewayMAC: dv.Endpoint.HostMAC})
	if err != nil {
		t.Fatalf("incoming vm back on the source: %v", err)
	}
	if _, err := src.a.VMMigrationEvent("vm1", "target", "completed"); err != nil {
		t.Fatal(err)
	}
	if _, sup, err := dst.a.SyncEndpointRoutes(back); err != nil || !slices.Equal(sup, []string{"vm1"}) {
		t.Fatalf("target sync of the move back: superseded %v, %v", sup, err)
	}
	if e := dst.m.claimEntries(); !slices.Equal(e, []string{netip.PrefixFrom(vmIP, 32).String() + "=" + srcUnder.String()}) {
		t.Errorf("target node map after the move back: %v", e)
	}
	if dst.inDatapath(t, dv.Endpoint.ID) || dst.tunnelRoute(t, vmIP) != "dev "+TunnelDevice {
		t.Errorf("target after the move back: datapath %v, route %q", dst.inDatapath(t, dv.Endpoint.ID), dst.route(t, vmIP))
	}
	if !src.inDatapath(t, sv2.Endpoint.ID) || src.route(t, vmIP) != "dev "+sv2.Endpoint.HostIfName {
		t.Errorf("source after the move back: datapath %v, route %q", src.inDatapath(t, sv2.Endpoint.ID), src.route(t, vmIP))
	}
	// Tunnel routing moves IPv4 addresses only: an IPv6 claim is refused
	// and the IPv4 claims stay as they were.
	before := src.m.claimEntries()
	if _, _, err := src.a.SyncEndpointRoutes([]EndpointRoute{{Addr: netip.MustParseAddr("fd00::5"), Via: netip.MustParseAddr("2001:db8::2"),
		Generation: 99, VM: "vm1", Node: "b"}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "IPv4 addresses only") {
		t.Errorf("IPv6 claim in tunnel mode: %v, want ErrInvalid (IPv4 only)", err)
	}
	if after := src.m.claimEntries(); !slices.Equal(before, after) {
		t.Errorf("the refused IPv6 claim changed the node map claims: %v -> %v", before, after)
	}
}
