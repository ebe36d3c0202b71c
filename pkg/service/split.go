package service

import (
	"maps"
	"slices"
)

// An update's entries each belong to one frontend: its service entry, its
// rev-NAT entry, its Maglev table and source ranges are keyed by its ID, and
// a backend ID belongs to one frontend (BackendValue.FrontendID). IDs are
// not reused while the 32-bit space lasts (alloc), so the parts of an update
// for different frontends are independent: a datapath that refuses one
// frontend's part can take the others'. Only a service key passes from a
// removed frontend to a new one (a Service deleted and created again); a
// Held set keeps the two in order.

// Frontends returns the IDs of the frontends u's entries belong to, sorted;
// ok is false when some entry's frontend is unknown (an update Tables.Apply
// did not make: Adopt's repair of what no frontend owns).
func (u *Update) Frontends() (ids []uint32, ok bool) {
	if len(u.svcDelOwner) != len(u.ServiceDeletes) || len(u.svcDel6Owner) != len(u.ServiceDeletes6) ||
		len(u.backDelOwner) != len(u.BackendDeletes) {
		return nil, false
	}
	set := map[uint32]bool{}
	u.each(func(id uint32) { set[id] = true })
	return slices.Sorted(maps.Keys(set)), true
}

// each calls f with the frontend ID of every entry of u (owners known).
func (u *Update) each(f func(id uint32)) {
	for _, v := range u.Backends {
		f(v.FrontendID)
	}
	for _, v := range u.Backends6 {
		f(v.FrontendID)
	}
	for id := range u.Maglev {
		f(id)
	}
	for k := range u.RevNat {
		f(k.FrontendID)
	}
	for k := range u.RevNat6 {
		f(k.FrontendID)
	}
	for _, v := range u.Services {
		f(v.FrontendID)
	}
	for _, v := range u.Services6 {
		f(v.FrontendID)
	}
	for _, k := range u.SrcRanges {
		f(k.FrontendID)
	}
	for _, k := range u.SrcRangeDeletes {
		f(k.FrontendID)
	}
	for _, k := range u.RevNatDeletes {
		f(k.FrontendID)
	}
	for _, id := range u.MaglevDeletes {
		f(id)
	}
	for _, id := range u.svcDelOwner {
		f(id)
	}
	for _, id := range u.svcDel6Owner {
		f(id)
	}
	for _, id := range u.backDelOwner {
		f(id)
	}
}

// Part returns the entries of u that belong to the frontends in (nil when
// there are none), in u's order. u's owners must be known (Frontends).
func (u *Update) Part(in func(id uint32) bool) *Update {
	p := &Update{}
	p.Backends = partOf(u.Backends, func(_ BackendKey, v BackendValue) bool { return in(v.FrontendID) })
	p.Backends6 = partOf(u.Backends6, func(_ BackendKey, v BackendValue6) bool { return in(v.FrontendID) })
	p.Maglev = partOf(u.Maglev, func(id uint32, _ MaglevIDs) bool { return in(id) })
	p.RevNat = partOf(u.RevNat, func(k RevNatKey, _ RevNatValue) bool { return in(k.FrontendID) })
	p.RevNat6 = partOf(u.RevNat6, func(k RevNatKey, _ RevNatValue6) bool { return in(k.FrontendID) })
	p.Services = partOf(u.Services, func(_ ServiceKey, v ServiceValue) bool { return in(v.FrontendID) })
	p.Services6 = partOf(u.Services6, func(_ ServiceKey6, v ServiceValue) bool { return in(v.FrontendID) })
	p.SrcRanges = keep(u.SrcRanges, func(k SrcRangeKey) bool { return in(k.FrontendID) })
	p.SrcRangeDeletes = keep(u.SrcRangeDeletes, func(k SrcRangeKey) bool { return in(k.FrontendID) })
	p.RevNatDeletes = keep(u.RevNatDeletes, func(k RevNatKey) bool { return in(k.FrontendID) })
	p.MaglevDeletes = keep(u.MaglevDeletes, in)
	for i, k := range u.ServiceDeletes {
		if id := u.svcDelOwner[i]; in(id) {
			p.ServiceDeletes, p.svcDelOwner = append(p.ServiceDeletes, k), append(p.svcDelOwner, id)
		}
	}
	for i, k := range u.ServiceDeletes6 {
		if id := u.svcDel6Owner[i]; in(id) {
			p.ServiceDeletes6, p.svcDel6Owner = append(p.ServiceDeletes6, k), append(p.svcDel6Owner, id)
		}
	}
	for i, k := range u.BackendDeletes {
		if id := u.backDelOwner[i]; in(id) {
			p.BackendDeletes, p.backDelOwner = append(p.BackendDeletes, k), append(p.backDelOwner, id)
		}
	}
	if p.Ops() == 0 {
		return nil
	}
	return p
}

