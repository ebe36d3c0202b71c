package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

// Service load-balancing fixtures (bpf/lib/lb.h, bpf/lib/ct.h): packets
// through from_pod / from_uplink with BPF_PROG_TEST_RUN, services programmed
// through the real translation (pkg/service) and ApplyServices. Helpers are
// in services_fixture_env_test.go.
func TestServiceFixtures(t *testing.T) {
	s := newSvcEnv(t)
	pod := fromPod(s.fixtureEnv)
	up := fromUplink(s.fixtureEnv)

	t.Run("DNAT to the Maglev backend, checksums valid", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("dnat", "10.96.0.10", 80, "TCP", "", "10.244.1.11", "10.244.2.5", "10.244.2.6", "10.244.2.7"))
		f := s.frontend(t, "10.96.0.10", 80, service.TCP, service.ScopeClusterIP)
		before := s.stats(t)
		seen := map[netip.AddrPort]bool{}
		for sport := uint16(40000); sport < 40016; sport++ {
			r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.10", 80, sport, tcpSYN))
			got := parseTuple(t, r.out)
			want := expectBackend(t, f, "10.244.1.10", sport)
			if r.verdict != tcActRedirect || got.dst != want || got.src != netip.AddrPortFrom(netip.MustParseAddr("10.244.1.10"), sport) {
				t.Fatalf("sport %d: verdict %d, %s -> %s, want redirect to %s", sport, r.verdict, got.src, got.dst, want)
			}
			wantIf := ifUp(s.fixtureEnv)
			if want.Addr() == netip.MustParseAddr("10.244.1.11") {
				wantIf = ifH2(s.fixtureEnv)
			}
			if r.redirIf != wantIf {
				t.Fatalf("sport %d: redirected to ifindex %d, want %d", sport, r.redirIf, wantIf)
			}
			seen[got.dst] = true
		}
		if len(seen) < 3 {
			t.Fatalf("16 flows reached only %d backends: %v", len(seen), seen)
		}
		if d := s.stats(t).NewFlows - before.NewFlows; d != 16 {
			t.Fatalf("new-flow counter grew by %d, want 16", d)
		}
	})

	t.Run("UDP DNAT and reply rev-NAT (local backend)", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("udp", "10.96.0.11", 53, "UDP", "", "10.244.1.11"))
		in := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", 41000, "10.96.0.11", 53, 17, 0, 0, 0, []byte("query"))
		r := s.run(t, pod, ifH1(s.fixtureEnv), in)
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifH2(s.fixtureEnv) || got.dst != ap("10.244.1.11:8080") {
			t.Fatalf("verdict %d to %d, dst %s", r.verdict, r.redirIf, got.dst)
		}
		before := s.stats(t)
		reply := l4Frame(s.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.244.1.10", 41000, 17, 0, 0, 0, []byte("answer"))
		r = s.run(t, pod, ifH2(s.fixtureEnv), reply)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || got.src != ap("10.96.0.11:53") || got.dst != ap("10.244.1.10:41000") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s; want 10.96.0.11:53 -> 10.244.1.10:41000 into pod 1", r.verdict, r.redirIf, got.src, got.dst)
		}
		if s.stats(t).RevNAT-before.RevNAT != 1 {
			t.Fatal("rev-NAT counter did not grow")
		}
	})

	t.Run("backend on the node's own stack (hostNetwork endpoint): its reply rev-NATed in to_pod", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("hostep", "10.96.0.114", 80, "TCP", "", "10.77.0.1"))
		r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.114", 80, 41500, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActOK || got.dst != ap("10.77.0.1:8080") {
			t.Fatalf("verdict %d, dst %s; want 10.77.0.1:8080 handed to the stack", r.verdict, got.dst)
		}
		before := s.stats(t)
		reply := l4Frame(pod1MAC, s.ep1.HostMAC, "10.77.0.1", 8080, "10.244.1.10", 41500, 6, tcpSYN|tcpACK, 5000, 1001, nil)
		r = s.run(t, toPod(s.fixtureEnv), ifH1(s.fixtureEnv), reply)
		got := parseTuple(t, r.out)
		if r.verdict != tcActOK || got.src != ap("10.96.0.114:80") || got.dst != ap("10.244.1.10:41500") {
			t.Fatalf("reply through to_pod: verdict %d, %s -> %s; want 10.96.0.114:80 -> 10.244.1.10:41500", r.verdict, got.src, got.dst)
		}
		if l4Checksum(r.out) != binary.BigEndian.Uint16(r.out[50:]) {
			t.Fatalf("TCP checksum invalid after rev-NAT")
		}
		if s.stats(t).RevNAT-before.RevNAT != 1 {
			t.Fatal("rev-NAT counter did not grow")
		}
		// The node reaching the pod directly is not translated.
		direct := l4Frame(pod1MAC, s.ep1.HostMAC, "10.77.0.1", 8080, "10.244.1.10", 41501, 6, tcpSYN, 1, 0, nil)
		r = s.run(t, toPod(s.fixtureEnv), ifH1(s.fixtureEnv), direct)
		if got := parseTuple(t, r.out); r.verdict != tcActOK || got.src != ap("10.77.0.1:8080") {
			t.Fatalf("direct: verdict %d, from %s", r.verdict, got.src)
		}
	})

	t.Run("NodePort from outside to the node itself (hostNetwork endpoint): no SNAT, the reply leaves as the NodePort", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("hostnp", "10.96.0.115", 80, "TCP", "nodePort=30095", "10.77.0.1"))
		syn := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "192.0.2.50", 40000, "10.77.0.1", 30095, 6, tcpSYN, 1, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), syn)
		if got := parseTuple(t, r.out); r.verdict != tcActOK || got.dst != ap("10.77.0.1:8080") || got.src != ap("192.0.2.50:40000") {
			t.Fatalf("verdict %d, %s -> %s; want 192.0.2.50:40000 -> 10.77.0.1:8080 handed to the stack (no SNAT to its own address: a martian)", r.verdict, got.src, got.dst)
		}
		before := s.stats(t)
		reply := l4Frame(neighMAC, s.up.Attrs().HardwareAddr, "10.77.0.1", 8080, "192.0.2.50", 40000, 6, tcpSYN|tcpACK, 5000, 2, nil)
		toUp := s.dp.uplink.ToUplink
		r = s.run(t, toUp, ifUp(s.fixtureEnv), reply)
		got := parseTuple(t, r.out)
		if r.verdict != tcActOK || got.src != ap("10.77.0.1:30095") || got.dst != ap("192.0.2.50:40000") {
			t.Fatalf("reply through to_uplink: verdict %d, %s -> %s; want 10.77.0.1:30095 -> 192.0.2.50:40000", r.verdict, got.src, got.dst)
		}
		if l4Checksum(r.out) != binary.BigEndian.Uint16(r.out[50:]) {
			t.Fatalf("TCP checksum invalid after rev-NAT")
		}
		if s.stats(t).RevNAT-before.RevNAT != 1 {
			t.Fatal("rev-NAT counter did not grow")
		}
		// What the node forwards (it came in on another device) is not looked at.
		fwd := bytes.Clone(reply)
		opts := &ebpf.RunOptions{Data: fwd, DataOut: make([]byte, len(fwd)+64), Context: skbCtx{Ifindex: uint32(ifUp(s.fixtureEnv)), IngressIfindex: uint32(ifH1(s.fixtureEnv))}}
		if ret, err := toUp.Run(opts); err != nil || ret != tcActOK || parseTuple(t, opts.DataOut).src != ap("10.77.0.1:8080") {
			t.Fatalf("forwarded packet: verdict %d (%v), from %s; want untouched", ret, err, parseTuple(t, opts.DataOut).src)
		}
	})

	t.Run("NodePort from a host that is also the backend (a node reaching another node's NodePort it serves): node SNAT, not hairpin", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("selfnp", "10.96.0.117", 80, "TCP", "nodePort=30097", "10.77.0.2"))
		syn := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", 40100, "10.77.0.1", 30097, 6, tcpSYN, 1, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), syn)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || got.dst != ap("10.77.0.2:8080") || got.src.Addr() != netip.MustParseAddr("10.77.0.1") {
			t.Fatalf("verdict %d, %s -> %s; want 10.77.0.1:<snat> -> 10.77.0.2:8080 back out the uplink (169.254.42.1 would not route back)", r.verdict, got.src, got.dst)
		}
		reply := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", 8080, "10.77.0.1", got.src.Port(), 6, tcpSYN|tcpACK, 5, 2, nil)
		r = s.run(t, up, ifUp(s.fixtureEnv), reply)
		if back := parseTuple(t, r.out); r.verdict != tcActRedirect || back.src != ap("10.77.0.1:30097") || back.dst != ap("10.77.0.2:40100") {
			t.Fatalf("reply: verdict %d, %s -> %s; want 10.77.0.1:30097 -> 10.77.0.2:40100", r.verdict, back.src, back.dst)
		}
	})

	t.Run("ICMP port unreachable from the backend: translated back to the frontend", func(t *testing.T) {
		s.enter(t)
		// What pod 1's datagram looked like at the backend (after DNAT).
		quoted := l4Frame(s.ep2.HostMAC, pod2MAC, "10.244.1.10", 41000, "10.244.1.11", 8080, 17, 0, 0, 0, []byte("query"))[14 : 14+28]
		in := icmpErrFrame(s.ep2.HostMAC, pod2MAC, "10.244.1.11", "10.244.1.10", 3, 3, quoted)
		before := s.stats(t)
		r := s.run(t, pod, ifH2(s.fixtureEnv), in)
		out := r.out
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || len(out) != len(in) {
			t.Fatalf("verdict %d to %d, %x", r.verdict, r.redirIf, out)
		}
		q := out[42:]
		if netip.AddrFrom4([4]byte(out[26:30])) != netip.MustParseAddr("10.96.0.11") ||
			netip.AddrFrom4([4]byte(q[16:20])) != netip.MustParseAddr("10.96.0.11") || binary.BigEndian.Uint16(q[22:]) != 53 ||
			netip.AddrFrom4([4]byte(q[12:16])) != netip.MustParseAddr("10.244.1.10") || binary.BigEndian.Uint16(q[20:]) != 41000 {
			t.Fatalf("not translated to the frontend: outer src %v, quoted %x", out[26:30], q)
		}
		if testutil.IPv4Checksum(q[:20]) != binary.BigEndian.Uint16(q[10:]) {
			t.Fatalf("quoted IPv4 checksum invalid: %x", q[:20])
		}
		if icmpChecksum(out[34:]) != 0xffff {
			t.Fatalf("ICMP checksum invalid: %x", out[34:])
		}
		if s.stats(t).RevNAT-before.RevNAT != 1 {
			t.Fatal("rev-NAT not counted")
		}
	})

	t.Run("VM endpoint as client: DNAT, reply rev-NATed into the VM's device", func(t *testing.T) {
		s.enter(t)
		in := l4Frame(s.ep3.HostMAC, vm3MAC, "10.244.1.12", 41001, "10.96.0.11", 53, 17, 0, 0, 0, []byte("query"))
		r := s.run(t, pod, ifH3(s.fixtureEnv), in)
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifH2(s.fixtureEnv) || got.dst != ap("10.244.1.11:8080") {
			t.Fatalf("verdict %d to %d, dst %s", r.verdict, r.redirIf, got.dst)
		}
		reply := l4Frame(s.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.244.1.12", 41001, 17, 0, 0, 0, []byte("answer"))
		r = s.run(t, pod, ifH2(s.fixtureEnv), reply)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH3(s.fixtureEnv) || r.redirKind != 1 || got.src != ap("10.96.0.11:53") {
			t.Fatalf("reply: verdict %d to %d kind %d, from %s", r.verdict, r.redirIf, r.redirKind, got.src)
		}
	})

	t.Run("remote backend: reply rev-NATed on the uplink", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("remote", "10.96.0.12", 80, "TCP", "", "10.244.2.5"))
		r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.12", 80, 42000, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("verdict %d to %d, dst %s", r.verdict, r.redirIf, got.dst)
		}
		reply := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.244.1.10", 42000, 6, tcpSYN|tcpACK, 5000, 1001, nil)
		r = s.run(t, up, ifUp(s.fixtureEnv), reply)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || got.src != ap("10.96.0.12:80") || got.dst != ap("10.244.1.10:42000") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s", r.verdict, r.redirIf, got.src, got.dst)
		}
	})

	t.Run("a direct connection reusing a service flow's tuple gets no rev-NAT", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("reuse", "10.96.0.113", 80, "TCP", "", "10.244.2.5"))
		// A service flow from port 42100, answered.
		r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.113", 80, 42100, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("service SYN: verdict %d, dst %s", r.verdict, got.dst)
		}
		reply := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.244.1.10", 42100, 6, tcpSYN|tcpACK, 5000, 1001, nil)
		if got := parseTuple(t, s.run(t, up, ifUp(s.fixtureEnv), reply).out); got.src != ap("10.96.0.113:80") {
			t.Fatalf("service reply from %s, want the VIP", got.src)
		}
		// The client closes it and connects straight to the backend from the same port.
		s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.113", 80, 42100, tcpFIN|tcpACK))
		r = s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.244.2.5", 8080, 42100, tcpSYN))
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.dst != ap("10.244.2.5:8080") {
			t.Fatalf("direct SYN: verdict %d, dst %s", r.verdict, got.dst)
		}
		r = s.run(t, up, ifUp(s.fixtureEnv), reply)
		if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.src != ap("10.244.2.5:8080") || got.dst != ap("10.244.1.10:42100") {
			t.Fatalf("direct connection's reply: verdict %d, %s -> %s; want it from the backend itself", r.verdict, got.src, got.dst)
		}
	})

	t.Run("conntrack keeps a flow's backend when the Maglev table changes", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("sticky", "10.96.0.13", 80, "TCP", "", "10.244.2.5", "10.244.2.6", "10.244.2.7"))
		old := s.frontend(t, "10.96.0.13", 80, service.TCP, service.ScopeClusterIP)
		// The new table (two more backends) sends some flows elsewhere:
		// pick a source port whose Maglev choice changes.
		grown := svcYAML("sticky", "10.96.0.13", 80, "TCP", "", "10.244.2.5", "10.244.2.6", "10.244.2.7", "10.244.2.8", "10.244.2.9")
		m2 := service.NewModel(service.Options{})
		objs, _ := k8sobj.Decode([]byte(grown))
		if _, err := m2.Set(objs[0].Service, []*k8sobj.EndpointSlice{objs[1].EndpointSlice}); err != nil {
			t.Fatal(err)
		}
		nf := m2.Frontend(old.Key)
		var sport uint16
		for p := uint16(43000); p < 44000; p++ {
			if expectBackend(t, old, "10.244.1.10", p) != expectBackend(t, nf, "10.244.1.10", p) {
				sport = p
				break
			}
		}
		if sport == 0 {
			t.Fatal("no flow moves between the tables")
		}
		first := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.13", 80, sport, tcpSYN)).out).dst
		if first != expectBackend(t, old, "10.244.1.10", sport) {
			t.Fatalf("first packet to %s, want %s", first, expectBackend(t, old, "10.244.1.10", sport))
		}
		s.apply(t, grown)
		before := s.stats(t)
		again := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.13", 80, sport, tcpACK)).out).dst
		if again != first {
			t.Fatalf("after the table change the flow went to %s, want %s (conntrack)", again, first)
		}
		if s.stats(t).ConntrackHits-before.ConntrackHits != 1 {
			t.Fatal("conntrack-hit counter did not grow")
		}
		// A new flow follows the new table.
		p2 := sport + 1
		if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.13", 80, p2, tcpSYN)).out).dst; got != expectBackend(t, nf, "10.244.1.10", p2) {
			t.Fatalf("new flow to %s, want %s", got, expectBackend(t, nf, "10.244.1.10", p2))
		}
	})

	t.Run("backend removed: only its flows move", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("remove", "10.96.0.14", 80, "TCP", "", "10.244.2.5", "10.244.2.6", "10.244.2.7"))
		f := s.frontend(t, "10.96.0.14", 80, service.TCP, service.ScopeClusterIP)
		to := map[uint16]netip.AddrPort{}
		for p := uint16(44000); p < 44012; p++ {
			to[p] = parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.14", 80, p, tcpSYN)).out).dst
			if to[p] != expectBackend(t, f, "10.244.1.10", p) {
				t.Fatalf("sport %d to %s", p, to[p])
			}
		}
		s.apply(t, svcYAML("remove", "10.96.0.14", 80, "TCP", "", "10.244.2.5", "10.244.2.6"))
		before := s.stats(t)
		moved := 0
		for p, was := range to {
			got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.14", 80, p, tcpACK)).out).dst
			if was == ap("10.244.2.7:8080") {
				moved++
				if got == was {
					t.Fatalf("sport %d still goes to the removed backend", p)
				}
			} else if got != was {
				t.Fatalf("sport %d moved from %s to %s although its backend stays", p, was, got)
			}
		}
		if moved == 0 {
			t.Fatal("no flow was on the removed backend")
		}
		if d := s.stats(t).Reselected - before.Reselected; d != uint64(moved) {
			t.Fatalf("reselect counter grew by %d, want %d", d, moved)
		}
	})

	t.Run("ClientIP affinity: same client, any port, same backend; moves after the timeout", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("aff", "10.96.0.15", 80, "TCP", "affinity=1", "10.244.2.5", "10.244.2.6", "10.244.2.7", "10.244.2.8"))
		f := s.frontend(t, "10.96.0.15", 80, service.TCP, service.ScopeClusterIP)
		first := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.15", 80, 45000, tcpSYN)).out).dst
		before := s.stats(t)
		for p := uint16(45001); p < 45013; p++ {
			if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.15", 80, p, tcpSYN)).out).dst; got != first {
				t.Fatalf("sport %d went to %s, want %s (affinity)", p, got, first)
			}
		}
		if d := s.stats(t).AffinityHits - before.AffinityHits; d != 12 {
			t.Fatalf("affinity counter grew by %d, want 12", d)
		}
		time.Sleep(1100 * time.Millisecond)
		// After the timeout a new flow takes Maglev's choice: pick a port
		// whose choice differs from the affinity backend.
		var p uint16
		for q := uint16(46000); q < 47000; q++ {
			if expectBackend(t, f, "10.244.1.10", q) != first {
				p = q
				break
			}
		}
		if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.15", 80, p, tcpSYN)).out).dst; got != expectBackend(t, f, "10.244.1.10", p) {
			t.Fatalf("after the timeout sport %d went to %s, want Maglev's %s", p, got, expectBackend(t, f, "10.244.1.10", p))
		}
	})

	t.Run("terminating backend keeps its flows, takes no new ones", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("term", "10.96.0.16", 80, "TCP", "", "10.244.2.5", "10.244.2.6"))
		f := s.frontend(t, "10.96.0.16", 80, service.TCP, service.ScopeClusterIP)
		var p uint16
		for q := uint16(47000); q < 48000; q++ {
			if expectBackend(t, f, "10.244.1.10", q) == ap("10.244.2.6:8080") {
				p = q
				break
			}
		}
		if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.16", 80, p, tcpSYN)).out).dst; got != ap("10.244.2.6:8080") {
			t.Fatalf("first packet to %s", got)
		}
		s.apply(t, svcYAML("term", "10.96.0.16", 80, "TCP", "", "10.244.2.5", "10.244.2.6:term"))
		if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.16", 80, p, tcpACK)).out).dst; got != ap("10.244.2.6:8080") {
			t.Fatalf("established flow moved to %s after its backend began terminating", got)
		}
		for q := uint16(48000); q < 48020; q++ {
			if got := parseTuple(t, s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.16", 80, q, tcpSYN)).out).dst; got != ap("10.244.2.5:8080") {
				t.Fatalf("new flow %d went to %s, want the active backend", q, got)
			}
		}
	})

	t.Run("no backend: TCP reset sent back, counted", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("none", "10.96.0.17", 80, "TCP", "", "10.244.2.5:notready"))
		before, _ := s.dp.Counters(1)
		bst := s.stats(t)
		in := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", 49000, "10.96.0.17", 80, 6, tcpSYN, 7777, 0, nil)
		r := s.run(t, pod, ifH1(s.fixtureEnv), in)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || r.redirKind != 2 {
			t.Fatalf("verdict %d to %d kind %d, want the reset back into pod 1", r.verdict, r.redirIf, r.redirKind)
		}
		if got.src != ap("10.96.0.17:80") || got.dst != ap("10.244.1.10:49000") || got.flags != tcpRST|tcpACK || got.ack != 7778 || got.seq != 0 {
			t.Fatalf("reply %+v, want RST|ACK ack 7778 from the VIP", got)
		}
		if !bytes.Equal(r.out[0:6], pod1MAC) || !bytes.Equal(r.out[6:12], s.ep1.HostMAC) || len(r.out) != 54 {
			t.Fatalf("reply frame %x", r.out)
		}
		after, _ := s.dp.Counters(1)
		if after.Drops[DropNoBackend]-before.Drops[DropNoBackend] != 1 || s.stats(t).NoBackend-bst.NoBackend != 1 {
			t.Fatal("no-backend not counted")
		}
	})

	t.Run("no backend: ICMP port unreachable for UDP", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("noneu", "10.96.0.18", 53, "UDP", ""))
		in := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", 49001, "10.96.0.18", 53, 17, 0, 0, 0, []byte("q"))
		before, _ := s.dp.Counters(1)
		r := s.run(t, pod, ifH1(s.fixtureEnv), in)
		out := r.out
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || len(out) != 14+20+8+28 {
			t.Fatalf("verdict %d to %d, frame %x", r.verdict, r.redirIf, out)
		}
		if out[23] != 1 || out[34] != 3 || out[35] != 3 || !bytes.Equal(out[42:70], in[14:42]) ||
			!bytes.Equal(out[26:30], in[30:34]) || !bytes.Equal(out[30:34], in[26:30]) {
			t.Fatalf("not an ICMP port unreachable quoting the datagram: %x", out)
		}
		if icmpChecksum(out[34:]) != 0xffff {
			t.Fatalf("ICMP checksum invalid: %x", out[34:])
		}
		after, _ := s.dp.Counters(1)
		if after.Drops[DropNoBackend]-before.Drops[DropNoBackend] != 1 {
			t.Fatal("no-backend not counted")
		}
	})

	t.Run("NodePort on the uplink to a local backend keeps the client address", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("npl", "10.96.0.19", 80, "TCP", "nodePort=30080", "10.244.1.11"))
		before := s.stats(t)
		in := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", 50000, "10.77.0.1", 30080, 6, tcpSYN, 1, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), in)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH2(s.fixtureEnv) || got.dst != ap("10.244.1.11:8080") || got.src != ap("10.77.0.2:50000") {
			t.Fatalf("verdict %d to %d, %s -> %s", r.verdict, r.redirIf, got.src, got.dst)
		}
		if s.stats(t).NodePortLocal-before.NodePortLocal != 1 {
			t.Fatal("nodeport-local not counted")
		}
		reply := l4Frame(s.ep2.HostMAC, pod2MAC, "10.244.1.11", 8080, "10.77.0.2", 50000, 6, tcpSYN|tcpACK, 9, 2, nil)
		r = s.run(t, pod, ifH2(s.fixtureEnv), reply)
		got = parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || got.src != ap("10.77.0.1:30080") || got.dst != ap("10.77.0.2:50000") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s", r.verdict, r.redirIf, got.src, got.dst)
		}
	})

	t.Run("NodePort on the uplink to a remote backend: SNAT to the node, reply translated back", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("npr", "10.96.0.20", 80, "TCP", "nodePort=30081", "10.244.2.5"))
		before := s.stats(t)
		in := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", 50001, "10.77.0.1", 30081, 6, tcpSYN, 1, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), in)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || got.dst != ap("10.244.2.5:8080") || got.src.Addr() != s.node {
			t.Fatalf("verdict %d to %d, %s -> %s; want node -> 10.244.2.5:8080 out of the uplink", r.verdict, r.redirIf, got.src, got.dst)
		}
		if s.stats(t).NodePortSNAT-before.NodePortSNAT != 1 {
			t.Fatal("nodeport-snat not counted")
		}
		reply := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.77.0.1", got.src.Port(), 6, tcpSYN|tcpACK, 9, 2, nil)
		r = s.run(t, up, ifUp(s.fixtureEnv), reply)
		back := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || back.src != ap("10.77.0.1:30081") || back.dst != ap("10.77.0.2:50001") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s; want 10.77.0.1:30081 -> 10.77.0.2:50001", r.verdict, r.redirIf, back.src, back.dst)
		}
		// A second client on the same source port gets another SNAT port.
		in2 := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.3", 50001, "10.77.0.1", 30081, 6, tcpSYN, 1, 0, nil)
		got2 := parseTuple(t, s.run(t, up, ifUp(s.fixtureEnv), in2).out)
		if got2.src.Addr() != s.node || got2.src.Port() == got.src.Port() {
			t.Fatalf("second client SNATed to %s, first to %s", got2.src, got.src)
		}
	})

	t.Run("pod to a NodePort on its node's address, remote backend: no SNAT, reply translated on the uplink", func(t *testing.T) {
		s.enter(t)
		r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.77.0.1", 30081, 52000, tcpSYN))
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || got.dst != ap("10.244.2.5:8080") || got.src != ap("10.244.1.10:52000") {
			t.Fatalf("verdict %d to %d, %s -> %s", r.verdict, r.redirIf, got.src, got.dst)
		}
		reply := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.244.2.5", 8080, "10.244.1.10", 52000, 6, tcpSYN|tcpACK, 9, 2, nil)
		r = s.run(t, up, ifUp(s.fixtureEnv), reply)
		back := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || back.src != ap("10.77.0.1:30081") || back.dst != ap("10.244.1.10:52000") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s", r.verdict, r.redirIf, back.src, back.dst)
		}
	})

	t.Run("NodePort without backends: reset sent back out of the uplink", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("npnone", "10.96.0.22", 80, "TCP", "nodePort=30082"))
		before, _ := s.dp.Counters(0)
		in := l4Frame(s.up.Attrs().HardwareAddr, neighMAC, "10.77.0.2", 50002, "10.77.0.1", 30082, 6, tcpSYN, 41, 0, nil)
		r := s.run(t, up, ifUp(s.fixtureEnv), in)
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifUp(s.fixtureEnv) || r.redirKind != 1 ||
			got.src != ap("10.77.0.1:30082") || got.dst != ap("10.77.0.2:50002") || got.flags != tcpRST|tcpACK || got.ack != 42 {
			t.Fatalf("verdict %d to %d kind %d, reply %+v", r.verdict, r.redirIf, r.redirKind, got)
		}
		if !bytes.Equal(r.out[0:6], neighMAC) || !bytes.Equal(r.out[6:12], s.up.Attrs().HardwareAddr) {
			t.Fatalf("reply MACs %x", r.out[0:12])
		}
		if after, _ := s.dp.Counters(0); after.Drops[DropNoBackend]-before.Drops[DropNoBackend] != 1 {
			t.Fatal("no-backend on the uplink not counted")
		}
	})

	t.Run("hairpin: a pod reaching its own service through the VIP", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("hairpin", "10.96.0.21", 80, "TCP", "", "10.244.1.10"))
		before := s.stats(t)
		r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.21", 80, 51000, tcpSYN))
		got := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || got.src != ap("169.254.42.1:51000") || got.dst != ap("10.244.1.10:8080") {
			t.Fatalf("verdict %d to %d, %s -> %s", r.verdict, r.redirIf, got.src, got.dst)
		}
		if s.stats(t).Hairpin-before.Hairpin != 1 {
			t.Fatal("hairpin not counted")
		}
		reply := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", 8080, "169.254.42.1", 51000, 6, tcpSYN|tcpACK, 9, 1001, nil)
		r = s.run(t, pod, ifH1(s.fixtureEnv), reply)
		back := parseTuple(t, r.out)
		if r.verdict != tcActRedirect || r.redirIf != ifH1(s.fixtureEnv) || back.src != ap("10.96.0.21:80") || back.dst != ap("10.244.1.10:51000") {
			t.Fatalf("reply: verdict %d to %d, %s -> %s", r.verdict, r.redirIf, back.src, back.dst)
		}
	})

	t.Run("a table smaller than the service value says (mid-update): new flows still get backends", func(t *testing.T) {
		s.enter(t)
		s.apply(t, svcYAML("shrink", "10.96.0.23", 80, "TCP", "", "10.244.2.5", "10.244.2.6"))
		k := service.ServiceKey{Addr: [4]byte{10, 96, 0, 23}, Port: 80, Proto: 6}
		var v service.ServiceValue
		if err := s.dp.pod.LkLbSvc.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		v.MaglevSize = 809 // as if the 251-slot table had just replaced an 809-slot one
		if err := s.dp.pod.LkLbSvc.Put(k, v); err != nil {
			t.Fatal(err)
		}
		for p := uint16(53000); p < 53040; p++ {
			r := s.run(t, pod, ifH1(s.fixtureEnv), s.fromPod1("10.96.0.23", 80, p, tcpSYN))
			if got := parseTuple(t, r.out); r.verdict != tcActRedirect || got.dst.Port() != 8080 {
				t.Fatalf("sport %d: verdict %d, %s -> %s", p, r.verdict, got.src, got.dst)
			}
		}
		v.MaglevSize = 251
		if err := s.dp.pod.LkLbSvc.Put(k, v); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("dump returns what was applied", func(t *testing.T) {
		s.enter(t)
		got, err := s.dp.DumpServices()
		if err != nil {
			t.Fatal(err)
		}
		want := s.tables.Snapshot()
		if fmt.Sprint(got.Services) != fmt.Sprint(want.Services) || fmt.Sprint(got.Backends) != fmt.Sprint(want.Backends) ||
			fmt.Sprint(got.RevNat) != fmt.Sprint(want.RevNat) || fmt.Sprint(got.Maglev) != fmt.Sprint(want.Maglev) {
			t.Fatalf("dump differs from the programmed snapshot:\n got %v\nwant %v", got, want)
		}
	})

	t.Run("conntrack GC removes expired entries only", func(t *testing.T) {
		s.enter(t)
		old := podCtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4, Proto: 17}
		fresh := podCtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 5, Proto: 17}
		now := monotonicNow()
		if err := s.dp.pod.LkCt4.Put(old, podCtEntry{LastSeen: now - 61e9}); err != nil {
			t.Fatal(err)
		}
		if err := s.dp.pod.LkCt4.Put(fresh, podCtEntry{LastSeen: now - 59e9}); err != nil {
			t.Fatal(err)
		}
		n, err := s.dp.GCConntrack()
		if err != nil || n < 1 {
			t.Fatalf("gc removed %d (%v)", n, err)
		}
		var v podCtEntry
		if s.dp.pod.LkCt4.Lookup(old, &v) == nil {
			t.Fatal("expired entry survived")
		}
		if err := s.dp.pod.LkCt4.Lookup(fresh, &v); err != nil {
			t.Fatalf("live entry removed: %v", err)
		}
		st := s.stats(t)
		if st.ConntrackEntries == 0 || st.ConntrackCapacity != DefaultConntrackEntries {
			t.Fatalf("stats after gc: %+v", st)
		}
	})

	t.Run("conntrack GC keeps an entry refreshed after its walk", func(t *testing.T) {
		s.enter(t)
		m := s.dp.pod.LkCt4
		stale := podCtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 6, Proto: 17}
		reused := podCtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 7, Proto: 17}
		now := monotonicNow()
		for _, k := range []podCtKey{stale, reused} {
			if err := m.Put(k, podCtEntry{LastSeen: now - 61e9}); err != nil {
				t.Fatal(err)
			}
		}
		isExpired := func(k podCtKey, v podCtEntry) bool {
			return now > v.LastSeen && time.Duration(now-v.LastSeen) > ctTimeout(k.Proto, v.Flags)
		}
		// GC's walk found both expired; then, before its delete, a packet
		// of a new connection on reused's tuple replaced the entry (the
		// datapath overwrites an expired entry), as GCConntrack can meet.
		expired := []podCtKey{stale, reused}
		if err := m.Put(reused, podCtEntry{LastSeen: now + 1e6, BackendId: 9}); err != nil {
			t.Fatal(err)
		}
		n, err := deleteExpiredCT(m, expired, isExpired)
		if err != nil || n != 1 {
			t.Fatalf("removed %d (%v), want 1", n, err)
		}
		var v podCtEntry
		if m.Lookup(stale, &v) == nil {
			t.Fatal("expired entry survived")
		}
		if err := m.Lookup(reused, &v); err != nil || v.BackendId != 9 {
			t.Fatalf("the new connection's entry was deleted: %v %+v", err, v)
		}
	})
}

