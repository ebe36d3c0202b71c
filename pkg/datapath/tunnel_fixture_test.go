package datapath

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/policy"
)

// tunnelFixtureEnv is the fixture namespace with a collect_md VXLAN device
// (MTU 1450) and the datapath in tunnel mode: 10.244.5.0/24 and
// 10.244.2.0/24 live on other nodes (10.77.0.5, 10.77.0.2), 10.244.1.0/24
// is this node's.
func tunnelFixtureEnv(t *testing.T) (*fixtureEnv, netlink.Link) {
	t.Helper()
	var vx netlink.Link
	e := newFixtureEnvCfg(t, func(c *Config) {
		v := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "lk-fx-vx", MTU: 1450, HardwareAddr: TunnelMAC},
			FlowBased: true, Port: 8472, Learning: false}
		if err := netlink.LinkAdd(v); err != nil {
			t.Fatalf("add vxlan: %v", err)
		}
		l, err := netlink.LinkByName("lk-fx-vx")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		vx = l
		c.Tunnel = "lk-fx-vx"
	})
	err := e.dp.SetTunnelNodes([]TunnelNode{
		{PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), Underlay: netip.MustParseAddr("10.77.0.1"), Self: true},
		{PodCIDR: netip.MustParsePrefix("10.244.2.0/24"), Underlay: netip.MustParseAddr("10.77.0.2")},
		{PodCIDR: netip.MustParsePrefix("10.244.5.0/24"), Underlay: netip.MustParseAddr("10.77.0.5")},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.tunnel = true
	return e, vx
}