// partOf returns the entries of m that in takes (nil when none).
func partOf[K comparable, V any](m map[K]V, in func(K, V) bool) map[K]V {
	var out map[K]V
	for k, v := range m {
		if in(k, v) {
			if out == nil {
				out = map[K]V{}
			}
			out[k] = v
		}
	}
	return out
}

func keep[T any](s []T, in func(T) bool) []T {
	var out []T
	for _, v := range s {
		if in(v) {
			out = append(out, v)
		}
	}
	return out
}

// Held is what updates a datapath refused hold: the frontends they belong
// to and the service keys they write or delete. A later update's part for
// any of those waits behind them (Split), so that it lands after them; the
// rest of it need not wait.
type Held struct {
	all   bool // an update whose frontends are unknown: everything waits
	ids   map[uint32]bool
	keys  map[ServiceKey]bool
	keys6 map[ServiceKey6]bool
}

// Empty says whether nothing is held.
func (h *Held) Empty() bool { return !h.all && len(h.ids) == 0 }

// Add holds u.
func (h *Held) Add(u *Update) {
	if _, ok := u.Frontends(); !ok {
		h.all = true
		return
	}
	if h.ids == nil {
		h.ids, h.keys, h.keys6 = map[uint32]bool{}, map[ServiceKey]bool{}, map[ServiceKey6]bool{}
	}
	u.each(func(id uint32) { h.ids[id] = true })
	for k := range u.Services {
		h.keys[k] = true
	}
	for _, k := range u.ServiceDeletes {
		h.keys[k] = true
	}
	for k := range u.Services6 {
		h.keys6[k] = true
	}
	for _, k := range u.ServiceDeletes6 {
		h.keys6[k] = true
	}
}

// Split divides u into the part that must wait behind what h holds — the
// frontends h holds, or whose service key it holds — and the rest (either
// nil when empty). With nothing held, all of u is free; when h or u cannot
// say which frontends they hold, all of u waits.
func (h *Held) Split(u *Update) (wait, free *Update) {
	if h.Empty() {
		return nil, u
	}
	ids, ok := u.Frontends()
	if h.all || !ok {
		return u, nil
	}
	blocked := map[uint32]bool{}
	for k, v := range u.Services {
		if h.keys[k] {
			blocked[v.FrontendID] = true
		}
	}
	for i, k := range u.ServiceDeletes {
		if h.keys[k] {
			blocked[u.svcDelOwner[i]] = true
		}
	}
	for k, v := range u.Services6 {
		if h.keys6[k] {
			blocked[v.FrontendID] = true
		}
	}
	for i, k := range u.ServiceDeletes6 {
		if h.keys6[k] {
			blocked[u.svcDel6Owner[i]] = true
		}
	}
	isHeld := func(id uint32) bool { return h.ids[id] || blocked[id] }
	if !slices.ContainsFunc(ids, isHeld) {
		return nil, u
	}
	return u.Part(isHeld), u.Part(func(id uint32) bool { return !isHeld(id) })
}
