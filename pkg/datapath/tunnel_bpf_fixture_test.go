package datapath

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/internal/testutil"
)

// fixtureTunnelPort is the fixture VXLAN device's UDP port (tunnelFixtureEnv).
const fixtureTunnelPort = 8472

// vxlanFrame is inner as another node's VXLAN device sends it to this node's
// uplink: outer IPv4 outerSrc -> outerDst (header checksum valid), UDP
// 50123 -> 8472 with checksum 0, the VXLAN header with the I flag and vni.
func vxlanFrame(e *fixtureEnv, outerSrc, outerDst string, vni uint32, inner []byte) []byte {
	return vxlanWire(e.up.Attrs().HardwareAddr, e.neighMAC, outerSrc, outerDst, vni, inner)
}

// vxlanWire is inner in VXLAN between the MACs dst and src.
func vxlanWire(dst, src net.HardwareAddr, outerSrc, outerDst string, vni uint32, inner []byte) []byte {
	payload := make([]byte, 8+len(inner))
	binary.BigEndian.PutUint32(payload[0:], 0x08000000)
	binary.BigEndian.PutUint32(payload[4:], vni<<8)
	copy(payload[8:], inner)
	b := testutil.UDPFrame(dst, src, outerSrc, outerDst, 64, payload)
	binary.BigEndian.PutUint16(b[34:], 50123)
	binary.BigEndian.PutUint16(b[36:], fixtureTunnelPort)
	binary.BigEndian.PutUint16(b[40:], 0)
	return b
}

// bpfEncapped is what tunnel_bpf_encap makes of the packet in for the node
// at underlay: in with the tunnel's inner MACs and TTL decremented, in
// VXLAN with vni from this node (10.77.0.1) out of the uplink to the
// neighbour. encapMasked are the bytes it derives from the flow hash (the
// UDP source port) and a random IP ID, and the header checksum over that.
func bpfEncapped(underlay string, vni uint32) func(e *fixtureEnv, in []byte) []byte {
	return func(e *fixtureEnv, in []byte) []byte {
		return vxlanWire(e.neighMAC, e.up.Attrs().HardwareAddr, "10.77.0.1", underlay, vni, routed(in, TunnelMAC, TunnelSrcMAC))
	}
}

var encapMasked = []int{14 + 4, 14 + 5, 14 + 10, 14 + 11, 34, 35}

