package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/service"
)

// IPv6 NodePort, external addresses, hairpin and fragments (bpf/lib/lb6.h
// over lb.h's shared SNAT rule): what arrives on the uplink for a NodePort
// on the node's IPv6 address is DNATed to a backend; to a remote one it is
// source-NATed to the node's address and routed out, and the backend's
// reply is translated back to the client and routed out again; to a local
// one the client's address is kept. externalTrafficPolicy Local, external
// and load-balancer IPs, a pod reaching itself through its Service, later
// fragments and malformed extension-header chains in front of a NodePort
// packet.

const (
	nodeIP6   = "fd00:77::1" // the fixture node's uplink address (hostIP6)
	client6   = "fd00:77::2" // an external client on the uplink's link (permanent neighbour)
	extIP6    = "2001:db8:e::1"
	lbIP6     = "2001:db8:e::2"
	hairpinV6 = "100::a9fe:2a01"
)

// newSvcEnv6 is the IPv6 fixture environment with a service model whose
// node address is fd00:77::1 and whose pod CIDR is fd10:244:1::/64.
func newSvcEnv6(t *testing.T) *svcEnv {
	e := newFixtureEnv6(t)
	node := netip.MustParseAddr(nodeIP6)
	return &svcEnv{fixtureEnv: e, tables: service.NewTables(), node: node,
		model: service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1"), node},
			LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd10:244:1::/64")}})}
}

// l6 is an IPv6 frame's addresses and ports, L4 at off.
type l6 struct {
	src, dst netip.AddrPort
	hop      byte
}

// parseL6 reads an IPv6 frame whose TCP/UDP header is at l4 (after any
// extension headers) and checks the L4 checksum (TCP and unfragmented UDP).
func parseL6(t *testing.T, b []byte, l4 int, proto byte, checkSum bool) l6 {
	t.Helper()
	if len(b) < l4+8 || binary.BigEndian.Uint16(b[12:]) != 0x86dd {
		t.Fatalf("not an IPv6 frame: %x", b)
	}
	if checkSum {
		if got, want := l4Checksum6(b, l4, proto); got != 0 && got != 0xffff {
			t.Fatalf("L4 checksum does not verify (sum %#04x, want 0xffff): the rewrite did not patch it (%x)", got, want)
		}
	}
	s, d := [16]byte(b[22:38]), [16]byte(b[38:54])
	return l6{src: netip.AddrPortFrom(netip.AddrFrom16(s), binary.BigEndian.Uint16(b[l4:])),
		dst: netip.AddrPortFrom(netip.AddrFrom16(d), binary.BigEndian.Uint16(b[l4+2:])), hop: b[21]}
}

// l4Checksum6 sums the pseudo-header and the L4 message at l4 (checksum
// included): a valid one folds to 0xffff. The message ends where the IPv6
// payload length says.
func l4Checksum6(b []byte, l4 int, proto byte) (uint16, int) {
	end := 54 + int(binary.BigEndian.Uint16(b[18:]))
	seg := b[l4:end]
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(b[22:54])
	var ph [8]byte
	binary.BigEndian.PutUint32(ph[0:], uint32(len(seg)))
	ph[7] = proto
	add(ph[:])
	add(seg)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum), len(seg)
}

// withChecksum6 fills the TCP/UDP checksum of the frame b whose L4 header
// is at l4.
func withChecksum6(b []byte, l4 int, proto byte) []byte {
	off := l4 + 6
	if proto == ipProtoTCP {
		off = l4 + 16
	}
	b[off], b[off+1] = 0, 0
	s, _ := l4Checksum6(b, l4, proto)
	binary.BigEndian.PutUint16(b[off:], ^s)
	return b
}

// wire6 is a TCP segment (flags) from the wire, L4 after the extension
// headers exts (each an ext6-style header, the last naming TCP).
func (s *svcEnv) wire6(saddr string, sport uint16, daddr string, dport uint16, flags uint8) []byte {
	b := polFrame6(s.up.Attrs().HardwareAddr, neighMAC, saddr, daddr, ipProtoTCP, sport, dport, flags)
	return withChecksum6(b, 54, ipProtoTCP)
}

