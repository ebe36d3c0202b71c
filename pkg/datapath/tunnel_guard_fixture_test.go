package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

// bpfTunnelKeySize is sizeof(struct bpf_tunnel_key) (linux/bpf.h).
const bpfTunnelKeySize = 44

// tunnelRx returns a program that gives the packet the receive tunnel
// metadata the VXLAN device would (outer source, VNI; an IPv6 outer source
// when outer is one) and tail-calls from_tunnel: BPF_PROG_TEST_RUN builds
// its skb without any, and from_tunnel judges the packet by it. The program
// answers 99 when the tail call fails.
func tunnelRx(t *testing.T, e *fixtureEnv, outer string, vni uint32) func(*fixtureEnv) *ebpf.Program {
	t.Helper()
	a := netip.MustParseAddr(outer)
	pa, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.Close() })
	const keyOff = -48 // 8-byte aligned room for the key
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	for off := int16(0); off < 48; off += 4 {
		insns = append(insns, asm.StoreImm(asm.RFP, keyOff+off, 0, asm.Word))
	}
	// The helper puts local_ipv4/local_ipv6 (offset 28) where the receive
	// side reads the outer source (bpf_skb_get_tunnel_key's remote_ipv4).
	const localOff = keyOff + 28
	insns = append(insns, asm.StoreImm(asm.RFP, keyOff, int64(vni), asm.Word))
	flags := int32(0)
	if a.Is4() {
		insns = append(insns, asm.StoreImm(asm.RFP, localOff, int64(int32(binary.BigEndian.Uint32(a.AsSlice()))), asm.Word))
	} else {
		b := a.As16()
		for i := 0; i < 4; i++ {
			insns = append(insns, asm.StoreImm(asm.RFP, localOff+int16(4*i), int64(int32(binary.NativeEndian.Uint32(b[4*i:]))), asm.Word))
		}
		flags = 1 // BPF_F_TUNINFO_IPV6
	}
	insns = append(insns,
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.Mov.Imm(asm.R3, bpfTunnelKeySize),
		asm.Mov.Imm(asm.R4, flags),
		asm.FnSkbSetTunnelKey.Call(),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, pa.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, 99),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: insns, License: "Dual BSD/GPL"})
	if err != nil {
		t.Fatalf("tunnel rx program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	if err := pa.Put(uint32(0), e.dp.uplink.FromTunnel); err != nil {
		t.Fatalf("tail call into from_tunnel: %v", err)
	}
	return func(*fixtureEnv) *ebpf.Program { return prog }
}

// udpFrame4 is a tunnel's inner frame: UDP 40000 -> dport between two IPv4
// addresses, addressed to the tunnel MAC.
func udpFrame4(saddr, daddr string, dport uint16) []byte {
	b := testutil.UDPFrame(TunnelMAC, TunnelSrcMAC, saddr, daddr, 63, []byte("lanekit fixture payload"))
	binary.BigEndian.PutUint16(b[34+2:], dport)
	return b
}