// TestTunnelFixtures: every verdict of the tunnel path, through
// BPF_PROG_TEST_RUN: encapsulation (redirect into the VXLAN device with the
// inner frame addressed to the tunnel MAC, TTL decremented) for another
// node's pod CIDR, even where a kernel route exists; this node's own CIDR and
// addresses outside every pod CIDR by the FIB as before; an oversize GSO
// packet still into the tunnel (its PMTU check answers), counted; decap
// delivery into the local pod (redirect_peer) from the tunnel device. A VM's
// frames (from_pod on its host end) take the same encapsulation, and decap
// delivers to a local VM through its host end's transmit (plain redirect),
// as from the uplink.
func TestTunnelFixtures(t *testing.T) {
	e, vx := tunnelFixtureEnv(t)
	ifVx := func(*fixtureEnv) int { return vx.Attrs().Index }
	fromTunnel := tunnelRx(t, e, "10.77.0.5", 0) // from node 5 (its pod 10.244.5.7), no VNI identity
	toTunnel := func(e *fixtureEnv) *ebpf.Program { return e.dp.uplink.ToTunnel }
	encapped := func(e *fixtureEnv, in []byte) []byte { return routed(in, TunnelMAC, TunnelSrcMAC) }
	tcpTo := func(dst string, n int) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte { return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", dst, n) }
	}
	runFixtures(t, e, []fixture{
		{
			name: "pod to a pod on another node: into the tunnel", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.5.7", 64)
			},
			verdict: tcActRedirect, redirIf: ifVx, redirKind: 1, out: encapped,
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1},
		},
		{
			name: "pod CIDR with a kernel route too: the tunnel (encapsulated in BPF), not the route", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: bpfEncapped("10.77.0.2", 0), masked: encapMasked,
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1, TunnelEncapBPF: 1},
		},
		{
			name: "VM to a pod on another node: into the tunnel like a pod's", prog: fromPod, ifindex: ifH3,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep3.HostMAC, vm3MAC, "10.244.1.12", "10.244.5.7", 64)
			},
			verdict: tcActRedirect, redirIf: ifVx, redirKind: 1, out: encapped,
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1},
		},
		{
			name: "this node's own pod CIDR (no such pod): never encapsulated, FIB", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.99", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "outside every pod CIDR: masqueraded, FIB out of the uplink", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.200.0.1", 64)
			},
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte {
				return routed(masqueraded(in, "10.77.0.1"), e.neighMAC, e.up.Attrs().HardwareAddr)
			},
		},
		{
			name: "TSO packet (3600 bytes) with 1410-byte segments (fit 1450): into the tunnel whole", prog: fromPod, ifindex: ifH1,
			in: tcpTo("10.244.5.7", 3600), gsoSize: 1410,
			verdict: tcActRedirect, redirIf: ifVx, redirKind: 1, out: encapped,
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1},
		},
		{
			name: "TSO packet (3600 bytes) with 1460-byte segments (over 1450): counted oversize, to the stack (ICMP frag needed)", prog: fromPod, ifindex: ifH1,
			in: tcpTo("10.244.5.7", 3600), gsoSize: 1460,
			verdict: tcActOK, tunnel: map[TunnelStat]uint64{TunnelOversize: 1},
		},
		{
			name: "1500-byte packet (over 1450): counted oversize, to the stack", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.5.7", 1500)
			},
			verdict: tcActOK, tunnel: map[TunnelStat]uint64{TunnelOversize: 1},
		},
		{
			name: "TTL 1 for another node: the stack (ICMP time exceeded)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.5.7", 1)
			},
			verdict: tcActOK,
		},
		{
			name: "the node's own packet routed into the tunnel device: keyed, addressed to the tunnel MAC", prog: toTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(TunnelMAC, TunnelMAC, "10.77.0.1", "10.244.5.7", 64)
			},
			verdict: tcActOK, tunnel: map[TunnelStat]uint64{TunnelHostEncap: 1},
			out: func(e *fixtureEnv, in []byte) []byte {
				out := bytes.Clone(in)
				copy(out[6:12], TunnelSrcMAC)
				return out
			},
		},
		{
			name: "the node's own packet into the tunnel for no known node: drop", prog: toTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(TunnelMAC, TunnelMAC, "10.77.0.1", "10.200.0.7", 64)
			},
			verdict: tcActShot,
		},
		{
			name: "ARP into the tunnel device (NOARP): drop", prog: toTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.ARPFrame(1, TunnelMAC, "10.77.0.1", make([]byte, 6), "10.244.5.7")
			},
			verdict: tcActShot,
		},
		{
			name: "from the tunnel to a local pod: redirect_peer into it", prog: fromTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(TunnelMAC, mustMAC("02:00:00:05:00:07"), "10.244.5.7", "10.244.1.11", 63)
			},
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2,
			out:    func(e *fixtureEnv, in []byte) []byte { return routed(in, pod2MAC, e.ep2.HostMAC) },
			tunnel: map[TunnelStat]uint64{TunnelDecap: 1},
		},
		{
			name: "from the tunnel to a local VM: through its host end's transmit (plain redirect)", prog: fromTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(TunnelMAC, mustMAC("02:00:00:05:00:07"), "10.244.5.7", "10.244.1.12", 63)
			},
			verdict: tcActRedirect, redirIf: ifH3, redirKind: 1,
			out:    func(e *fixtureEnv, in []byte) []byte { return routed(in, vm3MAC, e.ep3.HostMAC) },
			tunnel: map[TunnelStat]uint64{TunnelDecap: 1},
		},
		{
			name: "from the tunnel, no local endpoint: the stack", prog: fromTunnel, ifindex: ifVx,
			in: func(e *fixtureEnv) []byte {
				return testutil.IPv4Frame(TunnelMAC, mustMAC("02:00:00:05:00:07"), "10.244.5.7", "10.244.1.99", 63)
			},
			verdict: tcActOK, tunnel: map[TunnelStat]uint64{TunnelDecap: 1},
		},
	})
}

// TestTunnelNativeModeNoEncap: the same datapath opened without a tunnel
// device ignores a filled node map: another node's pod CIDR goes by the FIB.
func TestTunnelNativeModeNoEncap(t *testing.T) {
	e := newFixtureEnv(t)
	if err := e.dp.SetTunnelNodes([]TunnelNode{{PodCIDR: netip.MustParsePrefix("10.244.2.0/24"),
		Underlay: netip.MustParseAddr("10.77.0.2")}}); err != nil {
		t.Fatal(err)
	}
	in := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 64)
	opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64), Context: skbCtx{Ifindex: uint32(e.h1.Attrs().Index)}}
	ret, err := e.dp.pod.FromPod.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	var tr podRedirectTrace
	if err := e.dp.pod.LastRedirect.Get(&tr); err != nil {
		t.Fatal(err)
	}
	if ret != tcActRedirect || int(tr.Ifindex) != e.up.Attrs().Index {
		t.Fatalf("native mode: verdict %d to ifindex %d, want redirect out of the uplink %d", ret, tr.Ifindex, e.up.Attrs().Index)
	}
}