func TestIPv6NodePortFixtures(t *testing.T) {
	s := newSvcEnv6(t)
	e := s.fixtureEnv
	up := fromUplink(e)
	e.enter(t)
	s.apply(t, lbSvcYAML("np-remote", "fd00:96::30", "TCP", 30080, "", "", remoteBlue6))
	s.apply(t, lbSvcYAML("np-local", "fd00:96::31", "TCP", 30081, "", "", pod2IP6))
	if f := s.frontend(t, nodeIP6, 30080, service.TCP, service.ScopeNodePort); len(f.Backends) != 1 {
		t.Fatalf("IPv6 NodePort frontend backends %v", f.Backends)
	}
	drops := func(t *testing.T, reason DropReason) uint64 {
		t.Helper()
		c, err := e.dp.Counters(0)
		if err != nil {
			t.Fatal(err)
		}
		return c.Drops[reason]
	}

	t.Run("NodePort from the wire to a remote backend: DNAT + SNAT to the node, routed out; the reply back to the client", func(t *testing.T) {
		e.enter(t)
		before := s.stats(t)
		r := s.run(t, up, ifUp(e), s.wire6(client6, 40000, nodeIP6, 30080, tcpSYN))
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) {
			t.Fatalf("SYN: verdict %d out of %d, want a redirect out of the uplink (%d)", r.verdict, r.redirIf, ifUp(e))
		}
		got := parseL6(t, r.out, 54, ipProtoTCP, true)
		if got.dst != ap("["+remoteBlue6+"]:8080") || got.src.Addr() != s.node || got.hop != 63 {
			t.Fatalf("SYN left as %v -> %v (hop limit %d), want [%s]:p -> [%s]:8080, 63", got.src, got.dst, got.hop, nodeIP6, remoteBlue6)
		}
		if p := got.src.Port(); p < DefaultSNATPortMin || p > DefaultSNATPortMax {
			t.Fatalf("SNAT port %d outside %d-%d", p, DefaultSNATPortMin, DefaultSNATPortMax)
		}
		if !bytes.Equal(r.out[0:6], neighMAC) {
			t.Errorf("SYN to MAC %x, want the next hop's %x", r.out[0:6], neighMAC)
		}
		st := s.stats(t)
		if st.NewFlows-before.NewFlows != 1 || st.NodePortSNAT-before.NodePortSNAT != 1 {
			t.Errorf("new flows +%d, NodePort SNAT +%d; want 1, 1", st.NewFlows-before.NewFlows, st.NodePortSNAT-before.NodePortSNAT)
		}
		// The flow keeps its backend and SNAT port.
		r2 := s.run(t, up, ifUp(e), s.wire6(client6, 40000, nodeIP6, 30080, tcpACK))
		if g := parseL6(t, r2.out, 54, ipProtoTCP, true); r2.verdict != tcActRedirect || g.src != got.src || g.dst != got.dst {
			t.Fatalf("ACK: verdict %d %v -> %v, want the SYN's translation %v -> %v", r2.verdict, g.src, g.dst, got.src, got.dst)
		}
		// The backend's reply arrives on the SNAT port (from its node).
		before = s.stats(t)
		r = s.run(t, up, ifUp(e), s.wire6(remoteBlue6, 8080, nodeIP6, got.src.Port(), tcpSYN|tcpACK))
		back := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) || back.src != ap("["+nodeIP6+"]:30080") || back.dst != ap("["+client6+"]:40000") {
			t.Fatalf("reply: verdict %d out of %d, %v -> %v; want [%s]:30080 -> [%s]:40000 out of the uplink",
				r.verdict, r.redirIf, back.src, back.dst, nodeIP6, client6)
		}
		if st := s.stats(t); st.RevNAT-before.RevNAT != 1 || st.NewFlows != before.NewFlows {
			t.Errorf("reply: rev-NAT +%d, new flows +%d; want 1, 0", st.RevNAT-before.RevNAT, st.NewFlows-before.NewFlows)
		}
	})

	t.Run("ICMPv6 Packet Too Big about a source-NATed NodePort flow: to the client, quoting its own flow", func(t *testing.T) {
		e.enter(t)
		r := s.run(t, up, ifUp(e), s.wire6(client6, 40020, nodeIP6, 30080, tcpSYN))
		snat := parseL6(t, r.out, 54, ipProtoTCP, true).src
		before := s.stats(t)
		// A router on the way to the backend: too big, to the SNAT source.
		ptb := icmp6ErrorFrame(e.up.Attrs().HardwareAddr, neighMAC, "fd00:77::3", nodeIP6, nodeIP6, remoteBlue6, snat.Port(), 8080)
		r = s.run(t, up, ifUp(e), ptb)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) {
			t.Fatalf("verdict %d out of %d, want a redirect out of the uplink to the client", r.verdict, r.redirIf)
		}
		plen := int(binary.BigEndian.Uint16(r.out[18:]))
		msg := r.out[54 : 54+plen]
		src, dst := netip.AddrFrom16([16]byte(r.out[22:38])), netip.AddrFrom16([16]byte(r.out[38:54]))
		if src != netip.MustParseAddr("fd00:77::3") || dst != netip.MustParseAddr(client6) {
			t.Errorf("outer %v -> %v, want fd00:77::3 -> %s", src, dst, client6)
		}
		if got, want := binary.BigEndian.Uint16(msg[2:]), icmp6Checksum(src.String(), dst.String(), msg); got != want {
			t.Errorf("ICMPv6 checksum %#04x, want %#04x", got, want)
		}
		q := msg[8:]
		qsrc := netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[8:24])), binary.BigEndian.Uint16(q[40:]))
		qdst := netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[24:40])), binary.BigEndian.Uint16(q[42:]))
		if qsrc != ap("["+client6+"]:40020") || qdst != ap("["+nodeIP6+"]:30080") {
			t.Errorf("quoted %v -> %v, want [%s]:40020 -> [%s]:30080", qsrc, qdst, client6, nodeIP6)
		}
		if d := s.stats(t).RevNAT - before.RevNAT; d != 1 {
			t.Errorf("rev-NAT counter +%d, want 1", d)
		}
	})

	t.Run("a backend on the node's own address (hostNetwork): NodePort and ClusterIP to the stack, its replies translated on the way out", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("hostnp", "fd00:96::37", "TCP", 30085, "", "", nodeIP6))
		before := s.stats(t)
		r := s.run(t, up, ifUp(e), s.wire6(client6, 40030, nodeIP6, 30085, tcpSYN))
		got := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActOK || got.src != ap("["+client6+"]:40030") || got.dst != ap("["+nodeIP6+"]:8080") {
			t.Fatalf("NodePort: verdict %d, %v -> %v; want [%s]:40030 -> [%s]:8080 to the stack", r.verdict, got.src, got.dst, client6, nodeIP6)
		}
		if d := s.stats(t).NodePortLocal - before.NodePortLocal; d != 1 {
			t.Errorf("NodePort local +%d, want 1", d)
		}
		reply := withChecksum6(polFrame6(e.up.Attrs().HardwareAddr, neighMAC, nodeIP6, client6, ipProtoTCP, 8080, 40030, tcpSYN|tcpACK), 54, ipProtoTCP)
		r = s.run(t, e.dp.uplink.ToUplink, ifUp(e), reply)
		back := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActOK || back.src != ap("["+nodeIP6+"]:30085") || back.dst != ap("["+client6+"]:40030") {
			t.Fatalf("to_uplink: verdict %d, %v -> %v; want [%s]:30085 -> the client", r.verdict, back.src, back.dst, nodeIP6)
		}
		// A pod to the ClusterIP: to the stack, the stack's reply into the
		// pod (to_pod) from the ClusterIP.
		syn := withChecksum6(polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fd00:96::37", ipProtoTCP, 43010, 80, tcpSYN), 54, ipProtoTCP)
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), syn)
		if got := parseL6(t, r.out, 54, ipProtoTCP, true); r.verdict != tcActOK || got.dst != ap("["+nodeIP6+"]:8080") {
			t.Fatalf("ClusterIP from pod 1: verdict %d to %v, want the stack's, to [%s]:8080", r.verdict, got.dst, nodeIP6)
		}
		reply = withChecksum6(polFrame6(pod1MAC, e.ep1.HostMAC, nodeIP6, pod1IP6, ipProtoTCP, 8080, 43010, tcpSYN|tcpACK), 54, ipProtoTCP)
		r = s.run(t, e.dp.pod.ToPod, ifH1(e), reply)
		if back := parseL6(t, r.out, 54, ipProtoTCP, true); r.verdict != tcActOK || back.src != ap("[fd00:96::37]:80") {
			t.Fatalf("to_pod: verdict %d from %v, want it from [fd00:96::37]:80", r.verdict, back.src)
		}
	})

	t.Run("NodePort from the wire to a local backend: client address kept, into the pod; its reply routed out from the NodePort", func(t *testing.T) {
		e.enter(t)
		before := s.stats(t)
		r := s.run(t, up, ifUp(e), s.wire6(client6, 40001, nodeIP6, 30081, tcpSYN))
		got := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActRedirect || r.redirIf != ifH2(e) || got.src != ap("["+client6+"]:40001") || got.dst != ap("["+pod2IP6+"]:8080") {
			t.Fatalf("SYN: verdict %d into %d, %v -> %v; want [%s]:40001 -> [%s]:8080 into pod 2", r.verdict, r.redirIf, got.src, got.dst, client6, pod2IP6)
		}
		if st := s.stats(t); st.NodePortLocal-before.NodePortLocal != 1 || st.NodePortSNAT != before.NodePortSNAT {
			t.Errorf("NodePort local +%d, SNAT +%d; want 1, 0", st.NodePortLocal-before.NodePortLocal, st.NodePortSNAT-before.NodePortSNAT)
		}
		reply := withChecksum6(polFrame6(e.ep2.HostMAC, pod2MAC, pod2IP6, client6, ipProtoTCP, 8080, 40001, tcpSYN|tcpACK), 54, ipProtoTCP)
		r = s.run(t, e.dp.pod.FromPod, ifH2(e), reply)
		back := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) || back.src != ap("["+nodeIP6+"]:30081") || back.dst != ap("["+client6+"]:40001") {
			t.Fatalf("reply: verdict %d out of %d, %v -> %v; want [%s]:30081 -> [%s]:40001 out of the uplink", r.verdict, r.redirIf, back.src, back.dst, nodeIP6, client6)
		}
	})

	t.Run("externalTrafficPolicy Local: local endpoints only, no local endpoint drops silently", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("etp-none", "fd00:96::32", "TCP", 30082, "  externalTrafficPolicy: Local", "", remoteBlue6))
		s.apply(t, lbSvcYAML("etp-mixed", "fd00:96::33", "TCP", 30083, "  externalTrafficPolicy: Local", "", remoteBlue6, pod2IP6))
		before := drops(t, DropNoLocalBackend)
		if r := s.run(t, up, ifUp(e), s.wire6(client6, 40002, nodeIP6, 30082, tcpSYN)); r.verdict != tcActShot {
			t.Fatalf("no local endpoint: verdict %d, want drop", r.verdict)
		}
		if d := drops(t, DropNoLocalBackend) - before; d != 1 {
			t.Errorf("no-local-backend drops +%d, want 1", d)
		}
		for sp := uint16(41000); sp < 41008; sp++ {
			r := s.run(t, up, ifUp(e), s.wire6(client6, sp, nodeIP6, 30083, tcpSYN))
			got := parseL6(t, r.out, 54, ipProtoTCP, true)
			if r.verdict != tcActRedirect || r.redirIf != ifH2(e) || got.src.Addr() != netip.MustParseAddr(client6) {
				t.Fatalf("client port %d: verdict %d into %d from %v; want pod 2 with the client's address", sp, r.verdict, r.redirIf, got.src)
			}
		}
	})

	t.Run("external and load-balancer IPs: to a remote backend from the node's own address", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("ext", "fd00:96::34", "TCP", 30084, "  externalIPs: [\""+extIP6+"\"]",
			"  loadBalancer: {ingress: [{ip: \""+lbIP6+"\"}]}", remoteBlue6))
		for i, addr := range []string{extIP6, lbIP6} {
			before := s.stats(t)
			r := s.run(t, up, ifUp(e), s.wire6(client6, uint16(42000+i), addr, 80, tcpSYN))
			got := parseL6(t, r.out, 54, ipProtoTCP, true)
			if r.verdict != tcActRedirect || r.redirIf != ifUp(e) || got.src.Addr() != s.node || got.dst != ap("["+remoteBlue6+"]:8080") {
				t.Fatalf("%s: verdict %d out of %d, %v -> %v; want [%s]:p -> [%s]:8080 out of the uplink", addr, r.verdict, r.redirIf, got.src, got.dst, nodeIP6, remoteBlue6)
			}
			reply := s.wire6(remoteBlue6, 8080, nodeIP6, got.src.Port(), tcpSYN|tcpACK)
			r = s.run(t, up, ifUp(e), reply)
			back := parseL6(t, r.out, 54, ipProtoTCP, true)
			if r.verdict != tcActRedirect || back.src != ap("["+addr+"]:80") || back.dst != ap(fmt.Sprintf("[%s]:%d", client6, 42000+i)) {
				t.Fatalf("%s reply: verdict %d, %v -> %v; want it from [%s]:80 to the client", addr, r.verdict, back.src, back.dst, addr)
			}
			if st := s.stats(t); st.NodePortSNAT-before.NodePortSNAT != 1 || st.RevNAT-before.RevNAT != 1 {
				t.Errorf("%s: SNAT +%d, rev-NAT +%d; want 1, 1", addr, st.NodePortSNAT-before.NodePortSNAT, st.RevNAT-before.RevNAT)
			}
		}
	})

	t.Run("hairpin: a pod reaching itself through its IPv6 ClusterIP, from the hairpin address", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("self", "fd00:96::35", "TCP", 0, "", "", pod1IP6))
		before := s.stats(t)
		syn := withChecksum6(polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fd00:96::35", ipProtoTCP, 43000, 80, tcpSYN), 54, ipProtoTCP)
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), syn)
		got := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(e) || got.src != ap("["+hairpinV6+"]:43000") || got.dst != ap("["+pod1IP6+"]:8080") {
			t.Fatalf("SYN: verdict %d into %d, %v -> %v; want [%s]:43000 -> [%s]:8080 back into pod 1", r.verdict, r.redirIf, got.src, got.dst, hairpinV6, pod1IP6)
		}
		if d := s.stats(t).Hairpin - before.Hairpin; d != 1 {
			t.Errorf("hairpin counter +%d, want 1", d)
		}
		reply := withChecksum6(polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, hairpinV6, ipProtoTCP, 8080, 43000, tcpSYN|tcpACK), 54, ipProtoTCP)
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), reply)
		back := parseL6(t, r.out, 54, ipProtoTCP, true)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(e) || back.src != ap("[fd00:96::35]:80") || back.dst != ap("["+pod1IP6+"]:43000") {
			t.Fatalf("reply: verdict %d into %d, %v -> %v; want [fd00:96::35]:80 -> [%s]:43000 into pod 1", r.verdict, r.redirIf, back.src, back.dst, pod1IP6)
		}
	})

	t.Run("fragments: a later fragment follows its first fragment's translation; one without it is dropped", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("dns", "fd00:96::36", "UDP", 30053, "", "", remoteBlue6))
		frag := func(id byte, offset uint16, more bool, payload []byte) []byte {
			f := frag6(nhUDP, offset, more, payload)
			f[7] = id
			return eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, nhFrag, 64, f)
		}
		first := frag(7, 0, true, udp6(40053, 30053))
		r := s.run(t, up, ifUp(e), first)
		got := parseL6(t, r.out, 62, ipProtoUDP, false)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) || got.src.Addr() != s.node || got.dst != ap("["+remoteBlue6+"]:8080") {
			t.Fatalf("first fragment: verdict %d out of %d, %v -> %v; want [%s]:p -> [%s]:8080", r.verdict, r.redirIf, got.src, got.dst, nodeIP6, remoteBlue6)
		}
		payload := []byte("the rest of the datagram")
		r = s.run(t, up, ifUp(e), frag(7, 3, false, payload))
		if r.verdict != tcActRedirect || r.redirIf != ifUp(e) {
			t.Fatalf("later fragment: verdict %d out of %d, want the first's way out of the uplink", r.verdict, r.redirIf)
		}
		src, dst := netip.AddrFrom16([16]byte(r.out[22:38])), netip.AddrFrom16([16]byte(r.out[38:54]))
		if src != s.node || dst != netip.MustParseAddr(remoteBlue6) || !bytes.Equal(r.out[62:62+len(payload)], payload) {
			t.Fatalf("later fragment left as %v -> %v, payload %q; want %s -> %s, payload untouched", src, dst, r.out[62:62+len(payload)], nodeIP6, remoteBlue6)
		}
		before := drops(t, DropFragNotFound)
		if r := s.run(t, up, ifUp(e), frag(8, 3, false, payload)); r.verdict != tcActShot {
			t.Fatalf("later fragment of an unseen datagram: verdict %d, want drop", r.verdict)
		}
		if d := drops(t, DropFragNotFound) - before; d != 1 {
			t.Errorf("frag-not-found drops +%d, want 1", d)
		}
	})

	t.Run("fragments from a pod to an IPv6 ClusterIP: the later one to its first fragment's backend", func(t *testing.T) {
		e.enter(t)
		s.apply(t, lbSvcYAML("dns-c", "fd00:96::38", "UDP", 0, "", "", remoteBlue6))
		frag := func(offset uint16, more bool, payload []byte) []byte {
			f := frag6(nhUDP, offset, more, payload)
			f[7] = 9
			return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fd00:96::38", nhFrag, 64, f)
		}
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), frag(0, true, udp6(40080, 80)))
		if got := parseL6(t, r.out, 62, ipProtoUDP, false); r.verdict != tcActRedirect || r.redirIf != ifUp(e) || got.dst != ap("["+remoteBlue6+"]:8080") || got.src != ap("["+pod1IP6+"]:40080") {
			t.Fatalf("first fragment: verdict %d out of %d, %v -> %v; want pod 1 -> [%s]:8080 out of the uplink", r.verdict, r.redirIf, got.src, got.dst, remoteBlue6)
		}
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), frag(3, false, []byte("the rest of the datagram")))
		if dst := netip.AddrFrom16([16]byte(r.out[38:54])); r.verdict != tcActRedirect || r.redirIf != ifUp(e) || dst != netip.MustParseAddr(remoteBlue6) {
			t.Fatalf("later fragment: verdict %d out of %d to %v; want the first's backend %s out of the uplink", r.verdict, r.redirIf, dst, remoteBlue6)
		}
	})

	t.Run("extension headers in front of a NodePort segment: walked and translated; a broken chain is the stack's, untranslated", func(t *testing.T) {
		e.enter(t)
		dst := ext6(ipProtoTCP, polFrame6(nil, nil, client6, nodeIP6, ipProtoTCP, 44000, 30080, tcpSYN)[54:])
		in := withChecksum6(eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, nhDstOpts, 64, dst), 62, ipProtoTCP)
		r := s.run(t, up, ifUp(e), in)
		got := parseL6(t, r.out, 62, ipProtoTCP, true)
		if r.verdict != tcActRedirect || got.src.Addr() != s.node || got.dst != ap("["+remoteBlue6+"]:8080") {
			t.Fatalf("destination options + SYN: verdict %d, %v -> %v; want translated to [%s]:8080", r.verdict, got.src, got.dst, remoteBlue6)
		}
		truncated := ext6(ipProtoTCP, nil)
		truncated[1] = 4 // claims 40 bytes, the packet has 8
		chain9 := polFrame6(nil, nil, client6, nodeIP6, ipProtoTCP, 44001, 30080, tcpSYN)[54:]
		next := byte(ipProtoTCP)
		for range 9 {
			chain9 = ext6(next, chain9)
			next = nhDstOpts
		}
		for name, in := range map[string][]byte{
			"truncated destination options": eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, nhDstOpts, 64, truncated),
			"9 extension headers":           eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, nhDstOpts, 64, chain9),
			"hop-by-hop options":            eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, nhHop, 64, dst),
			"truncated TCP header":          eth6(e.up.Attrs().HardwareAddr, neighMAC, client6, nodeIP6, ipProtoTCP, 64, []byte{0xab, 0xcd}),
		} {
			before := s.stats(t)
			r := s.run(t, up, ifUp(e), in)
			if r.verdict != tcActOK || !bytes.Equal(r.out[:len(in)], in) {
				t.Errorf("%s: verdict %d, changed %v; want the stack's (TC_ACT_OK), untouched", name, r.verdict, !bytes.Equal(r.out[:len(in)], in))
			}
			if st := s.stats(t); st.NewFlows != before.NewFlows {
				t.Errorf("%s: a new flow was load-balanced", name)
			}
		}
	})

	// Last: it programs a policy for the rest of the environment.
	t.Run("a later fragment belongs to its first fragment's connection for policy too", func(t *testing.T) {
		e.enter(t)
		applyClientEgress6(t, e)
		seg := polFrame6(nil, nil, pod1IP6, pod2IP6, ipProtoTCP, 45001, 8080, tcpACK)[54:]
		frag := func(offset uint16, more bool, payload []byte) []byte {
			return eth6(e.ep1.HostMAC, pod1MAC, pod1IP6, pod2IP6, nhFrag, 64, frag6(nhTCP, offset, more, payload))
		}
		for _, f := range []struct {
			what string
			in   []byte
		}{{"first fragment (port 8080)", frag(0, true, seg)}, {"later fragment (no ports)", frag(4, false, []byte("0123456789abcdef"))}} {
			r := s.run(t, e.dp.pod.FromPod, ifH1(e), f.in)
			if r.verdict != tcActRedirect || r.redirIf != ifH2(e) {
				t.Errorf("%s: verdict %d into %d, want redirect into pod 2 (allowed on TCP 8080)", f.what, r.verdict, r.redirIf)
			}
		}
	})
}