// A full conntrack table evicts (LRU) and every eviction is counted.
func TestConntrackFullCounted(t *testing.T) {
	const capacity = 64
	s := newSvcEnvCfg(t, func(c *Config) { c.ConntrackEntries = capacity })
	s.apply(t, svcYAML("full", "10.96.0.30", 53, "UDP", "", "10.244.2.5"))
	pod := fromPod(s.fixtureEnv)
	for p := uint16(30000); p < 30100; p++ {
		in := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", p, "10.96.0.30", 53, 17, 0, 0, 0, []byte("q"))
		if r := s.run(t, pod, ifH1(s.fixtureEnv), in); r.verdict != tcActRedirect {
			t.Fatalf("flow %d: verdict %d", p, r.verdict)
		}
	}
	st := s.stats(t)
	// Each new flow creates a service entry and a flow entry.
	if st.ConntrackCreated != 200 || st.ConntrackCapacity != capacity {
		t.Fatalf("created %d capacity %d, want 200 and %d", st.ConntrackCreated, st.ConntrackCapacity, capacity)
	}
	if st.ConntrackEvicted != st.ConntrackCreated-capacity || st.ConntrackEntries != capacity {
		t.Fatalf("evicted %d entries %d, want %d and %d", st.ConntrackEvicted, st.ConntrackEntries, st.ConntrackCreated-capacity, capacity)
	}
	n := 0
	var k podCtKey
	var v podCtEntry
	it := s.dp.pod.LkCt4.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if n > capacity {
		t.Fatalf("lk_ct4 holds %d entries, capacity %d", n, capacity)
	}
	// GC re-bases the live count on what the table holds.
	if _, err := s.dp.GCConntrack(); err != nil {
		t.Fatal(err)
	}
	if st := s.stats(t); st.ConntrackEntries != uint64(n) {
		t.Fatalf("after gc the live count is %d, the table holds %d", st.ConntrackEntries, n)
	}
}