// TestTunnelUplinkDecapFixtures: in tunnel mode from_uplink decapsulates
// another node's VXLAN packet about its own pod for a local pod or VM and
// delivers the inner packet as from_tunnel would (redirect_peer into the pod,
// the VM's host end's transmit), the sender's identity from the VNI,
// counted as a decapsulation and an uplink one. Everything else leaves
// from_uplink unchanged for the kernel's VXLAN device, whose from_tunnel
// judges it (TestTunnelSourceFixtures): a forged or foreign sender (an
// unknown outer source, another node's pod, this node's address as the
// inner source), a GSO packet, a UDP checksum, other VXLAN flags, a
// fragment, a broken outer header, a packet for no local endpoint or with
// TTL 1 inside, a truncated one; and in native mode the same packet is
// nobody's to decapsulate.
func TestTunnelUplinkDecapFixtures(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	vni := withTunnelClient(t, e)
	wire := func(outer, src, dst string, edit func(b []byte)) func(*fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			b := vxlanFrame(e, outer, "10.77.0.1", vni, udpFrame4(src, dst, 5201))
			if edit != nil {
				edit(b)
			}
			return b
		}
	}
	// decapped is the inner frame as it reaches the endpoint: its MACs the
	// endpoint's, TTL decremented.
	decapped := func(dst, mac func(*fixtureEnv) []byte) func(*fixtureEnv, []byte) []byte {
		return func(e *fixtureEnv, in []byte) []byte {
			return routed(bytes.Clone(in[50:]), mac(e), dst(e))
		}
	}
	pod2 := func(*fixtureEnv) []byte { return pod2MAC }
	vm3 := func(*fixtureEnv) []byte { return vm3MAC }
	h2mac := func(e *fixtureEnv) []byte { return e.ep2.HostMAC }
	h3mac := func(e *fixtureEnv) []byte { return e.ep3.HostMAC }
	uplinkDecap := map[TunnelStat]uint64{TunnelDecap: 1, TunnelDecapUplink: 1, TunnelVNIIdentity: 1}
	refixIP := func(b []byte) { binary.BigEndian.PutUint16(b[24:], testutil.IPv4Checksum(b[14:34])) }
	runFixtures(t, e, []fixture{
		{
			name: "node 5 about its pod to a local pod, the client's VNI: decapsulated, redirect_peer, identity from the VNI",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.244.5.7", "10.244.1.11", nil),
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: decapped(h2mac, pod2), tunnel: uplinkDecap,
		},
		{
			name: "node 5 about its pod to a local VM: decapsulated, through the VM's host end (plain redirect)",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.244.5.7", "10.244.1.12", nil),
			verdict: tcActRedirect, redirIf: ifH3, redirKind: 1, out: decapped(h3mac, vm3), tunnel: uplinkDecap,
		},
		{
			name: "node 5's own address inside: decapsulated, judged by address (the VNI ignored)",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.77.0.5", "10.244.1.11", nil),
			verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: decapped(h2mac, pod2),
			tunnel: map[TunnelStat]uint64{TunnelDecap: 1, TunnelDecapUplink: 1},
		},
		{
			name: "node 5 about node 2's pod (foreign source): left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.244.2.5", "10.244.1.11", nil), verdict: tcActOK,
		},
		{
			name: "node 5 speaking as this node: left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.77.0.1", "10.244.1.11", nil), verdict: tcActOK,
		},
		{
			name: "an unknown outer source (a pod's own VXLAN, the client's VNI): left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp, in: wire("10.244.5.7", "10.244.5.7", "10.244.1.11", nil), verdict: tcActOK,
		},
		{
			name: "GSO packet (bulk TCP's GRO aggregates): left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.244.5.7", "10.244.1.11", nil), gsoSize: 1400,
			verdict: tcActOK,
		},
		{
			name: "outer UDP checksum set: left to the VXLAN device (it verifies)",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { binary.BigEndian.PutUint16(b[40:], 0x1234) }),
			verdict: tcActOK,
		},
		{
			name: "VXLAN G flag set besides I: left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { b[42] |= 0x80 }),
			verdict: tcActOK,
		},
		{
			name: "VNI word's reserved byte set: left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { b[49] = 1 }),
			verdict: tcActOK,
		},
		{
			name: "another UDP port: not the tunnel's, the stack's",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { binary.BigEndian.PutUint16(b[36:], fixtureTunnelPort+1) }),
			verdict: tcActOK,
		},
		{
			name: "outer first fragment (MF): left to the stack to reassemble",
			prog: fromUplink, ifindex: ifUp,
			in: wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) {
				b[20] |= 0x20
				refixIP(b)
			}),
			verdict: tcActOK,
		},
		{
			name: "outer header checksum broken: left to the stack (it drops it)",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { b[24] ^= 0xff }),
			verdict: tcActOK,
		},
		{
			name: "outer length shorter than the frame: left to the stack",
			prog: fromUplink, ifindex: ifUp,
			in: wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) {
				binary.BigEndian.PutUint16(b[16:], binary.BigEndian.Uint16(b[16:])-4)
				refixIP(b)
			}),
			verdict: tcActOK,
		},
		{
			name: "outer destination not this node's address: the stack's",
			prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return vxlanFrame(e, "10.77.0.5", "10.77.0.99", vni, udpFrame4("10.244.5.7", "10.244.1.11", 5201))
			},
			verdict: tcActOK,
		},
		{
			name: "inner frame not to the tunnel MAC: left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp,
			in:      wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) { b[50] ^= 0x04 }),
			verdict: tcActOK,
		},
		{
			name: "inner packet for no local endpoint: left to the VXLAN device",
			prog: fromUplink, ifindex: ifUp, in: wire("10.77.0.5", "10.244.5.7", "10.244.1.99", nil), verdict: tcActOK,
		},
		{
			name: "inner TTL 1: left to the VXLAN device (ICMP time exceeded from the stack)",
			prog: fromUplink, ifindex: ifUp,
			in: wire("10.77.0.5", "10.244.5.7", "10.244.1.11", func(b []byte) {
				b[64+8] = 1
				binary.BigEndian.PutUint16(b[64+10:], testutil.IPv4Checksum(b[64:84]))
			}),
			verdict: tcActOK,
		},
		{
			name: "truncated inside the inner IPv4 header: left to the stack",
			prog: fromUplink, ifindex: ifUp,
			in: func(e *fixtureEnv) []byte {
				return vxlanFrame(e, "10.77.0.5", "10.77.0.1", vni, udpFrame4("10.244.5.7", "10.244.1.11", 5201)[:24])
			},
			verdict: tcActOK,
		},
	})
}

