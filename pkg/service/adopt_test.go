package service

import (
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestAdoptKeepsIDs(t *testing.T) {
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range 6 {
		s, es := genService(i, active(3), i%2 == 0)
		svcs = append(svcs, s)
		eps = append(eps, es)
	}
	opts := Options{NodeAddrs: nil}
	m, err := Build(svcs, eps, opts)
	if err != nil {
		t.Fatal(err)
	}
	old := NewTables()
	dp := newFakeMaps()
	dp.apply(t, old.Apply(Diff(nil, m)))
	// An orphan backend and rev-NAT entry, and a frontend the new model drops.
	dp.back[BackendKey{9999}] = BackendValue{FrontendID: 4242}
	dp.revnat[RevNatKey{4242}] = RevNatValue{}
	dump := &Update{Services: dp.svc, Backends: dp.back, Maglev: maglevIDsOf(dp.maglev), RevNat: dp.revnat}

	// Restart: the model lost service 0 and service 1 gained a backend.
	m2 := m.Without(ServiceID{svcs[0].Namespace, svcs[0].Name})
	s1, es1 := genService(1, active(4), false)
	if m2, err = m2.With(s1, []*k8sobj.EndpointSlice{es1}); err != nil {
		t.Fatal(err)
	}
	tb := NewTables()
	adopted, repair := tb.Adopt(dump)
	if len(adopted) != len(m.Frontends()) {
		t.Fatalf("adopted %d frontends, want %d", len(adopted), len(m.Frontends()))
	}
	// The capacity counts what was adopted (a restarted agent's fill).
	if f := old.Fill(); tb.Fill()[0] != f[0] || tb.Fill()[2] != f[2] || f[0].Entries != len(m.Frontends()) {
		t.Errorf("adopted fill %+v, want %+v", tb.Fill(), f)
	}
	if len(repair.BackendDeletes) != 1 || repair.BackendDeletes[0].ID != 9999 || len(repair.RevNatDeletes) != 1 {
		t.Fatalf("repair = %v", repair)
	}
	dp.apply(t, repair)
	var gone []FrontendKey
	for _, k := range adopted {
		if m2.Frontend(k) == nil {
			gone = append(gone, k)
		}
	}
	c := Diff(nil, m2)
	c.Removed = gone
	u := tb.Apply(c)
	dp.apply(t, u)
	if !equalViews(dp.resolved(), modelView(m2)) {
		t.Fatal("datapath does not match the model after adoption")
	}
	// Unchanged frontends keep their IDs and cost no map writes; only
	// service 1 (new backend) and the removed service 0 show up.
	for _, f := range m2.Frontends() {
		oldID, _ := old.FrontendID(f.Key)
		newID, _ := tb.FrontendID(f.Key)
		if oldID != newID {
			t.Errorf("%v: frontend ID %d after adoption, was %d", f.Key, newID, oldID)
		}
		if f.Service.Name != "svc1" {
			if _, written := u.Services[ServiceKeyOf(f.Key)]; written {
				t.Errorf("%v rewritten though unchanged", f.Key)
			}
		}
	}
	if len(u.Backends) != 1 || len(u.ServiceDeletes) != len(gone) || len(gone) == 0 {
		t.Errorf("update after adoption = %v (gone %d)", u, len(gone))
	}
	// A second pass is a no-op.
	if u := tb.Apply(Diff(m2, m2)); u.Ops() != 0 {
		t.Errorf("second apply: %v", u)
	}
}