// TestTunnelNodesRoundTrip: the node map holds what SetTunnelNodes wrote and
// drops what a later call leaves out.
func TestTunnelNodesRoundTrip(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	got, err := e.dp.TunnelNodes()
	if err != nil || len(got) != 3 || got[0].PodCIDR.String() != "10.244.1.0/24" || !got[0].Self ||
		got[2].Underlay.String() != "10.77.0.5" {
		t.Fatalf("tunnel nodes %+v, %v", got, err)
	}
	if err := e.dp.SetTunnelNodes(got[1:2]); err != nil {
		t.Fatal(err)
	}
	if got, err = e.dp.TunnelNodes(); err != nil || len(got) != 1 || got[0].PodCIDR.String() != "10.244.2.0/24" {
		t.Fatalf("after replace: %+v, %v", got, err)
	}
}

// TestTunnelIdentities: the VNI of a label set is the same whatever local
// number a node gave it; a VNI two sets share maps to neither.
func TestTunnelIdentities(t *testing.T) {
	a := policy.IdentityInfo{Namespace: "ns", Labels: map[string]string{"app": "a", "tier": "web"}}
	b := policy.IdentityInfo{Namespace: "ns", Labels: map[string]string{"tier": "web", "app": "a"}}
	if TunnelVNI(a) != TunnelVNI(b) || TunnelVNI(a) == 0 || TunnelVNI(a) > 0xffffff {
		t.Fatalf("VNI %d vs %d", TunnelVNI(a), TunnelVNI(b))
	}
	c := policy.IdentityInfo{Namespace: "other", Labels: map[string]string{"app": "a"}}
	toVNI, toIdent := TunnelIdentities(map[policy.Identity]policy.IdentityInfo{70000: a, 70001: c, 2: {}})
	if toVNI[70000] != TunnelVNI(a) || toIdent[TunnelVNI(a)] != 70000 || toIdent[TunnelVNI(c)] != 70001 || len(toVNI) != 2 {
		t.Fatalf("maps %v %v", toVNI, toIdent)
	}
	// Same set under two local numbers (cannot happen in one compiler, but a
	// collision looks the same): neither is trusted.
	toVNI, toIdent = TunnelIdentities(map[policy.Identity]policy.IdentityInfo{70000: a, 70002: b})
	if len(toVNI) != 0 || len(toIdent) != 0 {
		t.Fatalf("shared VNI mapped: %v %v", toVNI, toIdent)
	}
}

// TestTunnelClaimEntries: a moved VM's address as a /32 claim entry next to
// the pod CIDRs (the agent's epclaims.go). An address of this node's own
// CIDR whose VM another node claims goes into the tunnel (without the entry:
// the FIB), the entry keeps its claim mark through TunnelNodes (a restarted
// agent tells claims from CIDRs by it), and without it the own CIDR wins
// again.
func TestTunnelClaimEntries(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	nodes, err := e.dp.TunnelNodes()
	if err != nil {
		t.Fatal(err)
	}
	claim := TunnelNode{PodCIDR: netip.MustParsePrefix("10.244.1.99/32"), Underlay: netip.MustParseAddr("10.77.0.2"), Claim: true}
	if err := e.dp.SetTunnelNodes(append(nodes, claim)); err != nil {
		t.Fatal(err)
	}
	got, err := e.dp.TunnelNodes()
	if err != nil || len(got) != 4 || !slices.Contains(got, claim) || slices.ContainsFunc(got[:3], func(n TunnelNode) bool { return n.Claim && n != claim }) {
		t.Fatalf("tunnel nodes with a claim: %+v, %v", got, err)
	}
	moved := func(e *fixtureEnv) []byte {
		return testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.1.99", 64)
	}
	runFixtures(t, e, []fixture{{
		name: "a moved VM's address of this node's own CIDR, claimed by another node: into the tunnel", prog: fromPod, ifindex: ifH1,
		in: moved, verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: bpfEncapped("10.77.0.2", 0), masked: encapMasked,
		tunnel: map[TunnelStat]uint64{TunnelEncap: 1, TunnelEncapBPF: 1},
	}})
	if err := e.dp.SetTunnelNodes(nodes); err != nil {
		t.Fatal(err)
	}
	runFixtures(t, e, []fixture{{
		name: "the claim withdrawn: this node's own CIDR, FIB", prog: fromPod, ifindex: ifH1,
		in: moved, verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
		out: func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) },
	}})
}