// TestTunnelSourceFixtures: from_tunnel accepts a packet only from another
// node's underlay address (the outer source), and a pod's source address
// only from its node: that node's pod CIDR or a moved VM address it claims
// (the /32 beats the CIDR it came from); only those take the VNI's identity.
// The node's own addresses (its underlay, another one: no pod's) pass by
// address, the VNI ignored. The rest is dropped and counted on the node
// (endpoint 0): no tunnel metadata, an IPv6 underlay, an unknown outer
// source (a pod's address: what a pod's own VXLAN looks like), an inner
// source of another node's pod, of this node's, another node's or this
// node's address, not IPv4. A dropped packet's VNI is never looked at.
func TestTunnelSourceFixtures(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	nodes, err := e.dp.TunnelNodes()
	if err != nil {
		t.Fatal(err)
	}
	nodes = append(nodes,
		TunnelNode{PodCIDR: netip.MustParsePrefix("10.244.1.99/32"), Underlay: netip.MustParseAddr("10.77.0.2"), Claim: true},
		TunnelNode{PodCIDR: netip.MustParsePrefix("10.244.5.50/32"), Underlay: netip.MustParseAddr("10.77.0.2"), Claim: true})
	if err := e.dp.SetTunnelNodes(nodes); err != nil {
		t.Fatal(err)
	}
	peers, err := e.dp.TunnelPeers()
	if err != nil || len(peers) != 2 || peers[0].String() != "10.77.0.2" || peers[1].String() != "10.77.0.5" {
		t.Fatalf("tunnel peers %v, %v: want the two other nodes' underlay addresses", peers, err)
	}
	vni := withTunnelClient(t, e)
	delivered := func(e *fixtureEnv, in []byte) []byte { return routed(in, pod2MAC, e.ep2.HostMAC) }
	accepted := map[TunnelStat]uint64{TunnelDecap: 1, TunnelVNIIdentity: 1}
	refused := map[TunnelStat]uint64{TunnelDecap: 1} // no identity taken from the VNI
	inner := func(src string) func(*fixtureEnv) []byte {
		return func(*fixtureEnv) []byte { return udpFrame4(src, "10.244.1.11", 5201) }
	}
	from5, from2 := tunnelRx(t, e, "10.77.0.5", vni), tunnelRx(t, e, "10.77.0.2", vni)
	runFixtures(t, e, []fixture{
		{
			name: "node 5 about its own pod, with the client's VNI: delivered, identity from the VNI", prog: from5, ifindex: ifVxOf,
			in: inner("10.244.5.7"), verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: delivered, tunnel: accepted,
		},
		{
			name: "node 5's own address (its stack's traffic): delivered, the VNI ignored", prog: from5, ifindex: ifVxOf,
			in: inner("10.77.0.5"), verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: delivered, tunnel: refused,
		},
		{
			name: "node 2 about a moved VM of this node's CIDR it claims: delivered", prog: from2, ifindex: ifVxOf,
			in: inner("10.244.1.99"), verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: delivered, tunnel: accepted,
		},
		{
			name: "node 2 about a moved VM of node 5's CIDR it claims: delivered", prog: from2, ifindex: ifVxOf,
			in: inner("10.244.5.50"), verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: delivered, tunnel: accepted,
		},
		{
			name: "node 5 about the VM that moved from its CIDR to node 2: foreign source", prog: from5, ifindex: ifVxOf,
			in: inner("10.244.5.50"), verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "node 5 about node 2's pod: foreign source", prog: from5, ifindex: ifVxOf,
			in: inner("10.244.2.5"), verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "node 5 about a pod of this node's own CIDR: foreign source", prog: from5, ifindex: ifVxOf,
			in: inner("10.244.1.50"), verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "node 5 from another address of its own (no pod's): delivered, by address, the VNI ignored", prog: from5, ifindex: ifVxOf,
			in: inner("10.200.0.1"), verdict: tcActRedirect, redirIf: ifH2, redirKind: 2, out: delivered, tunnel: refused,
		},
		{
			name: "node 5 speaking as node 2 (its underlay address): foreign source", prog: from5, ifindex: ifVxOf,
			in: inner("10.77.0.2"), verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "node 5 speaking as this node (its own address): foreign source", prog: from5, ifindex: ifVxOf,
			in: inner("10.77.0.1"), verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "node 5, inner IPv6 (the tunnel carries IPv4): foreign source", prog: from5, ifindex: ifVxOf,
			in: func(e *fixtureEnv) []byte {
				return eth6(TunnelMAC, TunnelSrcMAC, remoteIP6, pod2IP6, nhUDP, 63, udp6(40000, 5201))
			},
			verdict: tcActShot, dropReason: DropTunnelForeignSrc, tunnel: refused,
		},
		{
			name: "outer source a pod's address (a pod's own VXLAN), the client's VNI: unknown node", prog: tunnelRx(t, e, "10.244.5.7", vni), ifindex: ifVxOf,
			in: inner("10.244.5.7"), verdict: tcActShot, dropReason: DropTunnelUnknownNode, tunnel: refused,
		},
		{
			name: "outer source this node's own address: unknown node", prog: tunnelRx(t, e, "10.77.0.1", vni), ifindex: ifVxOf,
			in: inner("10.244.5.7"), verdict: tcActShot, dropReason: DropTunnelUnknownNode, tunnel: refused,
		},
		{
			name: "IPv6 underlay (the VXLAN socket listens on it too): unknown node", prog: tunnelRx(t, e, "fd00:77::5", vni), ifindex: ifVxOf,
			in: inner("10.244.5.7"), verdict: tcActShot, dropReason: DropTunnelUnknownNode, tunnel: refused,
		},
		{
			name: "no tunnel metadata at all: unknown node", prog: func(e *fixtureEnv) *ebpf.Program { return e.dp.uplink.FromTunnel }, ifindex: ifVxOf,
			in: inner("10.244.5.7"), verdict: tcActShot, dropReason: DropTunnelUnknownNode, tunnel: refused,
		},
	})
	// A node that leaves the mesh is no known outer source any more.
	if err := e.dp.SetTunnelNodes(nodes[:2]); err != nil {
		t.Fatal(err)
	}
	runFixtures(t, e, []fixture{{
		name: "node 5 gone from the node map: unknown node", prog: from5, ifindex: ifVxOf,
		in: inner("10.244.5.7"), verdict: tcActShot, dropReason: DropTunnelUnknownNode, tunnel: refused,
	}})
}

