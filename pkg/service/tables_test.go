package service

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// genService builds a kube-proxy-shaped Service (one TCP port, named target
// port) and one slice with the given backend states.
func genService(i int, states []BackendState, nodePort bool) (*k8sobj.Service, *k8sobj.EndpointSlice) {
	ns, name := fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i)
	s := k8sobj.SlimService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(),
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")}},
		},
	})
	if nodePort {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(30000 + i%2000)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j, st := range states {
		addr := netip.AddrFrom4([4]byte{10, byte(200 + j), byte(i >> 8), byte(i)}).String()
		c := discoveryv1.EndpointConditions{Ready: ptr.To(st == BackendActive)}
		if st == BackendTerminating {
			c.Serving, c.Terminating = ptr.To(true), ptr.To(true)
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: c})
	}
	return s, k8sobj.SlimEndpointSlice(es)
}

func active(n int) []BackendState { return make([]BackendState, n) }

// fakeMaps applies Updates in the documented order and checks that no lookup
// could see a dangling ID at the end of each phase.
type fakeMaps struct {
	svc    map[ServiceKey]ServiceValue
	back   map[BackendKey]BackendValue
	maglev map[uint32][]uint32
	revnat map[RevNatKey]RevNatValue
}

func newFakeMaps() *fakeMaps {
	return &fakeMaps{svc: map[ServiceKey]ServiceValue{}, back: map[BackendKey]BackendValue{},
		maglev: map[uint32][]uint32{}, revnat: map[RevNatKey]RevNatValue{}}
}

func (f *fakeMaps) apply(t *testing.T, u *Update) {
	t.Helper()
	maps.Copy(f.back, u.Backends)
	for id, t := range u.Maglev {
		f.maglev[id] = t.Table()
	}
	maps.Copy(f.revnat, u.RevNat)
	maps.Copy(f.svc, u.Services)
	f.check(t, "after upserts")
	for _, k := range u.ServiceDeletes {
		delete(f.svc, k)
	}
	for _, k := range u.RevNatDeletes {
		delete(f.revnat, k)
	}
	for _, k := range u.MaglevDeletes {
		delete(f.maglev, k)
	}
	for _, k := range u.BackendDeletes {
		if _, ok := f.back[k]; !ok {
			t.Fatalf("delete of absent backend %d", k.ID)
		}
		delete(f.back, k)
	}
	f.check(t, "after deletes")
}

// check: every service's Maglev table exists with the announced size and
// references existing backends of that frontend.
func (f *fakeMaps) check(t *testing.T, when string) {
	t.Helper()
	for k, v := range f.svc {
		if v.MaglevSize == 0 {
			continue
		}
		tab := f.maglev[v.FrontendID]
		if uint32(len(tab)) != v.MaglevSize {
			t.Fatalf("%s: %v: maglev size %d, announced %d", when, k, len(tab), v.MaglevSize)
		}
		for _, id := range tab {
			b, ok := f.back[BackendKey{id}]
			if !ok || b.FrontendID != v.FrontendID {
				t.Fatalf("%s: %v: maglev refers to backend %d (%+v, present %v)", when, k, id, b, ok)
			}
		}
		if _, ok := f.revnat[RevNatKey{v.FrontendID}]; !ok {
			t.Fatalf("%s: %v: no rev-nat entry", when, k)
		}
	}
}

// resolved is the datapath's view by address: frontend → backend per slot.
func (f *fakeMaps) resolved() map[ServiceKey][]netip.AddrPort {
	out := map[ServiceKey][]netip.AddrPort{}
	for k, v := range f.svc {
		var tab []netip.AddrPort
		for _, id := range f.maglev[v.FrontendID] {
			b := f.back[BackendKey{id}]
			tab = append(tab, netip.AddrPortFrom(netip.AddrFrom4(b.Addr), b.Port))
		}
		out[k] = tab
	}
	return out
}

func modelView(m *Model) map[ServiceKey][]netip.AddrPort {
	out := map[ServiceKey][]netip.AddrPort{}
	for _, f := range m.Frontends() {
		var tab []netip.AddrPort
		for _, bi := range f.Maglev.Slots() {
			b := f.Backends[bi]
			tab = append(tab, netip.AddrPortFrom(b.Addr, b.Port))
		}
		out[ServiceKeyOf(f.Key)] = tab
	}
	return out
}

func equalViews(a, b map[ServiceKey][]netip.AddrPort) bool {
	return maps.EqualFunc(a, b, func(x, y []netip.AddrPort) bool { return slices.Equal(x, y) })
}

