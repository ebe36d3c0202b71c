package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/pkg/service"
)

// loadBalancerSourceRanges fixtures (bpf/lib/lb_maps.h lb_src_range_ok, the
// check in lb4/lb6; translation in pkg/service srcrange.go), one table over
// both families: a LoadBalancer ingress IP takes packets from the wire and
// from pods only from its ranges, others are dropped (lb-src-range); the
// Service's ClusterIP and NodePort are not limited; a changed range list
// takes effect, an emptied one opens the address, a deleted Service leaves
// no entry behind.
func TestSourceRangeFixtures(t *testing.T) {
	s := newSvcEnv6(t) // dual-stack: pods, node and uplink of both families
	e := s.fixtureEnv
	up, pod := fromUplink(e), fromPod(e)
	type fam struct {
		name, vip, lbIP, allowed, blocked, ranges, pod1, backend string
		wire, fromPod1                                           func(src string, sport uint16, dst string, dport uint16) []byte
		dst                                                      func(t *testing.T, out []byte) netip.AddrPort
	}
	fams := []fam{
		{name: "ipv4", vip: "10.96.5.1", lbIP: "192.0.2.20", allowed: "198.51.100.7", blocked: "203.0.113.9",
			ranges: "198.51.100.0/24", pod1: "10.244.1.10", backend: "10.244.1.11",
			wire: func(src string, sport uint16, dst string, dport uint16) []byte {
				return l4Frame(e.up.Attrs().HardwareAddr, neighMAC, src, sport, dst, dport, ipProtoTCP, tcpSYN, 1, 0, nil)
			},
			fromPod1: func(_ string, sport uint16, dst string, dport uint16) []byte {
				return s.fromPod1(dst, dport, sport, tcpSYN)
			},
			dst: func(t *testing.T, out []byte) netip.AddrPort { return parseTuple(t, out).dst }},
		{name: "ipv6", vip: "fd00:96::50", lbIP: lbIP6, allowed: client6, blocked: "fd00:77::9",
			ranges: client6 + "/128", pod1: pod1IP6, backend: pod2IP6,
			wire: func(src string, sport uint16, dst string, dport uint16) []byte {
				return s.wire6(src, sport, dst, dport, tcpSYN)
			},
			fromPod1: func(_ string, sport uint16, dst string, dport uint16) []byte {
				return tcp6Seg(e.ep1.HostMAC, pod1MAC, pod1IP6, sport, dst, dport, tcpSYN)
			},
			dst: func(t *testing.T, out []byte) netip.AddrPort { return parseTuple6(t, out).dst }},
	}
	drops := func(t *testing.T, ep uint32) uint64 {
		t.Helper()
		c, err := e.dp.Counters(ep)
		if err != nil {
			t.Fatal(err)
		}
		return c.Drops[DropLBSrcRange]
	}
	// entries are frontend id's source-range entries.
	entries := func(t *testing.T, id uint32) map[netip.Prefix]uint32 {
		t.Helper()
		out := map[netip.Prefix]uint32{}
		var k service.SrcRangeKey
		var v uint8
		it := e.dp.pod.LkLbSrcRange.Iterate()
		for it.Next(&k, &v) {
			p, ok := k.Prefix()
			if !ok {
				t.Fatalf("corrupt source-range key %+v", k)
			}
			if k.FrontendID == id {
				out[p] = k.FrontendID
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for i, f := range fams {
		np := 30300 + i
		yaml := func(ranges string) string {
			return lbSvcYAML("src-"+f.name, f.vip, "TCP", np, "  loadBalancerSourceRanges: ["+ranges+"]",
				"  loadBalancer: {ingress: [{ip: \""+f.lbIP+"\"}]}", f.backend)
		}
		backend := netip.AddrPortFrom(netip.MustParseAddr(f.backend), 8080)
		passes := func(t *testing.T, what string, prog func(src string, sport uint16, dst string, dport uint16) []byte,
			src string, sport uint16, dst string, dport uint16, fromWire bool) {
			t.Helper()
			p, ifx := pod, ifH1(e)
			if fromWire {
				p, ifx = up, ifUp(e)
			}
			r := s.run(t, p, ifx, prog(src, sport, dst, dport))
			if r.verdict != tcActRedirect || r.redirIf != ifH2(e) || f.dst(t, r.out) != backend {
				t.Fatalf("%s: verdict %d into %d, to %v; want the backend %v in pod 2", what, r.verdict, r.redirIf, f.dst(t, r.out), backend)
			}
		}
		dropped := func(t *testing.T, what string, prog func(src string, sport uint16, dst string, dport uint16) []byte,
			src string, sport uint16, dst string, dport uint16, fromWire bool) {
			t.Helper()
			p, ifx, ep := pod, ifH1(e), uint32(1)
			if fromWire {
				p, ifx, ep = up, ifUp(e), 0
			}
			before, st := drops(t, ep), s.stats(t)
			if r := s.run(t, p, ifx, prog(src, sport, dst, dport)); r.verdict != tcActShot {
				t.Fatalf("%s: verdict %d, want a drop", what, r.verdict)
			}
			if d := drops(t, ep) - before; d != 1 {
				t.Fatalf("%s: lb-src-range drops on endpoint %d grew by %d, want 1", what, ep, d)
			}
			if a := s.stats(t); a.NewFlows != st.NewFlows || a.NoBackend != st.NoBackend {
				t.Fatalf("%s: the dropped packet took a backend or an answer", what)
			}
		}

		t.Run(f.name+": the ingress IP takes only its ranges, from the wire and from pods", func(t *testing.T) {
			e.enter(t)
			s.apply(t, yaml(f.ranges))
			lb := s.frontend(t, f.lbIP, 80, service.TCP, service.ScopeNodePort)
			if len(lb.SourceRanges) != 1 {
				t.Fatalf("ingress IP frontend ranges %v", lb.SourceRanges)
			}
			passes(t, "allowed client from the wire", f.wire, f.allowed, 41000, f.lbIP, 80, true)
			dropped(t, "other client from the wire", f.wire, f.blocked, 41001, f.lbIP, 80, true)
			dropped(t, "pod 1 (not in the ranges)", f.fromPod1, f.pod1, 41002, f.lbIP, 80, false)
			// Every packet, not only new flows: the allowed client's flow
			// keeps going, the blocked one's later packets still drop.
			dropped(t, "other client, again", f.wire, f.blocked, 41001, f.lbIP, 80, true)
		})

		t.Run(f.name+": ClusterIP and NodePort are not limited", func(t *testing.T) {
			e.enter(t)
			passes(t, "pod 1 to the ClusterIP", f.fromPod1, f.pod1, 41010, f.vip, 80, false)
			node := "10.77.0.1"
			if f.name == "ipv6" {
				node = nodeIP6
			}
			passes(t, "other client to the NodePort", f.wire, f.blocked, 41011, node, uint16(np), true)
		})

		t.Run(f.name+": ranges changed, emptied, deleted with the Service", func(t *testing.T) {
			e.enter(t)
			id, _ := s.tables.FrontendID(service.FrontendKey{Addr: netip.MustParseAddr(f.lbIP), Port: 80, Proto: service.TCP, Scope: service.ScopeNodePort})
			if id == 0 {
				t.Fatal("no ingress IP frontend")
			}
			s.apply(t, yaml(f.ranges+", "+f.pod1+"/"+map[bool]string{true: "128", false: "32"}[f.name == "ipv6"]))
			passes(t, "pod 1, now in the ranges", f.fromPod1, f.pod1, 41020, f.lbIP, 80, false)
			dropped(t, "other client from the wire", f.wire, f.blocked, 41021, f.lbIP, 80, true)
			// An empty list: every source (the flag and the entries go).
			s.apply(t, lbSvcYAML("src-"+f.name, f.vip, "TCP", np, "", "  loadBalancer: {ingress: [{ip: \""+f.lbIP+"\"}]}", f.backend))
			if n := len(entries(t, id)); n != 0 {
				t.Fatalf("%d source-range entries left after the ranges were removed", n)
			}
			passes(t, "other client, ranges removed", f.wire, f.blocked, 41022, f.lbIP, 80, true)
			s.apply(t, yaml(f.ranges))
			if got := entries(t, id); len(got) != 1 || got[netip.MustParsePrefix(f.ranges)] != id {
				t.Fatalf("source-range entries %v, want %s of frontend %d (the ingress IP's only)", got, f.ranges, id)
			}
			// A restarted agent reads them back (DumpServices) and adopts
			// them: nothing to repair, nothing to rewrite.
			dump, err := e.dp.DumpServices()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(dump.SrcRanges, service.SrcRangeKeyOf(id, netip.MustParsePrefix(f.ranges))) {
				t.Fatalf("dump source ranges %v lack %s of frontend %d", dump.SrcRanges, f.ranges, id)
			}
			fresh := service.NewTables()
			if _, repair := fresh.Adopt(dump); len(repair.SrcRangeDeletes) != 0 {
				t.Fatalf("adopting the dump repairs source ranges %v", repair.SrcRangeDeletes)
			}
			if u := fresh.Apply(service.Diff(nil, s.model)); len(u.SrcRanges)+len(u.SrcRangeDeletes) != 0 {
				t.Fatalf("after adoption the model rewrites source ranges +%v -%v", u.SrcRanges, u.SrcRangeDeletes)
			}
			c := s.model.Delete(service.ServiceID{Namespace: "fx", Name: "src-" + f.name})
			if err := e.dp.ApplyServices(s.tables.Apply(c)); err != nil {
				t.Fatal(err)
			}
			if got := entries(t, id); len(got) != 0 {
				t.Fatalf("source-range entries %v left after the Service was deleted", got)
			}
		})
	}
}
