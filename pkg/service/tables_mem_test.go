package service

import (
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// TestTablesHoldNoCopyOfMaglevTables: what the tables keep per programmed
// frontend (4 backends: a 401-slot Maglev table) is measured on the heap.
// The tables keep the programmed table as backend indexes, a byte per slot,
// not as backend IDs, 4 bytes per slot (1.6 KB per frontend; at 30,000
// Services as much as the model's tables themselves), and derive each
// backend's map value instead of keeping it for both families (72 bytes a
// backend, 40 now: 128 B more per 4-backend frontend). The bound is above
// what they keep (IDs, backends, service values) and below either.
func TestTablesHoldNoCopyOfMaglevTables(t *testing.T) {
	const n = 2000
	svcs, eps := genServices(n)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ch := Diff(nil, m)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tables := NewTables()
	u := tables.Apply(ch)
	if len(u.Maglev) != n {
		t.Fatalf("%d Maglev tables programmed, want %d", len(u.Maglev), n)
	}
	u = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("the tables hold %d B per frontend (Maglev table of %d slots)", per, MaglevSize(4))
	// The tables share the frontends' packed tables (a byte per slot): a
	// copy of each, even packed, adds ~400 B; both families' backend
	// values kept, 128 B.
	const maxPerFrontend = 560
	if per > maxPerFrontend {
		t.Errorf("the tables hold %d B per frontend, want <= %d: a copy of each Maglev table (%d B packed), or each backend's map values kept?", per, maxPerFrontend, MaglevSize(4))
	}
	if got := tables.Snapshot(); len(got.Maglev) != n {
		t.Errorf("snapshot has %d Maglev tables, want %d", len(got.Maglev), n)
	}
	runtime.KeepAlive(tables)
	runtime.KeepAlive(m)
}

// TestModelMaglevTablesPacked: the model keeps each frontend's Maglev table
// a byte per slot (up to 256 backends; 4 bytes per slot as []int32 were
// 48 MB of the agent's heap at 30,000 Services), and a table of more than
// 256 backends whole.
func TestModelMaglevTablesPacked(t *testing.T) {
	const n = 2000
	svcs, eps := genServices(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("the model holds %d B per frontend (Maglev table of %d slots)", per, MaglevSize(4))
	if maxPerFrontend := int64(MaglevSize(4)) + 900; per > maxPerFrontend {
		t.Errorf("the model holds %d B per frontend, want <= %d: Maglev tables not packed (%d B as int32)?", per, maxPerFrontend, 4*MaglevSize(4))
	}
	runtime.KeepAlive(m)
	runtime.KeepAlive(svcs)
	runtime.KeepAlive(eps)

	big, es := genService(1, active(300), false)
	es.Endpoints = es.Endpoints[:0]
	for j := range 300 {
		es.Endpoints = append(es.Endpoints, k8sobj.Endpoint{Addresses: []string{netip.AddrFrom4([4]byte{10, 201, byte(j >> 8), byte(j)}).String()}})
	}
	fes, err := Translate(big, []*k8sobj.EndpointSlice{es}, Options{})
	if err != nil || len(fes) != 1 {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for _, bi := range fes[0].Maglev.Slots() {
		seen[bi] = true
	}
	if len(seen) != 300 {
		t.Errorf("a table over 300 backends names %d of them", len(seen))
	}
}

// TestAdoptedMaglevTablesKept: a restarted agent's tables adopt the pinned
// Maglev tables; programming the same model again writes none of them and
// keeps them (Snapshot) in the packed form.
func TestAdoptedMaglevTablesKept(t *testing.T) {
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range 20 {
		s, es := genService(i, active(1+i%6), false)
		svcs, eps = append(svcs, s), append(eps, es)
	}
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	first := NewTables()
	first.Apply(Diff(nil, m))
	pinned := first.Snapshot()
	restarted := NewTables()
	restarted.Adopt(pinned)
	if u := restarted.Apply(Diff(nil, m)); len(u.Maglev) != 0 || len(u.MaglevDeletes) != 0 {
		t.Errorf("the same model after adoption wrote %d Maglev tables and deleted %d, want none", len(u.Maglev), len(u.MaglevDeletes))
	}
	got := restarted.Snapshot()
	if len(got.Maglev) != len(pinned.Maglev) {
		t.Fatalf("%d Maglev tables after adoption, want %d", len(got.Maglev), len(pinned.Maglev))
	}
	for id, table := range pinned.Maglev {
		if !slices.Equal(got.Maglev[id].Table(), table.Table()) {
			t.Errorf("frontend %d: Maglev table changed across the adoption", id)
		}
	}
}

// TestUpdateHoldsMaglevTablesPacked: an update programming every frontend
// (the first full set) holds each Maglev table as the frontend's backend
// indexes over its backend IDs, not expanded to 4-byte IDs (1.6 KB per
// 4-backend frontend; 61 MB at 30,000 Services, the largest part of the
// initial sync's peak); the datapath expands one table at a time as it
// writes it (Table), to the same IDs.
func TestUpdateHoldsMaglevTablesPacked(t *testing.T) {
	const n = 2000
	svcs, eps := genServices(n)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ch := Diff(nil, m)
	tables := NewTables()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	u := tables.Apply(ch)
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("the tables and the update hold %d B per frontend (Maglev table of %d slots)", per, MaglevSize(4))
	if max := int64(1800); per > max { // packed ~1,100; each table expanded to 4-byte IDs adds 1.6 KB
		t.Errorf("the tables and the update hold %d B per frontend, want <= %d: the update's Maglev tables expanded?", per, max)
	}
	for id, mt := range u.Maglev {
		table := mt.Table()
		if len(table) != MaglevSize(4) || mt.Len() != len(table) {
			t.Fatalf("frontend %d: %d slots, want %d", id, len(table), MaglevSize(4))
		}
		for i, b := range table {
			if b == 0 || mt.At(i) != b || u.Backends[BackendKey{b}].FrontendID != id {
				t.Fatalf("frontend %d slot %d: backend %d (At %d), not one of its own", id, i, b, mt.At(i))
			}
		}
	}
	runtime.KeepAlive(u)
	runtime.KeepAlive(tables)
	runtime.KeepAlive(m)
}

// genServices is genService's first n ClusterIP Services, 4 active
// endpoints each.
func genServices(n int) ([]*k8sobj.Service, []*k8sobj.EndpointSlice) {
	var svcs []*k8sobj.Service
	var eps []*k8sobj.EndpointSlice
	for i := range n {
		s, es := genService(i, active(4), false)
		svcs, eps = append(svcs, s), append(eps, es)
	}
	return svcs, eps
}

// TestUnchangedFrontendsKeepTheirCopy: a model re-translated (Batch) or
// rebuilt (Build, then Diff) from equal objects — a restart: the restored
// objects, then the informers' own — keeps the frontends it had, which the
// tables hold, not an equal copy of each (every Maglev table and backend
// list twice after a restart).
func TestUnchangedFrontendsKeepTheirCopy(t *testing.T) {
	const n = 50
	svcs, eps := genServices(n)
	m, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	had := map[FrontendKey]*Frontend{}
	for _, f := range m.Frontends() {
		had[f.Key] = f
	}
	same := func(m *Model, how string) {
		t.Helper()
		for _, f := range m.Frontends() {
			if had[f.Key] != f {
				t.Fatalf("%s: frontend %s is a new copy of an unchanged one", how, f.Key)
			}
		}
		if len(m.Frontends()) != len(had) {
			t.Fatalf("%s: %d frontends, want %d", how, len(m.Frontends()), len(had))
		}
	}
	svcs, eps = genServices(n) // the same objects, decoded anew
	edits := make([]Edit, n)
	for i := range edits {
		edits[i] = Edit{ID: ServiceID{svcs[i].Namespace, svcs[i].Name}, Service: svcs[i], Slices: []*k8sobj.EndpointSlice{eps[i]}}
	}
	c, _, err := m.Batch(edits)
	if err != nil || !c.Empty() {
		t.Fatalf("re-translating unchanged Services: %+v, %v", c, err)
	}
	same(m, "Batch")
	rebuilt, err := Build(svcs, eps, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c := Diff(m, rebuilt); !c.Empty() {
		t.Fatalf("Diff of equal models: %+v", c)
	}
	same(rebuilt, "Build + Diff")
}