// withTunnelClient gives identity 70000 (shop, role=client) its tunnel
// identity and makes 10.77.0.1 this node's address; it returns the VNI
// that carries 70000.
func withTunnelClient(t *testing.T, e *fixtureEnv) uint32 {
	t.Helper()
	client := policy.IdentityInfo{Namespace: "shop", Labels: map[string]string{"role": "client"}}
	if err := e.dp.SetTunnelIdentities(map[policy.Identity]policy.IdentityInfo{70000: client}); err != nil {
		t.Fatal(err)
	}
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1")}); err != nil {
		t.Fatal(err)
	}
	return TunnelVNI(client)
}

// ifVxOf is the fixture's VXLAN device.
func ifVxOf(e *fixtureEnv) int {
	d, err := e.dp.cfg.tunnelDevice()
	if err != nil {
		panic(err)
	}
	return int(d.ifindex)
}

// TestTunnelPortFixtures: in tunnel mode an endpoint's UDP to the tunnel
// port (the VXLAN device's, 8472) of a node address is dropped and counted
// against it, IPv4 and IPv6 on one path: another node's underlay address,
// this node's own addresses (either family). The same port elsewhere, another
// port to a node, and a later fragment (no UDP header; its first fragment
// carried the port) are routed as before, and in native mode the port is
// nobody's business.
func TestTunnelPortFixtures(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	withIPv6(t, e)
	if err := e.dp.SetPolicyHostAddrs([]netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr(hostIP6)}); err != nil {
		t.Fatal(err)
	}
	pod := func(daddr string, dport uint16) func(*fixtureEnv) []byte {
		return func(e *fixtureEnv) []byte {
			b := testutil.UDPFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", daddr, 64, []byte("VXLAN header + frame"))
			binary.BigEndian.PutUint16(b[34+2:], dport)
			return b
		}
	}
	uplinkOut := func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) }
	runFixtures(t, e, []fixture{
		{
			name: "to another node's underlay address, port 8472: dropped", prog: fromPod, ifindex: ifH1,
			in: pod("10.77.0.2", 8472), verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		},
		{
			name: "to node 5's underlay address, port 8472: dropped", prog: fromPod, ifindex: ifH1,
			in: pod("10.77.0.5", 8472), verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		},
		{
			name: "to this node's own address, port 8472: dropped", prog: fromPod, ifindex: ifH1,
			in: pod("10.77.0.1", 8472), verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		},
		{
			name: "IPv6 to this node's own address, port 8472: dropped", prog: fromPod, ifindex: ifH1,
			in: fromPod1v6(hostIP6, nhUDP, udp6(40000, 8472)), verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		},
		{
			name: "IPv6 through a destination-options header to this node, port 8472: dropped", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(hostIP6, nhDstOpts, ext6(nhUDP, udp6(40000, 8472))),
			verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		},
		{
			name: "IPv6 to a remote address, port 8472 (no node's): routed", prog: fromPod, ifindex: ifH1,
			in:      fromPod1v6(remoteIP6, nhUDP, udp6(40000, 8472)),
			verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return routed6(in, neighMAC, e.up.Attrs().HardwareAddr) },
		},
		{
			name: "to another node's underlay address, port 8473: routed", prog: fromPod, ifindex: ifH1,
			in: pod("10.77.0.2", 8473), verdict: tcActRedirect, redirIf: ifUp, redirKind: 1, out: uplinkOut,
		},
		{
			name: "to an address outside the node mesh, port 8472: masqueraded and routed", prog: fromPod, ifindex: ifH1,
			in: pod("10.200.0.1", 8472), verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
			out: func(e *fixtureEnv, in []byte) []byte { return uplinkOut(e, masqueraded(in, "10.77.0.1")) },
		},
		{
			name: "a later fragment to another node's underlay address: routed (no UDP header)", prog: fromPod, ifindex: ifH1,
			in: func(e *fixtureEnv) []byte {
				b := pod("10.77.0.2", 8472)(e)
				binary.BigEndian.PutUint16(b[14+6:], 1) // offset 8 bytes, last fragment
				binary.BigEndian.PutUint16(b[14+10:], 0)
				binary.BigEndian.PutUint16(b[14+10:], testutil.IPv4Checksum(b[14:34]))
				return b
			},
			verdict: tcActShot, dropEP: 1, dropReason: DropFragNotFound,
		},
	})
}

