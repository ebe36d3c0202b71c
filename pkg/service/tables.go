package service

import (
	"fmt"
	"net/netip"
	"slices"
)

// Changes is the service-level difference between two models.
type Changes struct {
	// Upserted are frontends that are new or differ from the old model.
	Upserted []*Frontend
	// Removed are keys of frontends no longer in the new model.
	Removed []FrontendKey
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Upserted) == 0 && len(c.Removed) == 0 }

// Diff returns what changed from old to new. Frontends shared between the
// models (the common case after Model.With) cost one pointer compare; others
// are compared by value, so re-translating an unchanged service yields nothing.
// A nil old is an empty model. Where the two are equal, new keeps old's
// frontend: the tables hold old's (its Maglev table and backends), and an
// equal copy kept beside it would double what they share (every frontend
// after a restart, whose restored model the informers' objects rebuild).
func Diff(old, new *Model) Changes {
	var c Changes
	var oldF map[FrontendKey]*Frontend
	if old != nil {
		oldF = old.frontends
	}
	for k, f := range new.frontends {
		o, ok := oldF[k]
		switch {
		case !ok || (o != f && !equalFrontend(o, f)):
			c.Upserted = append(c.Upserted, f)
		case o != f:
			new.frontends[k] = o
		}
	}
	for k := range oldF {
		if _, ok := new.frontends[k]; !ok {
			c.Removed = append(c.Removed, k)
		}
	}
	slices.SortFunc(c.Upserted, func(a, b *Frontend) int { return compareKeys(a.Key, b.Key) })
	slices.SortFunc(c.Removed, compareKeys)
	return c
}

func equalFrontend(a, b *Frontend) bool {
	return a.Key == b.Key && a.Service == b.Service && a.PortName == b.PortName &&
		a.AffinityTimeout == b.AffinityTimeout && a.Local == b.Local && a.External == b.External &&
		slices.Equal(a.Backends, b.Backends) && slices.Equal(a.SourceRanges, b.SourceRanges) &&
		a.Maglev.Equal(b.Maglev)
}

// The map-shaped form a BPF datapath loads. Addresses are IPv4 in network byte
// order ([4]byte as on the wire); ports are host byte order (the datapath
// converts once when it builds its lookup key). Struct layouts have no implicit
// padding so they can be mirrored 1:1 in C.

// ServiceKey keys the frontend map (C: struct lb_svc_key).
type ServiceKey struct {
	Addr  [4]byte
	Port  uint16
	Proto uint8
	Scope uint8
}

// Service value flags.
const (
	// ServiceFlagAffinity: ClientIP session affinity (timeout in AffinitySeconds).
	ServiceFlagAffinity uint8 = 1 << 0
	// ServiceFlagNodePort: the frontend is a NodePort on a node address.
	ServiceFlagNodePort uint8 = 1 << 1
	// ServiceFlagLocal: traffic policy Local (Frontend.Local): no backend
	// means drop, silently, as no-local-backend.
	ServiceFlagLocal uint8 = 1 << 2
	// ServiceFlagExternal: an external address (Frontend.External).
	ServiceFlagExternal uint8 = 1 << 3
	// ServiceFlagSrcRange: only the sources in the frontend's SrcRangeKey
	// entries reach it (Frontend.SourceRanges).
	ServiceFlagSrcRange uint8 = 1 << 4
)

// ServiceValue is the frontend map value (C: struct lb_svc_value). FrontendID
// keys the Maglev and rev-NAT maps and goes into conntrack entries. MaglevSize 0
// means no backend takes new flows (answer ICMP unreachable / TCP reset).
type ServiceValue struct {
	FrontendID      uint32
	MaglevSize      uint32
	AffinitySeconds uint32
	Flags           uint8
	_               [3]byte
}

// BackendKey keys the backend map (C: struct lb_backend_key).
type BackendKey struct{ ID uint32 }