func TestTablesIncremental(t *testing.T) {
	opts := Options{NodeAddrs: []netip.Addr{node}}
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range 20 {
		s, e := genService(i, active(6), i%2 == 0)
		svcs, eps = append(svcs, s), append(eps, e)
	}
	m, err := Build(svcs, eps, opts)
	if err != nil {
		t.Fatal(err)
	}
	tab := NewTables()
	fm := newFakeMaps()
	u := tab.Apply(Diff(nil, m))
	if len(u.Services) != 30 || len(u.RevNat) != 30 || len(u.Maglev) != 30 || len(u.Backends) != 180 {
		t.Fatalf("initial update: %s", u)
	}
	fm.apply(t, u)
	if !equalViews(fm.resolved(), modelView(m)) {
		t.Fatal("datapath view differs from model after initial sync")
	}

	// Re-translating an unchanged service is free.
	m2, err := m.With(svcs[3], []*k8sobj.EndpointSlice{eps[3]})
	if err != nil {
		t.Fatal(err)
	}
	if c := Diff(m, m2); !c.Empty() {
		t.Fatalf("unchanged service produced changes: %+v", c)
	}

	// Remove one backend of service 4 (ClusterIP + NodePort; 6 → 5 backends,
	// same table size): only its entries change.
	s4, e4 := genService(4, active(6), true)
	e4.Endpoints = slices.Delete(e4.Endpoints, 2, 3)
	idsBefore := backendIDs(tab, m.Frontend(FrontendKey{Addr: netip.MustParseAddr(s4.Spec.ClusterIP), Port: 80, Proto: TCP}))
	m3, err := m2.With(s4, []*k8sobj.EndpointSlice{e4})
	if err != nil {
		t.Fatal(err)
	}
	c := Diff(m2, m3)
	if len(c.Upserted) != 2 || len(c.Removed) != 0 {
		t.Fatalf("changes: %d upserted %d removed, want 2 0", len(c.Upserted), len(c.Removed))
	}
	before := fm.resolved()[ServiceKeyOf(c.Upserted[0].Key)]
	u = tab.Apply(c)
	if len(u.BackendDeletes) != 2 || len(u.Maglev) != 2 || len(u.Services) != 0 || len(u.Backends) != 0 || len(u.RevNat) != 0 {
		t.Fatalf("one backend removed from a service with 2 frontends: %s", u)
	}
	fm.apply(t, u)
	if !equalViews(fm.resolved(), modelView(m3)) {
		t.Fatal("datapath view differs from model after removing a backend")
	}
	after := fm.resolved()[ServiceKeyOf(c.Upserted[0].Key)]
	gone := netip.AddrPortFrom(netip.MustParseAddr("10.202.0.4"), 8080)
	moved := 0
	for i := range before {
		if before[i] != gone && before[i] != after[i] {
			moved++
		}
		if after[i] == gone {
			t.Fatal("removed backend still in the table")
		}
	}
	if moved > len(before)*3/100 {
		t.Errorf("%d of %d slots of other backends moved (> 3%%)", moved, len(before))
	}
	idsAfter := backendIDs(tab, m3.Frontend(FrontendKey{Addr: netip.MustParseAddr(s4.Spec.ClusterIP), Port: 80, Proto: TCP}))
	for a, id := range idsAfter {
		if idsBefore[a] != id {
			t.Errorf("backend %s changed ID %d → %d (conntrack entries would break)", a, idsBefore[a], id)
		}
	}

	// A backend starts terminating: its state changes in place, it leaves the table.
	states := active(6)
	states[1] = BackendTerminating
	s4, e4 = genService(4, states, true)
	e4.Endpoints = slices.Delete(e4.Endpoints, 2, 3)
	m4, err := m3.With(s4, []*k8sobj.EndpointSlice{e4})
	if err != nil {
		t.Fatal(err)
	}
	u = tab.Apply(Diff(m3, m4))
	if len(u.Backends) != 2 || len(u.BackendDeletes) != 0 || len(u.Maglev) != 2 {
		t.Fatalf("one backend terminating: %s", u)
	}
	for _, v := range u.Backends {
		if BackendState(v.State) != BackendTerminating {
			t.Fatalf("updated backend state %d", v.State)
		}
	}
	fm.apply(t, u)

	// Delete a service: all of its entries go, nothing else.
	m5 := m4.Without(ServiceID{"ns4", "svc4"})
	u = tab.Apply(Diff(m4, m5))
	if len(u.ServiceDeletes) != 2 || len(u.RevNatDeletes) != 2 || len(u.MaglevDeletes) != 2 || len(u.BackendDeletes) != 10 || len(u.Services)+len(u.Backends) != 0 {
		t.Fatalf("service delete: %s", u)
	}
	fm.apply(t, u)
	if !equalViews(fm.resolved(), modelView(m5)) {
		t.Fatal("datapath view differs from model after delete")
	}
	snap := tab.Snapshot()
	if !maps.Equal(snap.Services, fm.svc) || !maps.Equal(snap.Backends, fm.back) || !maps.Equal(snap.RevNat, fm.revnat) {
		t.Fatal("snapshot differs from the maps built by updates")
	}
}

func backendIDs(t *Tables, f *Frontend) map[netip.AddrPort]uint32 {
	p := t.fronts[f.Key]
	out := map[netip.AddrPort]uint32{}
	for _, b := range p.backends {
		out[b.ap] = b.id
	}
	return out
}

