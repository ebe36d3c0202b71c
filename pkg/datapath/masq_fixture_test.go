package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/service"
)

// masqueraded returns the UDP frame in (checksum 0: none) as a masquerade
// to node sends it: from node's address and the first port of the default
// SNAT range its flow hash picks (the flow's first packet, a free range),
// its IPv4 checksum patched.
func masqueraded(in []byte, node string) []byte {
	out := append([]byte(nil), in...)
	var s, d [4]byte
	copy(s[:], in[26:30])
	copy(d[:], in[30:34])
	h := lbFlowHash(netip.AddrFrom4(s), binary.BigEndian.Uint16(in[34:]), netip.AddrFrom4(d), binary.BigEndian.Uint16(in[36:]), in[23])
	span := uint32(DefaultSNATPortMax) - uint32(DefaultSNATPortMin) + 1
	n4 := netip.MustParseAddr(node).As4()
	copy(out[26:30], n4[:])
	binary.BigEndian.PutUint16(out[34:], uint16(uint32(DefaultSNATPortMin)+h%span))
	binary.BigEndian.PutUint16(out[24:], 0)
	binary.BigEndian.PutUint16(out[24:], testutil.IPv4Checksum(out[14:34]))
	return out
}

// TestMasqueradeFixtures: tunnel mode's masquerading (bpf/lib/masq.h),
// through BPF_PROG_TEST_RUN, for TCP and UDP. A pod's packet to an address
// outside the cluster leaves the uplink from the node's address (10.77.0.1,
// its route's source) and a port of the SNAT range, checksums valid; the
// flow's next packets keep that port; a second pod with the same port to the
// same destination gets another one; the reply, arriving on the uplink, goes
// to the pod with its own address and port restored, as does an ICMP error
// about it (the quoted packet the pod's own); an ICMP echo request leaves
// with an identifier of the range and its reply gets the pod's back; packets to a pod CIDR
// (another node's: encapsulated; this node's) and to another node's underlay
// address keep the pod's source; a local NodePort backend's reply to a client
// outside leaves from the NodePort, not masqueraded; a Service whose backend is outside the
// cluster is load-balanced and masqueraded, and its reply comes back from the
// ClusterIP. The counters move with each. (Native mode masquerades nothing:
// TestFixtures' "pod to remote pod" rows route pod sources unchanged.)
func TestMasqueradeFixtures(t *testing.T) {
	e, vx := tunnelFixtureEnv(t)
	node := netip.MustParseAddr("10.77.0.1")
	s := &svcEnv{fixtureEnv: e, model: service.NewModel(service.Options{NodeAddrs: []netip.Addr{node}}),
		tables: service.NewTables(), node: node}
	ifH1, ifH2, ifUp := e.ep1.IfIndex, e.ep2.IfIndex, e.up.Attrs().Index
	fromPod, fromUplink := e.dp.pod.FromPod, e.dp.uplink.FromUplink
	payload := []byte("masquerade")
	stats := func() (uint64, uint64) {
		t.Helper()
		st, err := e.dp.ServiceStats()
		if err != nil {
			t.Fatal(err)
		}
		return st.Masqueraded, st.MasqueradedPackets
	}
	inRange := func(p uint16) bool { return p >= DefaultSNATPortMin && p <= DefaultSNATPortMax }

	for _, proto := range []uint8{6, 17} {
		out := netip.MustParseAddrPort("10.200.0.1:443")
		flows0, pkts0 := stats()
		syn := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 40000, out.Addr().String(), out.Port(), proto, tcpSYN, 1, 0, payload)
		r := s.run(t, fromPod, ifH1, syn)
		if r.verdict != tcActRedirect || r.redirIf != ifUp {
			t.Fatalf("proto %d: pod -> %s: verdict %d redirect %d, want out of the uplink (%d)", proto, out, r.verdict, r.redirIf, ifUp)
		}
		got := parseTuple(t, r.out)
		if got.src.Addr() != node || !inRange(got.src.Port()) || got.dst != out {
			t.Fatalf("proto %d: pod -> %s left as %s -> %s, want from %s and a port in %d-%d", proto, out, got.src, got.dst,
				node, DefaultSNATPortMin, DefaultSNATPortMax)
		}
		masqPort := got.src.Port()
		next := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 40000, out.Addr().String(), out.Port(), proto, tcpACK, 2, 1, payload)
		if got := parseTuple(t, s.run(t, fromPod, ifH1, next).out); got.src != netip.AddrPortFrom(node, masqPort) {
			t.Errorf("proto %d: the flow's next packet left from %s, want %s:%d", proto, got.src, node, masqPort)
		}
		// Another pod, the same port, the same destination: another port.
		other := l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 40000, out.Addr().String(), out.Port(), proto, tcpSYN, 1, 0, payload)
		if got := parseTuple(t, s.run(t, fromPod, ifH2, other).out); got.src.Addr() != node || got.src.Port() == masqPort || !inRange(got.src.Port()) {
			t.Errorf("proto %d: the second pod's flow left from %s; want %s and a port other than %d", proto, got.src, node, masqPort)
		}
		// The reply, on the uplink, to the pod's own address and port.
		reply := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, out.Addr().String(), out.Port(), node.String(), masqPort, proto,
			tcpSYN|tcpACK, 7, 2, payload)
		r = s.run(t, fromUplink, ifUp, reply)
		got = parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1 || got.dst != netip.MustParseAddrPort("10.244.1.10:40000") || got.src != out {
			t.Errorf("proto %d: reply %s -> %s:%d: verdict %d redirect %d, %s -> %s; want into pod 1 (%d) as %s -> 10.244.1.10:40000",
				proto, out, node, masqPort, r.verdict, r.redirIf, got.src, got.dst, ifH1, out)
		}
		// An ICMP error about the flow (a router's "fragmentation
		// needed"): to the pod, about the pod's own packet.
		icmp := icmpErrorFrameProto(e.up.Attrs().HardwareAddr, neighMAC, "10.200.0.254", node.String(), node.String(),
			out.Addr().String(), proto, masqPort, out.Port())
		r = s.run(t, fromUplink, ifUp, icmp)
		if len(r.out) < 64 {
			t.Fatalf("proto %d: ICMP error: output %x", proto, r.out)
		}
		outerDst, _ := netip.AddrFromSlice(r.out[30:34])
		quotedSrc, _ := netip.AddrFromSlice(r.out[54:58])
		quoted := netip.AddrPortFrom(quotedSrc, binary.BigEndian.Uint16(r.out[62:]))
		if r.verdict != tcActRedirect || r.redirIf != ifH1 || outerDst.String() != "10.244.1.10" || quoted.String() != "10.244.1.10:40000" {
			t.Errorf("proto %d: ICMP error about %s:%d: verdict %d redirect %d, to %s quoting %s; want into pod 1 (%d), to 10.244.1.10 quoting 10.244.1.10:40000",
				proto, node, masqPort, r.verdict, r.redirIf, outerDst, quoted, ifH1)
		}
		if flows, pkts := stats(); flows-flows0 != 2 || pkts-pkts0 != 3 {
			t.Errorf("proto %d: masquerade counters +%d flows, +%d packets; want +2, +3", proto, flows-flows0, pkts-pkts0)
		}
	}

	// ICMP echo: the request leaves from the node with an identifier of the
	// range; the reply comes back to the pod with its own; checksums valid.
	echo := func(dst, src net.HardwareAddr, saddr, daddr string, typ byte, id uint16) []byte {
		b := testutil.EthIPv4(dst, src, saddr, daddr, 64, 1, 8+len(payload))
		b[34] = typ
		binary.BigEndian.PutUint16(b[38:], id)
		binary.BigEndian.PutUint16(b[40:], 1)
		copy(b[42:], payload)
		binary.BigEndian.PutUint16(b[36:], ^icmpChecksum(b[34:]))
		return b
	}
	flows0, pkts0 := stats()
	r := s.run(t, fromPod, ifH1, echo(e.ep1.HostMAC, pod1MAC, "10.244.1.10", "10.200.0.1", 8, 0x1234))
	src, _ := netip.AddrFromSlice(r.out[26:30])
	id := binary.BigEndian.Uint16(r.out[38:])
	if r.redirIf != ifUp || src != node || !inRange(id) || icmpChecksum(r.out[34:]) != 0xffff {
		t.Fatalf("echo request: redirect %d, from %s id %d, ICMP checksum valid %t; want out of the uplink from %s, an id in the range",
			r.redirIf, src, id, icmpChecksum(r.out[34:]) == 0xffff, node)
	}
	r = s.run(t, fromUplink, ifUp, echo(e.up.Attrs().HardwareAddr, neighMAC, "10.200.0.1", node.String(), 0, id))
	dst, _ := netip.AddrFromSlice(r.out[30:34])
	if r.redirIf != ifH1 || dst.String() != "10.244.1.10" || binary.BigEndian.Uint16(r.out[38:]) != 0x1234 || icmpChecksum(r.out[34:]) != 0xffff {
		t.Errorf("echo reply: redirect %d, to %s id %#x, ICMP checksum valid %t; want into pod 1 (%d), to 10.244.1.10 id 0x1234",
			r.redirIf, dst, binary.BigEndian.Uint16(r.out[38:]), icmpChecksum(r.out[34:]) == 0xffff, ifH1)
	}
	if flows, pkts := stats(); flows-flows0 != 1 || pkts-pkts0 != 1 {
		t.Errorf("echo: masquerade counters +%d flows, +%d packets; want +1, +1", flows-flows0, pkts-pkts0)
	}

	// Inside the cluster: the pod's own source.
	flows0, pkts0 = stats()
	for _, c := range []struct {
		dst   string
		redir int
	}{
		{"10.244.5.7", vx.Attrs().Index}, // another node's pod: encapsulated
		{"10.244.1.99", ifUp},            // this node's CIDR (no such pod): the FIB
		{"10.77.0.2", ifUp},              // another node's underlay address
	} {
		in := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 40001, c.dst, 80, 6, tcpSYN, 1, 0, payload)
		r := s.run(t, fromPod, ifH1, in)
		if got := parseTuple(t, r.out); r.redirIf != c.redir || got.src != netip.MustParseAddrPort("10.244.1.10:40001") {
			t.Errorf("pod -> %s: redirect %d, source %s; want %d and the pod's own source", c.dst, r.redirIf, got.src, c.redir)
		}
	}
	if flows, pkts := stats(); flows != flows0 || pkts != pkts0 {
		t.Errorf("traffic inside the cluster masqueraded: +%d flows, +%d packets", flows-flows0, pkts-pkts0)
	}

	// A NodePort from a client outside the cluster to a local backend keeps
	// the client's address; the backend's reply, translated back to the
	// NodePort, is a reply: not masqueraded (it would leave from another
	// port than the client dialled).
	s.apply(t, svcYAML("npl", "10.96.0.19", 80, "TCP", "nodePort=30080", "10.244.1.11"))
	in := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.200.0.5", 50000, node.String(), 30080, 6, tcpSYN, 1, 0, payload)
	if got := parseTuple(t, s.run(t, fromUplink, ifUp, in).out); got.dst != netip.MustParseAddrPort("10.244.1.11:8080") {
		t.Fatalf("NodePort from 10.200.0.5: to %s, want 10.244.1.11:8080", got.dst)
	}
	flows0, pkts0 = stats()
	npReply := l4Frame(e.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.200.0.5", 50000, 6, tcpSYN|tcpACK, 9, 2, payload)
	if got := parseTuple(t, s.run(t, fromPod, ifH2, npReply).out); got.src != netip.AddrPortFrom(node, 30080) {
		t.Errorf("the NodePort backend's reply left from %s, want %s:30080", got.src, node)
	}
	if flows, pkts := stats(); flows != flows0 || pkts != pkts0 {
		t.Errorf("a NodePort reply masqueraded: +%d flows, +%d packets", flows-flows0, pkts-pkts0)
	}

	// A Service whose endpoint is outside the cluster (the kubernetes
	// Service of an API server on a host without an agent).
	s.apply(t, `
apiVersion: v1
kind: Service
metadata: {name: kubernetes, namespace: default, uid: u-k}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.1
  ports: [{name: https, port: 443, targetPort: 6443, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kubernetes, namespace: default, labels: {kubernetes.io/service-name: kubernetes}}
addressType: IPv4
ports: [{name: https, port: 6443, protocol: TCP}]
endpoints:
  - addresses: [10.200.0.9]
    conditions: {ready: true}
`)
	syn := l4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.10", 41000, "10.96.0.1", 443, 6, tcpSYN, 1, 0, payload)
	r = s.run(t, fromPod, ifH1, syn)
	got := parseTuple(t, r.out)
	if r.redirIf != ifUp || got.src.Addr() != node || !inRange(got.src.Port()) || got.dst != netip.MustParseAddrPort("10.200.0.9:6443") {
		t.Fatalf("pod -> 10.96.0.1:443: redirect %d, %s -> %s; want out of the uplink, from %s, to 10.200.0.9:6443", r.redirIf, got.src, got.dst, node)
	}
	reply := l4Frame(e.up.Attrs().HardwareAddr, neighMAC, "10.200.0.9", 6443, node.String(), got.src.Port(), 6, tcpSYN|tcpACK, 7, 2, payload)
	r = s.run(t, fromUplink, ifUp, reply)
	got = parseTuple(t, r.out)
	if r.redirIf != ifH1 || got.src != netip.MustParseAddrPort("10.96.0.1:443") || got.dst != netip.MustParseAddrPort("10.244.1.10:41000") {
		t.Errorf("the API server's reply: redirect %d, %s -> %s; want into pod 1 as 10.96.0.1:443 -> 10.244.1.10:41000", r.redirIf, got.src, got.dst)
	}
}