// The datapath stamps conntrack entries with CLOCK_MONOTONIC, read coarse
// (ct_now: at most a tick behind), the clock the agent's GC compares them
// with: an entry just created reads between a tick before the packet and
// the time after it.
func TestConntrackClockIsMonotonic(t *testing.T) {
	s := newSvcEnv(t)
	s.apply(t, svcYAML("clock", "10.96.0.31", 53, "UDP", "", "10.244.2.5"))
	pod := fromPod(s.fixtureEnv)
	before := monotonicNow()
	in := l4Frame(s.ep1.HostMAC, pod1MAC, "10.244.1.10", 31000, "10.96.0.31", 53, 17, 0, 0, 0, []byte("q"))
	if r := s.run(t, pod, ifH1(s.fixtureEnv), in); r.verdict != tcActRedirect {
		t.Fatalf("verdict %d", r.verdict)
	}
	after := monotonicNow()
	const tick = 100 * time.Millisecond // HZ >= 100: a tick is <= 10 ms; room for a loaded machine
	n := 0
	var k podCtKey
	var v podCtEntry
	it := s.dp.pod.LkCt4.Iterate()
	for it.Next(&k, &v) {
		n++
		if v.LastSeen > after || v.LastSeen+uint64(tick) < before {
			t.Errorf("entry %+v: last_seen %d, want within [%d - %v, %d] (CLOCK_MONOTONIC)", k, v.LastSeen, before, tick, after)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no conntrack entry created")
	}
}
