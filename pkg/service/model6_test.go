package service

import (
	"net/netip"
	"slices"
	"testing"
)

// TestTranslateDualStack: a dual-stack Service gets a ClusterIP frontend per
// cluster IP, each with the endpoints of its family (IPv4 and IPv6
// EndpointSlices), and NodePort and external-address frontends per family:
// on the node's addresses and the external IPs of that family. Tables put
// the IPv6 frontends' entries in the *6 maps, and a snapshot adopted by
// fresh tables needs no writes.
func TestTranslateDualStack(t *testing.T) {
	svcs, eps := decode(t, `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  externalIPs: [192.0.2.7, "2001:db8::7"]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.5], conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:10:244:1::5"], conditions: {ready: true}}, {addresses: ["fd00:10:244:2::5"], conditions: {ready: true}}]
`)
	opts := Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("fd00:77::1")}}
	fs, err := Translate(svcs[0], eps, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range fs {
		for _, b := range f.Backends {
			if b.Addr.Is4() != f.Key.Addr.Is4() {
				t.Errorf("frontend %s has backend %s of the other family", f.Key, b.Addr)
			}
		}
		got[f.Key.String()] = len(f.Backends)
	}
	want := map[string]int{}
	for _, f := range []struct {
		k FrontendKey
		n int
	}{
		{FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: TCP, Scope: ScopeClusterIP}, 1},
		{FrontendKey{Addr: netip.MustParseAddr("fd00:96::10"), Port: 80, Proto: TCP, Scope: ScopeClusterIP}, 2},
		{FrontendKey{Addr: netip.MustParseAddr("10.77.0.1"), Port: 30080, Proto: TCP, Scope: ScopeNodePort}, 1},
		{FrontendKey{Addr: netip.MustParseAddr("fd00:77::1"), Port: 30080, Proto: TCP, Scope: ScopeNodePort}, 2},
		{FrontendKey{Addr: netip.MustParseAddr("192.0.2.7"), Port: 80, Proto: TCP, Scope: ScopeNodePort}, 1},
		{FrontendKey{Addr: netip.MustParseAddr("2001:db8::7"), Port: 80, Proto: TCP, Scope: ScopeNodePort}, 2},
	} {
		want[f.k.String()] = f.n
	}
	if len(got) != len(want) {
		t.Fatalf("frontends %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("frontend %s: %d backends, want %d (all: %v)", k, got[k], n, got)
		}
	}
	for _, f := range fs {
		if ext := f.Key.Port == 80 && f.Key.Scope == ScopeNodePort; f.External != ext {
			t.Errorf("frontend %s: External %v, want %v", f.Key, f.External, ext)
		}
	}
	m := NewModel(opts)
	if _, err := m.Set(svcs[0], eps); err != nil {
		t.Fatal(err)
	}
	tb := NewTables()
	u := tb.Apply(Diff(nil, m))
	if len(u.Services) != 3 || len(u.Services6) != 3 || len(u.Backends) != 3 || len(u.Backends6) != 6 ||
		len(u.RevNat) != 3 || len(u.RevNat6) != 3 || len(u.Maglev) != 6 {
		t.Fatalf("update %s: want 3+3 services, 3+6 backends, 3+3 rev-NAT, 6 Maglev tables", u)
	}
	k6 := ServiceKey6Of(FrontendKey{Addr: netip.MustParseAddr("fd00:96::10"), Port: 80, Proto: TCP, Scope: ScopeClusterIP})
	id := u.Services6[k6].FrontendID
	if rn := u.RevNat6[RevNatKey{id}]; netip.AddrFrom16(rn.Addr) != netip.MustParseAddr("fd00:96::10") || rn.Port != 80 {
		t.Errorf("IPv6 rev-NAT entry %+v", rn)
	}
	for _, b := range u.Maglev[id].Table() {
		if _, ok := u.Backends6[BackendKey{b}]; !ok {
			t.Fatalf("the IPv6 frontend's Maglev table names backend %d, no IPv6 backend", b)
		}
	}
	fresh := NewTables()
	if _, repair := fresh.Adopt(tb.Snapshot()); repair.Ops() != 0 {
		t.Errorf("adopting a snapshot needs repairs: %s", repair)
	}
	if u := fresh.Apply(Diff(nil, m)); u.Ops() != 0 {
		t.Errorf("after adoption the same model writes %s", u)
	}
	// Removing the Service deletes the IPv6 entries too.
	u = fresh.Apply(m.Delete(ServiceID{svcs[0].Namespace, svcs[0].Name}))
	if len(u.ServiceDeletes) != 3 || len(u.ServiceDeletes6) != 3 || len(u.BackendDeletes) != 9 || len(u.RevNatDeletes) != 6 {
		t.Errorf("deleting the Service: %s (service deletes %d+%d), want 3+3 services, 9 backends, 6 rev-NAT entries",
			u, len(u.ServiceDeletes), len(u.ServiceDeletes6))
	}
}

// sameFamily shares a single-stack Service's backends with its frontends
// (no copy per frontend) and filters a dual-stack one's by family, leaving
// the whole list as it was.
func TestSameFamilySharesSingleStack(t *testing.T) {
	b := func(s string) Backend { return Backend{Addr: netip.MustParseAddr(s), Port: 8080, State: BackendActive} }
	v4, v6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")
	single := []Backend{b("10.244.1.5"), b("10.244.2.5")}
	if got := sameFamily(single, v4); len(got) != 2 || &got[0] != &single[0] {
		t.Errorf("single-stack: got %v, not the backends themselves", got)
	}
	if n := testing.AllocsPerRun(10, func() { sameFamily(single, v4) }); n != 0 {
		t.Errorf("single-stack: %v allocations, want none", n)
	}
	dual := []Backend{b("10.244.1.5"), b("fd00:244:1::5"), b("10.244.2.5"), b("fd00:244:2::5")}
	want := map[netip.Addr][]Backend{v4: {dual[0], dual[2]}, v6: {dual[1], dual[3]}}
	for _, vip := range []netip.Addr{v4, v6} {
		got := sameFamily(dual, vip)
		if !slices.Equal(got, want[vip]) {
			t.Errorf("dual-stack, %s: got %v, want %v", vip, got, want[vip])
		}
	}
	if dual[1] != b("fd00:244:1::5") || len(dual) != 4 {
		t.Errorf("dual-stack: the backends were changed: %v", dual)
	}
	if got := sameFamily(single, v6); len(got) != 0 {
		t.Errorf("IPv4 backends for an IPv6 cluster IP: %v", got)
	}
}