// BackendValue is the backend map value (C: struct lb_backend_value). A backend
// ID belongs to one frontend (FrontendID), so its State is that frontend's view.
// Conntrack and affinity entries hold backend IDs; the datapath keeps using an
// ID for existing flows while it is in the map, whatever its State, and uses
// only the Maglev table for new flows.
type BackendValue struct {
	Addr       [4]byte
	Port       uint16
	Proto      uint8
	State      uint8 // BackendState
	FrontendID uint32
}

// RevNatKey keys the reverse-NAT map (C: struct lb_revnat_key).
type RevNatKey struct{ FrontendID uint32 }

// RevNatValue is what replies are rewritten to (C: struct lb_revnat_value).
type RevNatValue struct {
	Addr [4]byte
	Port uint16
	_    [2]byte
}

// Update is the minimal set of map operations that moves the datapath from one
// model to the next. Apply in this order so that no lookup ever sees a dangling
// ID: Backends, Maglev, RevNat, SrcRanges, Services upserts; then
// ServiceDeletes, SrcRangeDeletes, RevNatDeletes, MaglevDeletes,
// BackendDeletes. (A frontend's new ranges are in before its service value
// flags them; ranges taken away go after it.)
type Update struct {
	Backends       map[BackendKey]BackendValue
	Maglev         map[uint32]MaglevIDs // FrontendID → backend ID per slot
	RevNat         map[RevNatKey]RevNatValue
	Services       map[ServiceKey]ServiceValue
	ServiceDeletes []ServiceKey
	RevNatDeletes  []RevNatKey
	MaglevDeletes  []uint32
	BackendDeletes []BackendKey
	// IPv6 frontends' entries (tables6.go), applied with their IPv4
	// counterparts; the deletes by ID above cover both families.
	Backends6       map[BackendKey]BackendValue6
	RevNat6         map[RevNatKey]RevNatValue6
	Services6       map[ServiceKey6]ServiceValue
	ServiceDeletes6 []ServiceKey6
	// Source ranges of frontends of either family (srcrange.go): entries
	// to add, entries to delete.
	SrcRanges       []SrcRangeKey
	SrcRangeDeletes []SrcRangeKey

	// The frontend ID each of ServiceDeletes, ServiceDeletes6 and
	// BackendDeletes belongs to, as Tables.Apply made them (split.go); an
	// update made otherwise (Adopt's repair) lacks them and is not split.
	svcDelOwner, svcDel6Owner, backDelOwner []uint32
}

// Ops is the number of map operations in u (a Maglev table counts as one).
func (u *Update) Ops() int {
	return len(u.Backends) + len(u.Maglev) + len(u.RevNat) + len(u.Services) +
		len(u.ServiceDeletes) + len(u.RevNatDeletes) + len(u.MaglevDeletes) + len(u.BackendDeletes) +
		len(u.Backends6) + len(u.RevNat6) + len(u.Services6) + len(u.ServiceDeletes6) +
		len(u.SrcRanges) + len(u.SrcRangeDeletes)
}

// progBackend is one programmed backend of a frontend. The value the
// backends map holds for it is not kept but derived (value, value6): its
// address and port are ap's, its frontend ID its frontend's, its protocol
// and state these; held is the family whose map holds it (0: none yet).
// Keeping both families' values made a backend 72 bytes, 40 now.
type progBackend struct {
	ap    netip.AddrPort
	id    uint32
	proto uint8
	state uint8
	held  uint8 // 4 or 6
}

// value is what the IPv4 backends map holds for pb (zero: nothing).
func (pb *progBackend) value(frontID uint32) BackendValue {
	if pb.held != 4 {
		return BackendValue{}
	}
	return BackendValue{Addr: pb.ap.Addr().As4(), Port: pb.ap.Port(), Proto: pb.proto, State: pb.state, FrontendID: frontID}
}