// TestTunnelUplinkDecapNativeMode: without a tunnel device a VXLAN packet on
// the uplink is the stack's: from_uplink decapsulates nothing.
func TestTunnelUplinkDecapNativeMode(t *testing.T) {
	e := newFixtureEnv(t)
	runFixtures(t, e, []fixture{{
		name: "native mode: a VXLAN packet for a local pod: the stack's, unchanged", prog: fromUplink, ifindex: ifUp,
		in: func(e *fixtureEnv) []byte {
			return vxlanFrame(e, "10.77.0.2", "10.77.0.1", 0, udpFrame4("10.244.2.5", "10.244.1.11", 5201))
		},
		verdict: tcActOK,
	}})
}

// TestTunnelBPFEncapFixtures: a packet for another node's pod that is no GSO
// packet is encapsulated by tunnel_bpf_encap when the route to that node and
// its neighbour are known: the whole VXLAN packet (outer MACs from the FIB,
// this node's address as the route's source, the tunnel port, checksum 0,
// the VNI, the inner frame as the device would write it) out of the uplink,
// counted as an encapsulation and a BPF one; the inner ECN mark carried
// (CE as ECT(0)). A GSO packet, or a node whose neighbour is not resolved
// yet, goes to the VXLAN device as before.
func TestTunnelBPFEncapFixtures(t *testing.T) {
	e, vx := tunnelFixtureEnv(t)
	ifVx := func(*fixtureEnv) int { return vx.Attrs().Index }
	bpfEncap := map[TunnelStat]uint64{TunnelEncap: 1, TunnelEncapBPF: 1}
	vni := withTunnelClient(t, e)
	pod1To := func(dst string, tos byte) func(e *fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			b := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", dst, 64)
			b[15] = tos
			binary.BigEndian.PutUint16(b[24:], testutil.IPv4Checksum(b[14:34]))
			return b
		}
	}
	runFixtures(t, e, []fixture{
		{
			name: "pod to node 2's pod (neighbour known): encapsulated in BPF, out of the uplink",
			prog: fromPod, ifindex: ifH1, in: pod1To("10.244.2.5", 0),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: bpfEncapped("10.77.0.2", 0), masked: encapMasked,
			tunnel: bpfEncap,
		},
		{
			name: "pod to node 2's pod, ECT(1) inside: ECT(1) outside",
			prog: fromPod, ifindex: ifH1, in: pod1To("10.244.2.5", 0x01),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, masked: encapMasked, tunnel: bpfEncap,
			out: func(e *fixtureEnv, in []byte) []byte {
				b := bpfEncapped("10.77.0.2", 0)(e, in)
				b[15] = 0x01
				return b
			},
		},
		{
			name: "pod to node 2's pod, CE inside (DSCP 0x28): ECT(0) outside, no DSCP",
			prog: fromPod, ifindex: ifH1, in: pod1To("10.244.2.5", 0xa3),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, masked: encapMasked, tunnel: bpfEncap,
			out: func(e *fixtureEnv, in []byte) []byte {
				b := bpfEncapped("10.77.0.2", 0)(e, in)
				b[15] = 0x02
				return b
			},
		},
		{
			name: "TSO packet to node 2's pod: whole into the VXLAN device (its UDP tunnel GSO)",
			prog: fromPod, ifindex: ifH1, gsoSize: 1410,
			in:      func(e *fixtureEnv) []byte { return tcpFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.244.2.5", 3600) },
			verdict: tcActRedirect, redirIf: ifVx, redirKind: 1,
			out:    func(e *fixtureEnv, in []byte) []byte { return routed(in, TunnelMAC, TunnelSrcMAC) },
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1},
		},
		{
			name: "pod to node 5's pod (its neighbour unresolved): into the VXLAN device",
			prog: fromPod, ifindex: ifH1, in: pod1To("10.244.5.7", 0),
			verdict: tcActRedirect, redirIf: ifVx, redirKind: 1,
			out:    func(e *fixtureEnv, in []byte) []byte { return routed(in, TunnelMAC, TunnelSrcMAC) },
			tunnel: map[TunnelStat]uint64{TunnelEncap: 1},
		},
	})
	// The sending pod with an identity that has a tunnel identity.
	if err := e.dp.pod.LkPolicyIpcache.Put(netip.MustParseAddr("10.244.1.10").As4(), uint32(70000)); err != nil {
		t.Fatal(err)
	}
	runFixtures(t, e, []fixture{{
		name: "pod with an identity to node 2's pod: its VNI in the VXLAN header",
		prog: fromPod, ifindex: ifH1, in: pod1To("10.244.2.5", 0),
		verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, masked: encapMasked, tunnel: bpfEncap,
		out: bpfEncapped("10.77.0.2", vni),
	}})
}

