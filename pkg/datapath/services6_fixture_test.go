package datapath

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

// IPv6 Services (bpf/lib/lb6.h) through the programs: a dual-stack Service
// programmed per family from its clusterIPs and its IPv4 and IPv6
// EndpointSlices; a pod's connection to the IPv6 ClusterIP takes the
// backend Maglev picks (the Go model's choice), keeps it (conntrack), its
// replies come back from the frontend (rev-NAT) from a local backend and
// over the wire from a remote one; ClientIP affinity; a frontend without
// IPv6 backends; policy judges the translated packet and a denied flow
// leaves no LB state.

const vip6 = "fd00:96::20"

// dualSvcYAML is a dual-stack Service (IPv4 cluster IP first) with an IPv4
// slice (10.244.1.11) and an IPv6 slice of backends6.
func dualSvcYAML(name, vip4, vip6, extra string, backends6 ...string) string {
	y := fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: fx}
spec:
  clusterIP: %s
  clusterIPs: [%s, "%s"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8080}]
%s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-v4, namespace: fx, labels: {kubernetes.io/service-name: %s}}
addressType: IPv4
ports: [{name: p, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.11]
  conditions: {ready: true}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-v6, namespace: fx, labels: {kubernetes.io/service-name: %s}}
addressType: IPv6
ports: [{name: p, port: 8080, protocol: TCP}]
endpoints:
`, name, vip4, vip4, vip6, specExtra(extra), name, name, name, name)
	for _, b := range backends6 {
		y += fmt.Sprintf("- addresses: [\"%s\"]\n  conditions: {ready: true}\n", b)
	}
	if len(backends6) == 0 {
		y = y[:len(y)-1] + " []\n"
	}
	return y
}

// lbFlowHash6 mirrors lb6_select's hash: the addresses folded to 32 bits
// (XOR of their four words as the program loads them), then lb_flow_hash.
func lbFlowHash6(saddr netip.Addr, sport uint16, daddr netip.Addr, dport uint16, proto uint8) uint32 {
	fold := func(a netip.Addr) netip.Addr {
		b := a.As16()
		var w uint32
		for i := 0; i < 16; i += 4 {
			w ^= binary.LittleEndian.Uint32(b[i:])
		}
		var out [4]byte
		binary.LittleEndian.PutUint32(out[:], w)
		return netip.AddrFrom4(out)
	}
	return lbFlowHash(fold(saddr), sport, fold(daddr), dport, proto)
}

// tcp6Seg is an IPv6 TCP segment (flags) with a valid checksum.
func tcp6Seg(dstMAC, srcMAC []byte, saddr string, sport uint16, daddr string, dport uint16, flags uint8) []byte {
	b := polFrame6(dstMAC, srcMAC, saddr, daddr, ipProtoTCP, sport, dport, flags)
	binary.BigEndian.PutUint16(b[54+16:], tcp6Checksum(b))
	return b
}

// tcp6Checksum computes the TCP checksum of the IPv6 frame b (its own
// checksum field counted as zero; no extension headers).
func tcp6Checksum(b []byte) uint16 {
	c := bytes.Clone(b)
	c[54+16], c[54+17] = 0, 0
	s, _ := l4Checksum6(c, 54, ipProtoTCP)
	return ^s
}

type tuple6 struct {
	src, dst netip.AddrPort
}

func parseTuple6(t *testing.T, b []byte) tuple6 {
	t.Helper()
	if len(b) < 54+20 || binary.BigEndian.Uint16(b[12:]) != 0x86dd || b[20] != ipProtoTCP {
		t.Fatalf("not an IPv6 TCP frame: %x", b)
	}
	if got, want := binary.BigEndian.Uint16(b[54+16:]), tcp6Checksum(b); got != want {
		t.Fatalf("TCP checksum %#04x, want %#04x (the rewrite did not patch it)", got, want)
	}
	s, d := [16]byte(b[22:38]), [16]byte(b[38:54])
	return tuple6{src: netip.AddrPortFrom(netip.AddrFrom16(s), binary.BigEndian.Uint16(b[54:])),
		dst: netip.AddrPortFrom(netip.AddrFrom16(d), binary.BigEndian.Uint16(b[56:]))}
}

func TestIPv6ServiceFixtures(t *testing.T) {
	e := newFixtureEnv6(t)
	e.enter(t)
	s := &svcEnv{fixtureEnv: e, model: service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}}),
		tables: service.NewTables(), node: netip.MustParseAddr("10.77.0.1")}
	s.apply(t, dualSvcYAML("web", "10.96.0.20", vip6, "", pod2IP6, remoteBlue6))
	f := s.frontend(t, vip6, 80, service.TCP, service.ScopeClusterIP)
	if len(f.Backends) != 2 || !f.Backends[0].Addr.Is6() || !f.Backends[1].Addr.Is6() {
		t.Fatalf("IPv6 frontend backends %v, want the two IPv6 endpoints", f.Backends)
	}
	if f4 := s.frontend(t, "10.96.0.20", 80, service.TCP, service.ScopeClusterIP); len(f4.Backends) != 1 || !f4.Backends[0].Addr.Is4() {
		t.Fatalf("IPv4 frontend backends %v, want the IPv4 endpoint only", f4.Backends)
	}
	pick := func(sport uint16) netip.AddrPort {
		b, ok := f.Select(lbFlowHash6(netip.MustParseAddr(pod1IP6), sport, netip.MustParseAddr(vip6), 80, ipProtoTCP))
		if !ok {
			t.Fatal("no backend")
		}
		return netip.AddrPortFrom(b.Addr, b.Port)
	}
	// A client port for each backend.
	sports := map[string]uint16{}
	for sp := uint16(42000); len(sports) < 2 && sp < 43000; sp++ {
		if _, ok := sports[pick(sp).Addr().String()]; !ok {
			sports[pick(sp).Addr().String()] = sp
		}
	}
	if len(sports) != 2 {
		t.Fatalf("Maglev sent ports 42000-42999 to one backend only: %v", sports)
	}
	fromPod1 := func(sport uint16, dst string, dport uint16, flags uint8) []byte {
		return tcp6Seg(e.ep1.HostMAC, pod1MAC, pod1IP6, sport, dst, dport, flags)
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr(vip6), 80)

	t.Run("to the local backend: DNAT, conntrack, rev-NAT of its reply", func(t *testing.T) {
		e.enter(t)
		sp := sports[pod2IP6]
		before := s.stats(t)
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(sp, vip6, 80, tcpSYN))
		if r.verdict != tcActRedirect || r.redirIf != ifH2(e) {
			t.Fatalf("SYN: verdict %d into %d, want redirect into pod 2 (%d)", r.verdict, r.redirIf, ifH2(e))
		}
		if got := parseTuple6(t, r.out); got.dst != ap("["+pod2IP6+"]:8080") {
			t.Fatalf("SYN went to %v, want [%s]:8080", got.dst, pod2IP6)
		}
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(sp, vip6, 80, tcpACK))
		if got := parseTuple6(t, r.out); r.verdict != tcActRedirect || got.dst != ap("["+pod2IP6+"]:8080") {
			t.Fatalf("ACK: verdict %d to %v, want the same backend", r.verdict, got.dst)
		}
		r = s.run(t, e.dp.pod.FromPod, ifH2(e), tcp6Seg(e.ep2.HostMAC, pod2MAC, pod2IP6, 8080, pod1IP6, sp, tcpSYN|tcpACK))
		if got := parseTuple6(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifH1(e) || got.src != vip {
			t.Fatalf("reply: verdict %d into %d from %v, want redirect into pod 1 from %v", r.verdict, r.redirIf, got.src, vip)
		}
		after := s.stats(t)
		if after.NewFlows-before.NewFlows != 1 || after.ConntrackHits-before.ConntrackHits != 1 || after.RevNAT-before.RevNAT != 1 {
			t.Errorf("LB counters grew new %d, conntrack hits %d, rev-NAT %d; want 1, 1, 1",
				after.NewFlows-before.NewFlows, after.ConntrackHits-before.ConntrackHits, after.RevNAT-before.RevNAT)
		}
	})

	t.Run("to the remote backend: out of the uplink, its reply rev-NATed on the way in", func(t *testing.T) {
		e.enter(t)
		sp := sports[remoteBlue6]
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(sp, vip6, 80, tcpSYN))
		if got := parseTuple6(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifUp(e) || got.dst != ap("["+remoteBlue6+"]:8080") {
			t.Fatalf("SYN: verdict %d out of %d to %v, want the uplink (%d) to [%s]:8080", r.verdict, r.redirIf, got.dst, ifUp(e), remoteBlue6)
		}
		before := s.stats(t)
		r = s.run(t, e.dp.uplink.FromUplink, ifUp(e),
			tcp6Seg(e.up.Attrs().HardwareAddr, neighMAC, remoteBlue6, 8080, pod1IP6, sp, tcpSYN|tcpACK))
		if got := parseTuple6(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifH1(e) || got.src != vip {
			t.Fatalf("reply: verdict %d into %d from %v, want redirect into pod 1 from %v", r.verdict, r.redirIf, got.src, vip)
		}
		if d := s.stats(t).RevNAT - before.RevNAT; d != 1 {
			t.Errorf("rev-NAT counter grew by %d, want 1", d)
		}
	})

	t.Run("ICMPv6 errors about load-balanced flows come from the frontend", func(t *testing.T) {
		e.enter(t)
		check := func(t *testing.T, r runResult, wantSrc string, sport uint16) {
			t.Helper()
			if r.verdict != tcActRedirect || r.redirIf != ifH1(e) {
				t.Fatalf("verdict %d into %d, want redirect into pod 1", r.verdict, r.redirIf)
			}
			plen := int(binary.BigEndian.Uint16(r.out[18:]))
			msg := r.out[54 : 54+plen]
			src := netip.AddrFrom16([16]byte(r.out[22:38]))
			if src != netip.MustParseAddr(wantSrc) {
				t.Errorf("outer source %v, want %s", src, wantSrc)
			}
			if got, want := binary.BigEndian.Uint16(msg[2:]), icmp6Checksum(src.String(), pod1IP6, msg); got != want {
				t.Errorf("ICMPv6 checksum %#04x, want %#04x", got, want)
			}
			q := msg[8:]
			qdst := netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[24:40])), binary.BigEndian.Uint16(q[42:]))
			qsrc := netip.AddrPortFrom(netip.AddrFrom16([16]byte(q[8:24])), binary.BigEndian.Uint16(q[40:]))
			if qdst != vip || qsrc != ap(fmt.Sprintf("[%s]:%d", pod1IP6, sport)) {
				t.Errorf("quoted %v -> %v, want pod 1:%d -> %v", qsrc, qdst, sport, vip)
			}
		}
		before := s.stats(t)
		// The local backend's own error: from the frontend, quoting it.
		sp := sports[pod2IP6]
		check(t, s.run(t, e.dp.pod.FromPod, ifH2(e),
			icmp6ErrorFrame(e.ep2.HostMAC, pod2MAC, pod2IP6, pod1IP6, pod1IP6, pod2IP6, sp, 8080)), vip6, sp)
		// A router's Packet Too Big about the remote flow: its own source kept.
		sp = sports[remoteBlue6]
		check(t, s.run(t, e.dp.uplink.FromUplink, ifUp(e),
			icmp6ErrorFrame(e.up.Attrs().HardwareAddr, neighMAC, "fd00:77::2", pod1IP6, pod1IP6, remoteBlue6, sp, 8080)), "fd00:77::2", sp)
		if d := s.stats(t).RevNAT - before.RevNAT; d != 2 {
			t.Errorf("rev-NAT counter grew by %d, want 2", d)
		}
	})

	t.Run("ClientIP affinity: every connection of the client takes one backend", func(t *testing.T) {
		e.enter(t)
		s.apply(t, dualSvcYAML("sticky", "10.96.0.21", "fd00:96::21", "affinity=60", pod2IP6, remoteBlue6))
		before := s.stats(t)
		var first netip.AddrPort
		for i := range 6 {
			r := s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(uint16(43000+i), "fd00:96::21", 80, tcpSYN))
			got := parseTuple6(t, r.out).dst
			if i == 0 {
				first = got
			} else if got != first {
				t.Fatalf("connection %d went to %v, the first to %v", i, got, first)
			}
		}
		if d := s.stats(t).AffinityHits - before.AffinityHits; d != 5 {
			t.Errorf("affinity hits grew by %d, want 5", d)
		}
	})

	t.Run("an IPv6 frontend without IPv6 endpoints: a TCP reset, an ICMPv6 port unreachable", func(t *testing.T) {
		e.enter(t)
		s.apply(t, dualSvcYAML("v4only", "10.96.0.22", "fd00:96::22", ""))
		s.apply(t, v6SvcYAML("dnsnone", "fd00:96::23", 53, "UDP"))
		before, err := e.dp.Counters(1)
		if err != nil {
			t.Fatal(err)
		}
		lbBefore := s.stats(t)
		syn := fromPod1(44000, "fd00:96::22", 80, tcpSYN)
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), syn)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(e) || r.redirKind != 2 {
			t.Fatalf("SYN: verdict %d into %d (kind %d), want the reset redirected back into pod 1 (%d)", r.verdict, r.redirIf, r.redirKind, ifH1(e))
		}
		rst := r.out[:54+20]
		got := parseTuple6(t, rst) // checks the TCP checksum
		// RFC 9293: the reset acknowledges the SYN and its data.
		seq := binary.BigEndian.Uint32(syn[54+4:]) + uint32(len(syn)-54-20)
		if got.src != ap("[fd00:96::22]:80") || got.dst != ap("["+pod1IP6+"]:44000") || rst[54+13] != 0x14 ||
			binary.BigEndian.Uint32(rst[54+8:]) != seq+1 || binary.BigEndian.Uint16(rst[18:]) != 20 {
			t.Fatalf("reset %v -> %v flags %#x ack %d (payload length %d), want [fd00:96::22]:80 -> pod 1, RST|ACK, ack %d, 20",
				got.src, got.dst, rst[54+13], binary.BigEndian.Uint32(rst[54+8:]), binary.BigEndian.Uint16(rst[18:]), seq+1)
		}
		if string(rst[0:6]) != string(pod1MAC) || string(rst[6:12]) != string(e.ep1.HostMAC) {
			t.Errorf("reset MACs %x -> %x, want the pod's frame's swapped", rst[6:12], rst[0:6])
		}
		dgram := polFrame6(e.ep1.HostMAC, pod1MAC, pod1IP6, "fd00:96::23", ipProtoUDP, 44001, 53, 0)
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), dgram)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(e) {
			t.Fatalf("UDP: verdict %d into %d, want the unreachable redirected back into pod 1", r.verdict, r.redirIf)
		}
		icmp := r.out[54 : 54+56]
		if r.out[20] != nhICMP6 || icmp[0] != 1 || icmp[1] != 4 ||
			binary.BigEndian.Uint16(icmp[2:]) != icmp6Checksum("fd00:96::23", pod1IP6, icmp) ||
			string(icmp[8:8+48]) != string(dgram[14:14+48]) {
			t.Fatalf("ICMPv6 answer %x: want type 1 code 4 with a valid checksum quoting the datagram's first 48 bytes", r.out[:54+56])
		}
		after, err := e.dp.Counters(1)
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Drops[DropNoBackend] - before.Drops[DropNoBackend]; d != 2 {
			t.Errorf("no-backend drops of pod 1 grew by %d, want 2", d)
		}
		if d := s.stats(t).NoBackend - lbBefore.NoBackend; d != 2 {
			t.Errorf("LB no-backend counter grew by %d, want 2", d)
		}
	})

	t.Run("policy judges the translated flow; a denied one leaves no LB state", func(t *testing.T) {
		e.enter(t)
		// The remote backend is not web.
		applyClientEgress6(t, e)
		var local, remote uint16
		for sp := uint16(45000); sp < 46000 && (local == 0 || remote == 0); sp++ {
			if pick(sp).Addr().String() == pod2IP6 {
				local = cmp.Or(local, sp)
			} else {
				remote = cmp.Or(remote, sp)
			}
		}
		r := s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(local, vip6, 80, tcpSYN))
		if r.verdict != tcActRedirect {
			t.Fatalf("to the web backend: verdict %d, want redirect (allowed on the translated port 8080)", r.verdict)
		}
		before, err := e.dp.Counters(1)
		if err != nil {
			t.Fatal(err)
		}
		r = s.run(t, e.dp.pod.FromPod, ifH1(e), fromPod1(remote, vip6, 80, tcpSYN))
		after, err := e.dp.Counters(1)
		if err != nil {
			t.Fatal(err)
		}
		if r.verdict != tcActShot || after.Drops[DropPolicyEgress]-before.Drops[DropPolicyEgress] != 1 {
			t.Fatalf("to the remote backend: verdict %d, policy-egress drops +%d; want a drop", r.verdict, after.Drops[DropPolicyEgress]-before.Drops[DropPolicyEgress])
		}
		var (
			k   podCt6Key
			v   podCtEntry
			n   int
			bad []string
		)
		it := e.dp.pod.LkCt6.Iterate()
		for it.Next(&k, &v) {
			if portNetOrder(k.Sport) == remote || portNetOrder(k.Dport) == remote {
				bad = append(bad, fmt.Sprintf("%+v", k))
			}
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if len(bad) > 0 {
			t.Errorf("the denied flow left %d conntrack entries: %v", len(bad), bad)
		}
		if n == 0 {
			t.Error("lk_ct6 is empty: the allowed flows left no state either")
		}
	})

	t.Run("the restarted agent adopts the IPv6 entries", func(t *testing.T) {
		e.enter(t)
		dumped, err := e.dp.DumpServices()
		if err != nil {
			t.Fatal(err)
		}
		if len(dumped.Services6) != 4 || len(dumped.Backends6) != 4 || len(dumped.RevNat6) != 4 {
			t.Fatalf("dumped %d IPv6 services, %d backends, %d rev-NAT; want 4, 4, 4", len(dumped.Services6), len(dumped.Backends6), len(dumped.RevNat6))
		}
		fresh := service.NewTables()
		adopted, repair := fresh.Adopt(dumped)
		if repair.Ops() != 0 {
			t.Errorf("adopting the pinned maps needs repairs: %s", repair)
		}
		if u := fresh.Apply(service.Diff(nil, s.model)); u.Ops() != 0 {
			t.Errorf("re-applying the model after adoption (%d frontends) writes %s", len(adopted), u)
		}
	})
}

// applyClientEgress6 programs client-egress over the IPv6 policy world:
// pod 1 (a client) may reach web (pod 2) on TCP 8000-8080 only.
func applyClientEgress6(t *testing.T, e *fixtureEnv) {
	t.Helper()
	in := policyWorld6(e)
	in.Policies = decodePolicies(t, polClientEgress)
	c, err := policy.Compile(in, policy.NewIdentities())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dp.ApplyPolicy(policy.Diff(nil, c)); err != nil {
		t.Fatal(err)
	}
}