// value6 is what the IPv6 backends map holds for pb (zero: nothing).
func (pb *progBackend) value6(frontID uint32) BackendValue6 {
	if pb.held != 6 {
		return BackendValue6{}
	}
	return BackendValue6{Addr: pb.ap.Addr().As16(), Port: pb.ap.Port(), Proto: pb.proto, State: pb.state, FrontendID: frontID}
}

type programmed struct {
	id       uint32
	svcVal   ServiceValue
	backends []progBackend // sorted by ap, like Frontend.Backends
	// The programmed Maglev table is maglev (the frontend's own table of
	// backend indexes, shared with the model: frontends are immutable) over
	// maglevIDs (the backends' IDs), not the table of IDs itself (4 bytes
	// per slot). An adopted table (read from the pinned maps at restart) is
	// held as read until the frontend is next programmed.
	maglev    MaglevTable
	maglevIDs []uint32
	adopted   []uint32
	ranges    []netip.Prefix // sorted, like Frontend.SourceRanges
}

// hasMaglev says whether p has a Maglev table programmed.
func (p *programmed) hasMaglev() bool { return !p.maglev.None() || p.adopted != nil }

// maglevTable is p's programmed Maglev table (p.hasMaglev).
func (p *programmed) maglevTable() MaglevIDs {
	if p.adopted != nil {
		return MaglevIDs{raw: p.adopted}
	}
	return MaglevIDs{idx: p.maglev, ids: p.maglevIDs}
}

// MaglevIDs is a Maglev table of backend IDs as an update carries it: a
// frontend's table of backend indexes (a byte a slot up to 256 backends)
// over its backends' IDs, or a table as read from the maps. Expanded to 4
// bytes a slot only as the datapath writes it (Table): an update of every
// frontend (the first full set) held them all expanded, 2 KB per
// 4-backend frontend. Its parts are never changed once in an update.
type MaglevIDs struct {
	idx MaglevTable
	ids []uint32
	raw []uint32
}

// MaglevIDsOf is a table of backend IDs as read.
func MaglevIDsOf(table []uint32) MaglevIDs { return MaglevIDs{raw: table} }

// Len is the table's size (its slots).
func (m MaglevIDs) Len() int {
	if m.raw != nil {
		return len(m.raw)
	}
	return m.idx.Len()
}

// At is slot i's backend ID.
func (m MaglevIDs) At(i int) uint32 {
	if m.raw != nil {
		return m.raw[i]
	}
	return m.ids[m.idx.At(i)]
}

// String prints the table of backend IDs (whichever way it is held).
func (m MaglevIDs) String() string { return fmt.Sprint(m.Table()) }

// Table returns the table of backend IDs, a new slice.
func (m MaglevIDs) Table() []uint32 {
	if m.raw != nil {
		return slices.Clone(m.raw)
	}
	return maglevTable(m.idx, m.ids)
}

// maglevTable maps a Maglev table of backend indexes to backend IDs.
func maglevTable(idx MaglevTable, ids []uint32) []uint32 {
	if idx.None() {
		return nil
	}
	table := make([]uint32, idx.Len())
	for i := range table {
		table[i] = ids[idx.At(i)]
	}
	return table
}

// sameMaglev says whether p's programmed table is idx over ids.
func (p *programmed) sameMaglev(idx MaglevTable, ids []uint32) bool {
	if p.adopted != nil {
		return !idx.None() && slices.Equal(maglevTable(idx, ids), p.adopted)
	}
	if !p.maglev.Equal(idx) {
		return false
	}
	for i := range idx.Len() {
		if bi := idx.At(i); ids[bi] != p.maglevIDs[bi] {
			return false
		}
	}
	return true
}