// TestTunnelUplinkDecapDifferential: from_uplink's decision to decapsulate
// a frame itself (its decap-uplink counter) agrees with a Go statement of
// the rules (wantUplinkDecap) on thousands of frames an attacker on the
// underlay could send: frames the rules accept with one bit of their
// headers changed, and VXLAN frames of every combination of outer source
// (peers, a pod, this node, a stranger), inner source and destination with
// up to three bits changed; the outer checksum mostly repaired (so that the
// other checks are reached), some cut short. A seeded random
// walk, so a failure repeats; the seed is in the failure.
func TestTunnelUplinkDecapDifferential(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	vni := withTunnelClient(t, e)
	e.enter(t)
	const seed, n = 20261201, 8000
	rng := rand.New(rand.NewPCG(seed, 0))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	decapped := 0
	for i := 0; i < n; i++ {
		var in []byte
		if rng.IntN(2) == 0 { // an accepted frame, then one bit changed (or none)
			in = vxlanFrame(e, "10.77.0.5", "10.77.0.1", vni, udpFrame4("10.244.5.7", pick("10.244.1.11", "10.244.1.12"), 5201))
			if rng.IntN(5) > 0 {
				in[rng.IntN(84)] ^= byte(1 << rng.IntN(8))
			}
		} else { // any combination, then up to three bits changed
			inner := udpFrame4(pick("10.244.5.7", "10.244.2.5", "10.244.1.50", "10.77.0.5", "10.77.0.2", "10.77.0.1", "10.200.0.1"),
				pick("10.244.1.11", "10.244.1.12", "10.244.1.99", "10.96.0.1"), 5201)
			in = vxlanFrame(e, pick("10.77.0.5", "10.77.0.2", "10.77.0.9", "10.244.5.7", "10.77.0.1"),
				pick("10.77.0.1", "10.77.0.1", "10.77.0.99"), vni, inner)
			for m := rng.IntN(4); m > 0; m-- {
				in[rng.IntN(84)] ^= byte(1 << rng.IntN(8))
			}
		}
		if rng.IntN(10) == 0 {
			in[64+8] = byte(rng.IntN(3)) // inner TTL 0, 1 or 2
		}
		if rng.IntN(5) > 0 {
			binary.BigEndian.PutUint16(in[24:], testutil.IPv4Checksum(in[14:34]))
		}
		if rng.IntN(10) == 0 {
			in = in[:34+rng.IntN(len(in)-34)] // cut short, within the headers or the payload
		}
		before, err := e.dp.TunnelStats()
		if err != nil {
			t.Fatal(err)
		}
		opts := &ebpf.RunOptions{Data: bytes.Clone(in), DataOut: make([]byte, len(in)+256), Context: skbCtx{Ifindex: uint32(ifUp(e))}}
		if _, err := e.dp.uplink.FromUplink.Run(opts); err != nil {
			t.Fatalf("run (%d bytes): %v", len(in), err)
		}
		after, err := e.dp.TunnelStats()
		if err != nil {
			t.Fatal(err)
		}
		got := after[TunnelDecapUplink] - before[TunnelDecapUplink]
		want := wantUplinkDecap(in, e.up.Attrs().HardwareAddr, func(a netip.Addr) bool {
			v, err := e.dp.pod.LkEndpoints.LookupBytes(a.As4())
			return err == nil && v != nil
		})
		if (got == 1) != want || got > 1 {
			t.Fatalf("seed %d, frame %d: from_uplink decapsulated %d, the rules say %v\n%x", seed, i, got, want, in)
		}
		if want {
			decapped++
		}
	}
	t.Logf("%d frames, %d decapsulated in from_uplink", n, decapped)
	if decapped < n/10 {
		t.Fatalf("only %d of %d frames decapsulated: the walk hardly reaches the accepting side", decapped, n)
	}
}

