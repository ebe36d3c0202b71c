package service

import "net/netip"

// The IPv6 half of the map-shaped form (C: bpf/lib/lb6.h). A frontend's
// family is its address's: an IPv6 frontend's service entry, backends and
// rev-NAT entry go to these types (Update's *6 fields), everything else is
// shared with IPv4 (ServiceValue, the Maglev tables, frontend and backend
// IDs, which Tables allocates across both families, so RevNatDeletes,
// MaglevDeletes and BackendDeletes name an ID of either family).

// ServiceKey6 keys the IPv6 frontend map (C: struct lb_svc6_key).
type ServiceKey6 struct {
	Addr  [16]byte
	Port  uint16
	Proto uint8
	Scope uint8
}

// BackendValue6 is an IPv6 backend (C: struct lb_backend6_value).
type BackendValue6 struct {
	Addr       [16]byte
	Port       uint16
	Proto      uint8
	State      uint8 // BackendState
	FrontendID uint32
}

// RevNatValue6 is what replies of an IPv6 frontend are rewritten to (C:
// struct lb_revnat6_value).
type RevNatValue6 struct {
	Addr [16]byte
	Port uint16
	_    [2]byte
}

// ServiceKey6Of returns the map key of an IPv6 frontend.
func ServiceKey6Of(k FrontendKey) ServiceKey6 {
	return ServiceKey6{Addr: k.Addr.As16(), Port: k.Port, Proto: uint8(k.Proto), Scope: uint8(k.Scope)}
}

// is6 says whether a frontend is IPv6 (its maps are the *6 ones).
func (k FrontendKey) is6() bool { return !k.Addr.Is4() }

// newUpdate returns an Update with every map allocated.
func newUpdate() *Update {
	return &Update{
		Backends: map[BackendKey]BackendValue{}, Maglev: map[uint32]MaglevIDs{},
		RevNat: map[RevNatKey]RevNatValue{}, Services: map[ServiceKey]ServiceValue{},
		Backends6: map[BackendKey]BackendValue6{}, RevNat6: map[RevNatKey]RevNatValue6{},
		Services6: map[ServiceKey6]ServiceValue{},
	}
}

// putRevNat records frontend k's rev-NAT entry (id) in u.
func putRevNat(u *Update, k FrontendKey, id uint32) {
	if k.is6() {
		u.RevNat6[RevNatKey{id}] = RevNatValue6{Addr: k.Addr.As16(), Port: k.Port}
		return
	}
	u.RevNat[RevNatKey{id}] = RevNatValue{Addr: k.Addr.As4(), Port: k.Port}
}

// putService records frontend k's service entry in u.
func putService(u *Update, k FrontendKey, v ServiceValue) {
	if k.is6() {
		u.Services6[ServiceKey6Of(k)] = v
		return
	}
	u.Services[ServiceKeyOf(k)] = v
}

// deleteService records the deletion of frontend k's service entry (frontend
// id's) in u.
func deleteService(u *Update, k FrontendKey, id uint32) {
	if k.is6() {
		u.ServiceDeletes6 = append(u.ServiceDeletes6, ServiceKey6Of(k))
		u.svcDel6Owner = append(u.svcDel6Owner, id)
		return
	}
	u.ServiceDeletes = append(u.ServiceDeletes, ServiceKeyOf(k))
	u.svcDelOwner = append(u.svcDelOwner, id)
}

// deleteBackend records the deletion of backend id of frontend front in u.
func deleteBackend(u *Update, id, front uint32) {
	u.BackendDeletes = append(u.BackendDeletes, BackendKey{id})
	u.backDelOwner = append(u.backDelOwner, front)
}

// putBackend records backend b of frontend f (ID pb.id) in u when its value
// changed, and keeps the value in pb.
func putBackend(u *Update, f *Frontend, b Backend, frontID uint32, pb *progBackend) {
	if f.Key.is6() {
		v := BackendValue6{Addr: b.Addr.As16(), Port: b.Port, Proto: uint8(f.Key.Proto), State: uint8(b.State), FrontendID: frontID}
		if pb.value6(frontID) != v {
			u.Backends6[BackendKey{pb.id}] = v
			pb.proto, pb.state, pb.held = v.Proto, v.State, 6
		}
		return
	}
	v := BackendValue{Addr: b.Addr.As4(), Port: b.Port, Proto: uint8(f.Key.Proto), State: uint8(b.State), FrontendID: frontID}
	if pb.value(frontID) != v {
		u.Backends[BackendKey{pb.id}] = v
		pb.proto, pb.state, pb.held = v.Proto, v.State, 4
	}
}

// adopt6 is Adopt for the IPv6 entries of u: it returns the adopted
// frontends and adds what no frontend owns (and missing rev-NAT entries) to
// orphans. byFront holds the frontends adopted so far (both families).
func (t *Tables) adopt6(u *Update, byFront map[uint32]*programmed, orphans *Update) (adopted []FrontendKey) {
	for k, v := range u.Services6 {
		fk := FrontendKey{Addr: netip.AddrFrom16(k.Addr), Port: k.Port, Proto: Proto(k.Proto), Scope: Scope(k.Scope)}
		if p := t.adoptFront(fk, v, u, byFront); p == nil {
			orphans.ServiceDeletes6 = append(orphans.ServiceDeletes6, k)
			continue
		}
		adopted = append(adopted, fk)
	}
	for k, v := range u.Backends6 {
		p := byFront[v.FrontendID]
		if p == nil || k.ID == 0 {
			orphans.BackendDeletes = append(orphans.BackendDeletes, k)
			continue
		}
		p.backends = append(p.backends, progBackend{ap: netip.AddrPortFrom(netip.AddrFrom16(v.Addr), v.Port), id: k.ID, proto: v.Proto, state: v.State, held: 6})
		t.usedBack[k.ID] = true
		t.nextBack = max(t.nextBack, k.ID)
	}
	for k := range u.RevNat6 {
		if byFront[k.FrontendID] == nil {
			orphans.RevNatDeletes = append(orphans.RevNatDeletes, k)
		}
	}
	for _, fk := range adopted {
		p := t.fronts[fk]
		want := RevNatValue6{Addr: fk.Addr.As16(), Port: fk.Port}
		if got, ok := u.RevNat6[RevNatKey{p.id}]; !ok || got != want {
			orphans.RevNat6[RevNatKey{p.id}] = want
		}
	}
	return adopted
}