// Tables tracks what is programmed and allocates frontend and backend IDs. IDs
// are node-local (never 0) and stable while the frontend or backend exists, so
// conntrack entries stay valid across updates; Maglev tables are computed from
// backend addresses only, so every node picks the same backend for a flow.
// Tables is not safe for concurrent use.
type Tables struct {
	fronts    map[FrontendKey]*programmed
	nextFront uint32
	nextBack  uint32
	usedFront map[uint32]bool
	usedBack  map[uint32]bool
	// capacity, used and waiting: the maps' sizes, the entries programmed,
	// the frontends that did not fit (capacity.go).
	capacity Capacity
	used     usage
	waiting  map[FrontendKey]waitingFrontend
}

// waitingFrontend is a frontend that did not fit: its latest version, the
// map that is full, and whether an earlier version is programmed.
type waitingFrontend struct {
	f     *Frontend
	m     string
	stale bool
}

// NewTables returns empty tables (nothing programmed).
func NewTables() *Tables {
	return &Tables{fronts: map[FrontendKey]*programmed{}, usedFront: map[uint32]bool{}, usedBack: map[uint32]bool{},
		waiting: map[FrontendKey]waitingFrontend{}}
}

// alloc returns the next unused ID after *next. IDs are not reused until the
// 32-bit space wraps, so a stale conntrack entry never lands on a recycled ID in
// practice.
func alloc(next *uint32, used map[uint32]bool) uint32 {
	for {
		*next++
		if *next != 0 && !used[*next] {
			used[*next] = true
			return *next
		}
	}
}

func (t *Tables) allocFront() uint32 { return alloc(&t.nextFront, t.usedFront) }
func (t *Tables) allocBack() uint32  { return alloc(&t.nextBack, t.usedBack) }

// ServiceKeyOf returns the map key of a frontend.
func ServiceKeyOf(k FrontendKey) ServiceKey {
	return ServiceKey{Addr: k.Addr.As4(), Port: k.Port, Proto: uint8(k.Proto), Scope: uint8(k.Scope)}
}

// Apply records changes as programmed and returns the map operations that
// program them: only entries whose value changes are included. A frontend
// the maps have no room for waits (Unprogrammed) and is programmed by the
// first Apply after room returns.
func (t *Tables) Apply(c Changes) *Update {
	u := newUpdate()
	freed := false
	for _, k := range c.Removed {
		delete(t.waiting, k)
		p, ok := t.fronts[k]
		if !ok {
			continue
		}
		deleteService(u, k, p.id)
		putSrcRanges(u, p.id, p.ranges, nil)
		u.RevNatDeletes = append(u.RevNatDeletes, RevNatKey{p.id})
		if p.hasMaglev() {
			u.MaglevDeletes = append(u.MaglevDeletes, p.id)
		}
		for _, b := range p.backends {
			deleteBackend(u, b.id, p.id)
			delete(t.usedBack, b.id)
		}
		delete(t.usedFront, p.id)
		delete(t.fronts, k)
		t.used.fronts[family(k)]--
		t.used.backs[family(k)] -= len(p.backends)
		freed = true
	}
	for _, f := range c.Upserted {
		before := t.used
		t.upsertOrWait(f, u)
		if t.used.fronts[family(f.Key)] < before.fronts[family(f.Key)] || t.used.backs[family(f.Key)] < before.backs[family(f.Key)] {
			freed = true
		}
	}
	if freed {
		t.retryWaiting(u)
	}
	return u
}

