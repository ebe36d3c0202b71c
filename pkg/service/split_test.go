package service

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// An update's parts by frontend hold each of its entries once, and the
// parts applied one by one in any order leave the maps as the whole update
// does: through additions, backend changes and removals, with NodePorts.
func TestUpdatePartsByFrontend(t *testing.T) {
	opts := Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	tables := NewTables()
	whole, parts := newFakeMaps(), newFakeMaps()
	var old *Model
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 6 {
		m := NewModel(opts)
		for i := range 40 {
			if (i+step)%7 == 0 { // removed in this step
				continue
			}
			s, es := genService(i, active(1+(i*step)%4), i%3 == 0)
			if _, err := m.Set(s, oneSlice(es)); err != nil {
				t.Fatal(err)
			}
		}
		u := tables.Apply(Diff(old, m))
		old = m
		ids, ok := u.Frontends()
		if !ok || len(ids) == 0 {
			t.Fatalf("step %d: frontends %v, %v", step, ids, ok)
		}
		ops := 0
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for _, id := range ids {
			p := u.Part(func(x uint32) bool { return x == id })
			if p == nil {
				t.Fatalf("step %d: frontend %d has no part", step, id)
			}
			if got, _ := p.Frontends(); !slices.Equal(got, []uint32{id}) {
				t.Fatalf("step %d: frontend %d's part holds frontends %v", step, id, got)
			}
			ops += p.Ops()
			parts.apply(t, p)
		}
		if ops != u.Ops() {
			t.Errorf("step %d: the parts hold %d operations, the update %d", step, ops, u.Ops())
		}
		whole.apply(t, u)
		if !equalViews(whole.resolved(), parts.resolved()) || !equalViews(whole.resolved(), modelView(m)) {
			t.Fatalf("step %d: the parts applied one by one differ from the update", step)
		}
	}
	// Adopt's repair names entries no frontend owns: not split.
	if _, repair := NewTables().Adopt(&Update{Backends: map[BackendKey]BackendValue{{ID: 9}: {FrontendID: 77}}}); repair.Ops() == 0 {
		t.Fatal("no repair")
	} else if _, ok := repair.Frontends(); ok {
		t.Error("a repair of orphans claims to know its frontends")
	}
}

// A Service deleted and created again at the same address is two frontends
// with one service key: when the deletion's part is held (refused), the new
// frontend's part waits behind it — applied first, the held deletion would
// remove the new service entry; other frontends do not wait.
func TestHeldServiceKeyOrders(t *testing.T) {
	tables := NewTables()
	build := func(ids ...int) *Model {
		m := NewModel(Options{})
		for _, i := range ids {
			s, es := genService(i, active(2), false)
			if _, err := m.Set(s, oneSlice(es)); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	m1 := build(1, 2)
	tables.Apply(Diff(nil, m1))
	m2 := build(2)
	remove1 := tables.Apply(Diff(m1, m2)) // frontend of svc1 removed
	m3 := build(1, 2, 3)                  // svc1 again: a new frontend ID, the same key
	s2, es2 := genService(2, active(3), false)
	if _, err := m3.Set(s2, oneSlice(es2)); err != nil {
		t.Fatal(err)
	}
	readd := tables.Apply(Diff(m2, m3))
	var h Held
	if !h.Empty() {
		t.Fatal("new Held not empty")
	}
	h.Add(remove1)
	wait, free := h.Split(readd)
	if wait == nil || free == nil {
		t.Fatalf("split: wait %v, free %v; want both", wait, free)
	}
	key1 := ServiceKeyOf(frontendKeyOf(t, m3, 1))
	if _, ok := wait.Services[key1]; !ok || len(wait.Services) != 1 {
		t.Errorf("waiting: %v, want svc1's new entry only", wait.Services)
	}
	if _, ok := free.Services[key1]; ok || len(free.Services) != 2 {
		t.Errorf("free: %v, want svc2's (a larger table) and svc3's entries", free.Services)
	}
	// Nothing held: all free, as is.
	var none Held
	if w, f := none.Split(readd); w != nil || f != readd {
		t.Error("an empty Held holds something back")
	}
	// A repair (frontends unknown) held: everything after it waits.
	_, repair := NewTables().Adopt(&Update{Backends: map[BackendKey]BackendValue{{ID: 9}: {FrontendID: 77}}})
	var all Held
	all.Add(repair)
	if w, f := all.Split(readd); w != readd || f != nil {
		t.Error("behind an update of unknown frontends, a later one did not wait whole")
	}
}

func frontendKeyOf(t *testing.T, m *Model, i int) FrontendKey {
	t.Helper()
	s, _ := genService(i, nil, false)
	for _, f := range m.Frontends() {
		if f.Service.Name == s.Name && f.Service.Namespace == s.Namespace {
			return f.Key
		}
	}
	t.Fatalf("svc%d has no frontend", i)
	return FrontendKey{}
}

func oneSlice(es *k8sobj.EndpointSlice) []*k8sobj.EndpointSlice {
	return []*k8sobj.EndpointSlice{es}
}