// TestTablesRandomized: after any sequence of changes the maps built from the
// incremental updates resolve exactly like the model, and match Snapshot.
func TestTablesRandomized(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	opts := Options{NodeAddrs: []netip.Addr{node}}
	m := NewModel(opts)
	tab := NewTables()
	fm := newFakeMaps()
	for step := range 300 {
		i := rng.IntN(15)
		var next *Model
		if rng.IntN(5) == 0 {
			next = m.Without(ServiceID{fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i)})
		} else {
			states := make([]BackendState, rng.IntN(7))
			for j := range states {
				states[j] = BackendState(rng.IntN(3))
			}
			s, e := genService(i, states, rng.IntN(2) == 0)
			var err error
			if next, err = m.With(s, []*k8sobj.EndpointSlice{e}); err != nil {
				t.Fatal(err)
			}
		}
		fm.apply(t, tab.Apply(Diff(m, next)))
		m = next
		if !equalViews(fm.resolved(), modelView(m)) {
			t.Fatalf("step %d: datapath view differs from model", step)
		}
		snap := tab.Snapshot()
		if !maps.Equal(snap.Services, fm.svc) || !maps.Equal(snap.Backends, fm.back) {
			t.Fatalf("step %d: snapshot differs from maps", step)
		}
	}
}

func genMany(n, backends int) ([]*k8sobj.Service, []*k8sobj.EndpointSlice) {
	svcs := make([]*k8sobj.Service, n)
	eps := make([]*k8sobj.EndpointSlice, n)
	for i := range n {
		svcs[i], eps[i] = genService(i, active(backends), false)
	}
	return svcs, eps
}

// BenchmarkProgramAll: translate 10,000 services × 5 backends and compute the
// full map contents (what `lanekit service apply` of such a file costs before
// the map writes). Issue target for the whole programming path: ≤ 1 s.
func BenchmarkProgramAll10k(b *testing.B) {
	svcs, eps := genMany(10000, 5)
	b.ResetTimer()
	for b.Loop() {
		m, err := Build(svcs, eps, Options{})
		if err != nil {
			b.Fatal(err)
		}
		u := NewTables().Apply(Diff(nil, m))
		if len(u.Services) != 10000 {
			b.Fatal(len(u.Services))
		}
	}
}

// BenchmarkOneChange10k: one backend of one service out of 10,000 changes:
// re-translate it, diff the models, compute the map delta. Target ≤ 10 ms for
// the whole change.
func BenchmarkOneChange10k(b *testing.B) {
	svcs, eps := genMany(10000, 5)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		b.Fatal(err)
	}
	tab := NewTables()
	tab.Apply(Diff(nil, m))
	alt := eps[777].DeepCopy()
	alt.Endpoints = alt.Endpoints[:4]
	variants := []*k8sobj.EndpointSlice{alt, eps[777]}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		c, err := m.Set(svcs[777], variants[i%2:i%2+1])
		if err != nil {
			b.Fatal(err)
		}
		if u := tab.Apply(c); u.Ops() == 0 {
			b.Fatal("no change")
		}
		i++
	}
}

// TestSetMatchesDiff: the in-place path (Set/Delete) yields the same map
// updates as diffing immutable snapshots.
func TestSetMatchesDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	opts := Options{NodeAddrs: []netip.Addr{node}}
	snap, inplace := NewModel(opts), NewModel(opts)
	t1, t2 := NewTables(), NewTables()
	f1, f2 := newFakeMaps(), newFakeMaps()
	for step := range 200 {
		i := rng.IntN(10)
		var next *Model
		var c Changes
		if rng.IntN(5) == 0 {
			id := ServiceID{fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i)}
			next, c = snap.Without(id), inplace.Delete(id)
		} else {
			states := make([]BackendState, rng.IntN(5))
			for j := range states {
				states[j] = BackendState(rng.IntN(3))
			}
			s, e := genService(i, states, rng.IntN(2) == 0)
			var err error
			if next, err = snap.With(s, []*k8sobj.EndpointSlice{e}); err != nil {
				t.Fatal(err)
			}
			if c, err = inplace.Set(s, []*k8sobj.EndpointSlice{e}); err != nil {
				t.Fatal(err)
			}
		}
		u1, u2 := t1.Apply(Diff(snap, next)), t2.Apply(c)
		if u1.String() != u2.String() {
			t.Fatalf("step %d: diff path %s, in-place path %s", step, u1, u2)
		}
		f1.apply(t, u1)
		f2.apply(t, u2)
		snap = next
		if !equalViews(f2.resolved(), modelView(inplace)) || !equalViews(f1.resolved(), f2.resolved()) {
			t.Fatalf("step %d: views differ", step)
		}
	}
}

// maglevIDsOf is tables as an update carries them.
func maglevIDsOf(tables map[uint32][]uint32) map[uint32]MaglevIDs {
	out := make(map[uint32]MaglevIDs, len(tables))
	for id, t := range tables {
		out[id] = MaglevIDsOf(t)
	}
	return out
}