func (t *Tables) upsert(f *Frontend, u *Update) {
	p, existed := t.fronts[f.Key]
	if !existed {
		p = &programmed{id: t.allocFront()}
		t.fronts[f.Key] = p
		putRevNat(u, f.Key, p.id)
		t.used.fronts[family(f.Key)]++
	}
	t.used.backs[family(f.Key)] += len(f.Backends) - len(p.backends)
	// Backends: merge the sorted programmed list with the sorted new one; keep
	// IDs of backends still present, allocate new ones, delete gone ones.
	ids := make([]uint32, len(f.Backends))
	next := make([]progBackend, 0, len(f.Backends))
	var gone []uint32
	old := p.backends
	for i, b := range f.Backends {
		ap := netip.AddrPortFrom(b.Addr, b.Port)
		for len(old) > 0 && old[0].ap.Compare(ap) < 0 {
			gone = append(gone, old[0].id)
			old = old[1:]
		}
		var pb progBackend
		if len(old) > 0 && old[0].ap == ap {
			pb = old[0]
			old = old[1:]
		} else {
			pb = progBackend{ap: ap, id: t.allocBack()}
		}
		putBackend(u, f, b, p.id, &pb)
		ids[i] = pb.id
		next = append(next, pb)
	}
	for _, b := range old {
		gone = append(gone, b.id)
	}
	p.backends = next
	// Maglev (written before the service value that announces its size).
	if !p.sameMaglev(f.Maglev, ids) {
		if f.Maglev.None() {
			u.MaglevDeletes = append(u.MaglevDeletes, p.id)
		} else {
			u.Maglev[p.id] = MaglevIDs{idx: f.Maglev, ids: ids}
		}
	}
	// The frontend's table, not a copy (an equal one programmed before, or
	// adopted as read at restart, is let go).
	p.maglev, p.maglevIDs, p.adopted = f.Maglev, ids, nil
	sv := ServiceValue{FrontendID: p.id, MaglevSize: uint32(f.Maglev.Len()), AffinitySeconds: uint32(f.AffinityTimeout.Seconds())}
	if f.AffinityTimeout > 0 {
		sv.Flags |= ServiceFlagAffinity
	}
	if f.Key.Scope == ScopeNodePort {
		sv.Flags |= ServiceFlagNodePort
	}
	if f.Local {
		sv.Flags |= ServiceFlagLocal
	}
	if f.External {
		sv.Flags |= ServiceFlagExternal
	}
	if len(f.SourceRanges) > 0 {
		sv.Flags |= ServiceFlagSrcRange
	}
	if !slices.Equal(f.SourceRanges, p.ranges) {
		putSrcRanges(u, p.id, p.ranges, f.SourceRanges)
		p.ranges = slices.Clone(f.SourceRanges)
	}
	if !existed || sv != p.svcVal {
		putService(u, f.Key, sv)
		p.svcVal = sv
	}
	// Removed backends go last: the new Maglev table no longer refers to them.
	for _, id := range gone {
		deleteBackend(u, id, p.id)
		delete(t.usedBack, id)
	}
}

// Snapshot returns the full contents the maps should hold now (what a restarted
// agent compares against the pinned maps).
func (t *Tables) Snapshot() *Update {
	u := newUpdate()
	for k, p := range t.fronts {
		putService(u, k, p.svcVal)
		putRevNat(u, k, p.id)
		if p.hasMaglev() {
			u.Maglev[p.id] = p.maglevTable()
		}
		putSrcRanges(u, p.id, nil, p.ranges)
		for _, b := range p.backends {
			if k.is6() {
				u.Backends6[BackendKey{b.id}] = b.value6(p.id)
			} else {
				u.Backends[BackendKey{b.id}] = b.value(p.id)
			}
		}
	}
	return u
}

// FrontendID returns the ID programmed for key.
func (t *Tables) FrontendID(key FrontendKey) (uint32, bool) {
	p, ok := t.fronts[key]
	if !ok {
		return 0, false
	}
	return p.id, true
}

// String summarizes an update for logs.
func (u *Update) String() string {
	return fmt.Sprintf("services +%d -%d, backends +%d -%d, maglev +%d -%d, revnat +%d -%d, source ranges +%d -%d",
		len(u.Services)+len(u.Services6), len(u.ServiceDeletes)+len(u.ServiceDeletes6), len(u.Backends)+len(u.Backends6),
		len(u.BackendDeletes), len(u.Maglev), len(u.MaglevDeletes), len(u.RevNat)+len(u.RevNat6), len(u.RevNatDeletes),
		len(u.SrcRanges), len(u.SrcRangeDeletes))
}
