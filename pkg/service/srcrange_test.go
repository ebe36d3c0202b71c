package service

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// TestSourceRangesTranslated: loadBalancerSourceRanges land on the
// LoadBalancer ingress IP's frontends of their family only (both scopes
// with externalTrafficPolicy Local), as kube-proxy applies them; a
// zero-length range or none of the family leaves the address open; a range
// holding a node address lets the ingress IP itself in.
func TestSourceRangesTranslated(t *testing.T) {
	const (
		lb4, lb6 = "192.0.2.10", "2001:db8:e::10"
		ext4     = "192.0.2.99"
	)
	status := "  loadBalancer: {ingress: [{ip: " + lb4 + "}, {ip: \"" + lb6 + "\"}, {ip: 192.0.2.11, ipMode: Proxy}]}"
	tests := []struct {
		name, spec string
		want4      []netip.Prefix // on lb4's frontends
		want6      []netip.Prefix // on lb6's
	}{
		{"none", "", nil, nil},
		{"field, both families", "  loadBalancerSourceRanges: [198.51.100.0/24, ' 203.0.113.7/32', \"2001:db8:1::/48\"]",
			prefixes("198.51.100.0/24", "203.0.113.7/32"), prefixes("2001:db8:1::/48")},
		{"host bits masked, duplicates once", "  loadBalancerSourceRanges: [198.51.100.9/24, 198.51.100.0/24]",
			prefixes("198.51.100.0/24"), nil},
		{"annotation", "  x: y", nil, nil}, // replaced below
		{"a zero-length range opens its family", "  loadBalancerSourceRanges: [0.0.0.0/0, 198.51.100.0/24, \"2001:db8:1::/48\"]",
			nil, prefixes("2001:db8:1::/48")},
		{"a node address in a range: the ingress IP itself too", "  loadBalancerSourceRanges: [10.0.0.0/24]",
			prefixes("10.0.0.0/24", lb4+"/32"), nil},
	}
	for _, tc := range tests {
		for _, local := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, eTP Local %v", tc.name, local), func(t *testing.T) {
				meta := "{name: web, namespace: ns}"
				spec := tc.spec
				if tc.name == "annotation" {
					meta = "{name: web, namespace: ns, annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: '198.51.100.0/24'}}"
					spec = ""
					tc.want4 = prefixes("198.51.100.0/24")
				}
				if local {
					spec += "\n  externalTrafficPolicy: Local"
				}
				y := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: %s
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  externalIPs: [%s]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
%s
status:
%s
`, meta, ext4, spec, status)
				svcs, eps := decode(t, y)
				m, err := Build(svcs, eps, Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}})
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, f := range m.Frontends() {
					var want []netip.Prefix
					switch f.Key.Addr.String() {
					case lb4:
						want = tc.want4
					case lb6:
						want = tc.want6
					}
					if !slices.Equal(f.SourceRanges, want) {
						t.Errorf("%s scope %d: ranges %v, want %v", f.Key, f.Key.Scope, f.SourceRanges, want)
					}
					if f.Key.Addr.String() == "192.0.2.11" {
						t.Errorf("a frontend for the ipMode Proxy ingress IP: %s", f.Key)
					}
					n++
				}
				if n == 0 {
					t.Fatal("no frontends")
				}
			})
		}
	}
}

// TestSourceRangeTables: a frontend's ranges are written before the service
// value that flags them, changed by difference, taken away after the flag
// goes, deleted with the frontend; Snapshot and Adopt carry them (a
// restarted agent neither duplicates nor orphans them).
func TestSourceRangeTables(t *testing.T) {
	build := func(ranges string) *Model {
		return tpService(t, "LoadBalancer", ranges, "  loadBalancer: {ingress: [{ip: 192.0.2.10}]}", "10.244.1.5")
	}
	key := FrontendKey{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: TCP, Scope: ScopeNodePort}
	tb := NewTables()
	m1 := build("  loadBalancerSourceRanges: [198.51.100.0/24, 203.0.113.0/24]")
	u := tb.Apply(Diff(nil, m1))
	id, _ := tb.FrontendID(key)
	if v := u.Services[ServiceKeyOf(key)]; v.Flags&ServiceFlagSrcRange == 0 {
		t.Fatalf("service value flags %#x, want ServiceFlagSrcRange", v.Flags)
	}
	want := []SrcRangeKey{SrcRangeKeyOf(id, netip.MustParsePrefix("198.51.100.0/24")), SrcRangeKeyOf(id, netip.MustParsePrefix("203.0.113.0/24"))}
	if !slices.Equal(u.SrcRanges, want) || len(u.SrcRangeDeletes) != 0 {
		t.Fatalf("first apply: ranges +%v -%v, want +%v", u.SrcRanges, u.SrcRangeDeletes, want)
	}
	if v := u.Services[ServiceKeyOf(FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: TCP})]; v.Flags&ServiceFlagSrcRange != 0 {
		t.Fatal("the ClusterIP is flagged")
	}
	snap := tb.Snapshot()
	if !slices.Equal(snap.SrcRanges, want) {
		t.Fatalf("snapshot ranges %v", snap.SrcRanges)
	}
	// A restarted agent adopts them; an entry of a gone frontend is repaired away.
	dump := tb.Snapshot()
	orphan := SrcRangeKeyOf(9999, netip.MustParsePrefix("10.0.0.0/8"))
	dump.SrcRanges = append(dump.SrcRanges, orphan)
	tb2 := NewTables()
	_, repair := tb2.Adopt(dump)
	if !slices.Equal(repair.SrcRangeDeletes, []SrcRangeKey{orphan}) {
		t.Fatalf("repair deletes %v, want the orphan", repair.SrcRangeDeletes)
	}
	if u := tb2.Apply(Diff(nil, m1)); len(u.SrcRanges)+len(u.SrcRangeDeletes) != 0 {
		t.Fatalf("re-applying the same model after adoption: ranges +%v -%v", u.SrcRanges, u.SrcRangeDeletes)
	}
	// A change: one range goes, one comes.
	m2 := build("  loadBalancerSourceRanges: [203.0.113.0/24, \"192.0.2.128/25\"]")
	u = tb2.Apply(Diff(m1, m2))
	if !slices.Equal(u.SrcRanges, []SrcRangeKey{SrcRangeKeyOf(id, netip.MustParsePrefix("192.0.2.128/25"))}) ||
		!slices.Equal(u.SrcRangeDeletes, []SrcRangeKey{SrcRangeKeyOf(id, netip.MustParsePrefix("198.51.100.0/24"))}) {
		t.Fatalf("change: ranges +%v -%v", u.SrcRanges, u.SrcRangeDeletes)
	}
	// None: the flag goes, the entries are deleted.
	m3 := build("")
	u = tb2.Apply(Diff(m2, m3))
	if v := u.Services[ServiceKeyOf(key)]; v.Flags&ServiceFlagSrcRange != 0 || len(u.SrcRangeDeletes) != 2 || len(u.SrcRanges) != 0 {
		t.Fatalf("ranges removed: flags %#x, ranges +%v -%v", v.Flags, u.SrcRanges, u.SrcRangeDeletes)
	}
	// Deleted with the frontend.
	m4 := build("  loadBalancerSourceRanges: [198.51.100.0/24]")
	tb2.Apply(Diff(m3, m4))
	u = tb2.Apply(Diff(m4, NewModel(tpOpts)))
	if !slices.Equal(u.SrcRangeDeletes, []SrcRangeKey{SrcRangeKeyOf(id, netip.MustParsePrefix("198.51.100.0/24"))}) {
		t.Fatalf("service deleted: range deletes %v", u.SrcRangeDeletes)
	}
}

// TestSrcRangeKey: keys of both families round-trip; keys no frontend
// could have are refused.
func TestSrcRangeKey(t *testing.T) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.7/32", "0.0.0.0/0", "2001:db8::/32", "::/0", "2001:db8::1/128"} {
		p := netip.MustParsePrefix(s)
		k := SrcRangeKeyOf(7, p)
		if got, ok := k.Prefix(); !ok || got != p || k.FrontendID != 7 {
			t.Errorf("%s: key %+v back to %v %v", s, k, got, ok)
		}
	}
	if k := SrcRangeKeyOf(1, netip.MustParsePrefix("10.0.0.0/8")); k.Prefixlen != 32+96+8 || k.Addr[10] != 0xff || k.Addr[12] != 10 {
		t.Errorf("IPv4 key %+v: want IPv4-mapped, prefixlen 136", k)
	}
	for _, k := range []SrcRangeKey{{Prefixlen: 31}, {Prefixlen: 161}, {Prefixlen: 32 + 96 + 8, Addr: netip.MustParseAddr("::ffff:10.1.2.3").As16()}} {
		if p, ok := k.Prefix(); ok {
			t.Errorf("key %+v accepted as %v", k, p)
		}
	}
}