// TestTunnelPortViaService: a Service whose endpoint is a node's tunnel
// port (an EndpointSlice may name any address) is no way around the guard:
// it judges the packet as load balancing left it.
func TestTunnelPortViaService(t *testing.T) {
	e, _ := tunnelFixtureEnv(t)
	e.enter(t)
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}})
	applyYAML(t, e.dp, m, service.NewTables(), `
apiVersion: v1
kind: Service
metadata: {name: vxlan, namespace: fx}
spec:
  clusterIP: 10.96.0.117
  ports: [{name: p, port: 53, protocol: UDP, targetPort: 8472}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: vxlan-a, namespace: fx, labels: {kubernetes.io/service-name: vxlan}}
addressType: IPv4
ports: [{name: p, port: 8472, protocol: UDP}]
endpoints:
- addresses: [10.77.0.2]
  conditions: {ready: true}
`)
	runFixtures(t, e, []fixture{{
		name: "pod to a ClusterIP whose endpoint is node 2's tunnel port: dropped after DNAT", prog: fromPod, ifindex: ifH1,
		in: func(e *fixtureEnv) []byte {
			return l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 40000, "10.96.0.117", 53, 17, 0, 0, 0, []byte("vxlan"))
		},
		verdict: tcActShot, dropEP: 1, dropReason: DropTunnelPort,
		out: func(e *fixtureEnv, _ []byte) []byte { // as DNAT left it
			return l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 40000, "10.77.0.2", 8472, 17, 0, 0, 0, []byte("vxlan"))
		},
	}})
}

// TestTunnelPortNativeMode: without a tunnel device, a pod's UDP to 8472 of
// another node is routed: no VXLAN socket of lanekit's listens there.
func TestTunnelPortNativeMode(t *testing.T) {
	e := newFixtureEnv(t)
	if err := e.dp.SetTunnelNodes([]TunnelNode{{PodCIDR: netip.MustParsePrefix("10.244.2.0/24"),
		Underlay: netip.MustParseAddr("10.77.0.2")}}); err != nil {
		t.Fatal(err)
	}
	runFixtures(t, e, []fixture{{
		name: "native mode: to another node's address, port 8472: routed", prog: fromPod, ifindex: ifH1,
		in: func(e *fixtureEnv) []byte {
			b := testutil.UDPFrame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.77.0.2", 64, []byte("x"))
			binary.BigEndian.PutUint16(b[34+2:], 8472)
			return b
		},
		verdict: tcActRedirect, redirIf: ifUp, redirKind: 1,
		out: func(e *fixtureEnv, in []byte) []byte { return routed(in, e.neighMAC, e.up.Attrs().HardwareAddr) },
	}})
}