// wantUplinkDecap states tunnel_uplink_decap's rules for tunnelFixtureEnv's
// node (10.77.0.1; peers 10.77.0.2 with 10.244.2.0/24 and 10.77.0.5 with
// 10.244.5.0/24; its own 10.244.1.0/24), endpoint saying which addresses
// are local endpoints.
func wantUplinkDecap(b []byte, uplinkMAC net.HardwareAddr, endpoint func(netip.Addr) bool) bool {
	if len(b) < 84 || !bytes.Equal(b[0:6], uplinkMAC) || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
		return false
	}
	ip, udp, vx, ieth, iip := b[14:34], b[34:42], b[42:50], b[50:64], b[64:84]
	ipAt := func(h []byte, off int) netip.Addr { return netip.AddrFrom4([4]byte(h[off : off+4])) }
	outerSrc, outerDst, src, dst := ipAt(ip, 12), ipAt(ip, 16), ipAt(iip, 12), ipAt(iip, 16)
	switch {
	case ip[0] != 0x45, ip[9] != 17, binary.BigEndian.Uint16(ip[6:])&0x3fff != 0,
		int(binary.BigEndian.Uint16(ip[2:])) != len(b)-14, binary.BigEndian.Uint16(ip[10:]) != testutil.IPv4Checksum(ip):
		return false
	case binary.BigEndian.Uint16(udp[2:]) != fixtureTunnelPort, binary.BigEndian.Uint16(udp[6:]) != 0,
		int(binary.BigEndian.Uint16(udp[4:])) != len(b)-34:
		return false
	case binary.BigEndian.Uint32(vx[0:]) != 0x08000000, vx[7] != 0:
		return false
	case binary.BigEndian.Uint16(ieth[12:]) != 0x0800, !bytes.Equal(ieth[0:6], TunnelMAC), iip[0] != 0x45,
		binary.BigEndian.Uint16(iip[6:])&0x3fff != 0, iip[8] <= 1:
		return false
	}
	node := netip.MustParseAddr("10.77.0.1")
	peers := map[netip.Addr]netip.Prefix{
		netip.MustParseAddr("10.77.0.2"): netip.MustParsePrefix("10.244.2.0/24"),
		netip.MustParseAddr("10.77.0.5"): netip.MustParsePrefix("10.244.5.0/24"),
	}
	local := netip.MustParsePrefix("10.244.1.0/24")
	if outerDst != node || !endpoint(dst) {
		return false
	}
	cidr, ok := peers[outerSrc]
	if !ok {
		return false
	}
	if src == outerSrc {
		return true
	}
	if local.Contains(src) {
		return false
	}
	for _, c := range peers {
		if c.Contains(src) {
			return c == cidr
		}
	}
	_, isPeer := peers[src]
	return !isPeer && src != node
}
