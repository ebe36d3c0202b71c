package service

import (
	"net/netip"
	"slices"
)

// Adopt records what a datapath already holds (its DumpServices) as
// programmed, so that a restarted agent keeps the frontend and backend IDs
// conntrack and affinity entries refer to: the next Apply of a model that
// still has a frontend or backend reuses its ID and writes only what differs.
// It returns the adopted frontend keys (the caller removes those its model no
// longer has with Apply(Changes{Removed: ...})) and a repair update: deletes
// of entries no frontend owns (backends, Maglev tables, rev-NAT entries and
// source ranges left behind) and the rev-NAT entries adopted frontends lack.
// Call it on empty Tables only.
func (t *Tables) Adopt(u *Update) (adopted []FrontendKey, repair *Update) {
	orphans := newUpdate()
	byFront := map[uint32]*programmed{}
	for k, v := range u.Services {
		fk := FrontendKey{Addr: netip.AddrFrom4(k.Addr), Port: k.Port, Proto: Proto(k.Proto), Scope: Scope(k.Scope)}
		if t.adoptFront(fk, v, u, byFront) == nil {
			// Corrupt or shared ID: forget the entry; the model re-creates it.
			orphans.ServiceDeletes = append(orphans.ServiceDeletes, k)
			continue
		}
		adopted = append(adopted, fk)
	}
	adopted6 := t.adopt6(u, byFront, orphans) // tables6.go
	for k, v := range u.Backends {
		p := byFront[v.FrontendID]
		if p == nil || k.ID == 0 {
			orphans.BackendDeletes = append(orphans.BackendDeletes, k)
			continue
		}
		p.backends = append(p.backends, progBackend{ap: netip.AddrPortFrom(netip.AddrFrom4(v.Addr), v.Port), id: k.ID, proto: v.Proto, state: v.State, held: 4})
		t.usedBack[k.ID] = true
		t.nextBack = max(t.nextBack, k.ID)
	}
	for _, p := range byFront {
		slices.SortFunc(p.backends, func(a, b progBackend) int { return a.ap.Compare(b.ap) })
	}
	adoptSrcRanges(u, byFront, orphans) // srcrange.go
	for id := range u.Maglev {
		if p := byFront[id]; p == nil || !p.hasMaglev() {
			orphans.MaglevDeletes = append(orphans.MaglevDeletes, id)
		}
	}
	for k := range u.RevNat {
		if byFront[k.FrontendID] == nil {
			orphans.RevNatDeletes = append(orphans.RevNatDeletes, k)
		}
	}
	for _, fk := range adopted {
		p := t.fronts[fk]
		want := RevNatValue{Addr: fk.Addr.As4(), Port: fk.Port}
		if got, ok := u.RevNat[RevNatKey{p.id}]; !ok || got != want {
			orphans.RevNat[RevNatKey{p.id}] = want
		}
	}
	adopted = append(adopted, adopted6...)
	slices.SortFunc(adopted, compareKeys)
	t.recount()
	return adopted, orphans
}

// adoptFront records frontend fk with service value v as programmed (its
// Maglev table from u) unless its ID is 0 or taken; returns it, or nil.
func (t *Tables) adoptFront(fk FrontendKey, v ServiceValue, u *Update, byFront map[uint32]*programmed) *programmed {
	if v.FrontendID == 0 || byFront[v.FrontendID] != nil {
		return nil
	}
	p := &programmed{id: v.FrontendID, svcVal: v}
	if v.MaglevSize > 0 {
		p.adopted = u.Maglev[v.FrontendID].Table()
	}
	t.fronts[fk] = p
	t.usedFront[p.id] = true
	t.nextFront = max(t.nextFront, p.id)
	byFront[p.id] = p
	return p
}
