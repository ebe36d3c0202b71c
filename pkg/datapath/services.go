package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/service"
)

// ServiceDatapath is the service load-balancing half of the datapath (see
// bpf/lib/lb.h and bpf/lib/ct.h). *Loader implements it; the agent
// type-asserts it on its Datapath.
type ServiceDatapath interface {
	// ApplyServices writes u into the pinned maps in service.Update's order
	// (upserts Backends, Maglev, RevNat, Services; then deletes Services,
	// RevNat, Maglev, Backends). It is idempotent: deleting what is absent
	// is not an error. u is checked first; a malformed update is refused
	// whole, naming the offending entry.
	ApplyServices(u *service.Update) error
	// DumpServices returns what the pinned maps hold, in Update form
	// (upserts only): after an agent restart, compare it with
	// service.Tables.Snapshot to re-adopt or repair.
	DumpServices() (*service.Update, error)
	// GCConntrack removes expired conntrack entries (the timeouts in
	// bpf/lib/ct.h) and stale affinity entries; returns how many conntrack
	// entries it removed. The agent calls it periodically.
	GCConntrack() (removed int, err error)
	// ServiceStats returns conntrack occupancy and the LB counters.
	ServiceStats() (ServiceStats, error)
}

var _ ServiceDatapath = (*Loader)(nil)

// ServiceStats are conntrack occupancy and load-balancing counters, summed
// over CPUs.
type ServiceStats struct {
	// ConntrackEntries is the live entry count: created - evicted - removed
	// by GC, re-based to the true count by every GCConntrack.
	ConntrackEntries uint64
	// ConntrackCapacity is lk_ct4's size.
	ConntrackCapacity uint64
	// ConntrackCreated counts entries the datapath created.
	ConntrackCreated uint64
	// ConntrackEvicted counts creations while the table was full: each made
	// the LRU evict a tracked flow (which then loses its backend or NAT).
	ConntrackEvicted uint64
	// ConntrackFailed counts creations the map refused.
	ConntrackFailed uint64

	NewFlows      uint64 // new flows that took a backend
	ConntrackHits uint64 // packets of tracked flows that kept their backend
	Reselected    uint64 // tracked flows whose backend was gone, chosen again
	AffinityHits  uint64 // new flows that followed a ClientIP affinity entry
	RevNAT        uint64 // replies translated back
	NoBackend     uint64 // new flows without a backend (reset / unreachable sent)
	Hairpin       uint64 // new flows whose client is its own backend
	NodePortLocal uint64 // new NodePort flows to a local backend
	NodePortSNAT  uint64 // new NodePort flows to a remote backend (SNAT)
	// Tunnel mode's masquerading (bpf/lib/masq.h): new flows from
	// endpoints to outside the cluster, and the packets translated.
	Masqueraded, MasqueradedPackets uint64

	// Sock are the socket load balancer's counters by hook (sock.go);
	// empty while it is not attached.
	Sock map[string]SockCounters
}

// Conntrack constants from bpf/lib/ct.h (generated).
const (
	ctFSeenReply = uint16(podLkCtFlagsCT_F_SEEN_REPLY)
	ctFClosing   = uint16(podLkCtFlagsCT_F_CLOSING)

	ctCountCreated   = uint32(podLkCtCounterCT_COUNT_CREATED)
	ctCountEvicted   = uint32(podLkCtCounterCT_COUNT_EVICTED)
	ctCountGCRemoved = uint32(podLkCtCounterCT_COUNT_GC_REMOVED)
	ctCountFailed    = uint32(podLkCtCounterCT_COUNT_FAILED)

	// DefaultConntrackEntries is LK_CT_ENTRIES (lk_ct4's default size).
	DefaultConntrackEntries = 262144
	// maxAffinity is the longest ClientIP affinity timeout Kubernetes allows.
	maxAffinity = 86400 * time.Second
)

// ctTimeout is ct_timeout_ns in bpf/lib/ct.h.
func ctTimeout(proto uint8, flags uint16) time.Duration {
	s := uint32(podLkCtTimeoutCT_TIMEOUT_NONTCP)
	if proto == uint8(service.TCP) {
		switch {
		case flags&ctFClosing != 0:
			s = uint32(podLkCtTimeoutCT_TIMEOUT_TCP_CLOSE)
		case flags&ctFSeenReply != 0:
			s = uint32(podLkCtTimeoutCT_TIMEOUT_TCP)
		default:
			s = uint32(podLkCtTimeoutCT_TIMEOUT_TCP_SYN)
		}
	}
	return time.Duration(s) * time.Second
}

// monotonicNow is bpf_ktime_get_ns's clock.
func monotonicNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// sizeConntrack sets lk_ct4's size and the programs' copy of it.
func sizeConntrack(spec *ebpf.CollectionSpec, entries uint32) error {
	if m, ok := spec.Maps["lk_ct4"]; ok {
		m.MaxEntries = entries
	}
	if v, ok := spec.Variables["ct_max_entries"]; ok {
		if err := v.Set(entries); err != nil {
			return fmt.Errorf("set ct_max_entries: %w", err)
		}
	}
	return nil
}

// The default SNAT source port range (lb_snat_port_min/max in
// bpf/lib/lb_maps.h): above the NodePort range (30000-32767) and Linux's
// default ephemeral range (32768-60999).
const (
	DefaultSNATPortMin = 61000
	DefaultSNATPortMax = 65535
)

// snatPorts returns the configured SNAT port range, or the default.
func (c Config) snatPorts() (uint16, uint16, error) {
	lo, hi := c.SNATPortMin, c.SNATPortMax
	if lo == 0 && hi == 0 {
		return DefaultSNATPortMin, DefaultSNATPortMax, nil
	}
	if lo == 0 || hi < lo {
		return 0, 0, fmt.Errorf("SNAT port range %d-%d: want 1 <= min <= max <= 65535", lo, hi)
	}
	return lo, hi, nil
}

// setSNATPorts sets the programs' SNAT port range (where a program has it).
func setSNATPorts(spec *ebpf.CollectionSpec, lo, hi uint16) error {
	for name, v := range map[string]uint16{"lb_snat_port_min": lo, "lb_snat_port_max": hi} {
		if sv, ok := spec.Variables[name]; ok {
			if err := sv.Set(v); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	return nil
}

// checkUpdate refuses an update that would leave a dangling reference or a
// table the datapath cannot use, before anything is written.
func checkUpdate(u *service.Update) error {
	for k, v := range u.Services {
		what := fmt.Sprintf("service %v:%d/%d scope %d", netip.AddrFrom4(k.Addr), k.Port, k.Proto, k.Scope)
		if v.FrontendID == 0 {
			return fmt.Errorf("%s: frontend ID 0", what)
		}
		if k.Proto != uint8(service.TCP) && k.Proto != uint8(service.UDP) {
			return fmt.Errorf("%s: protocol %d is not TCP or UDP", what, k.Proto)
		}
		if t, ok := u.Maglev[v.FrontendID]; ok && uint32(t.Len()) != v.MaglevSize {
			return fmt.Errorf("%s: MaglevSize %d but its Maglev table has %d slots", what, v.MaglevSize, t.Len())
		}
		if v.MaglevSize > 0 && v.MaglevSize > 1<<24 {
			return fmt.Errorf("%s: MaglevSize %d too large", what, v.MaglevSize)
		}
	}
	for id, t := range u.Maglev {
		if id == 0 {
			return fmt.Errorf("maglev table of frontend 0")
		}
		if t.Len() == 0 {
			return fmt.Errorf("maglev table of frontend %d: empty (delete it instead)", id)
		}
		if t.Len() < service.MaglevFloor {
			return fmt.Errorf("maglev table of frontend %d: %d slots, fewer than service.MaglevFloor (%d)", id, t.Len(), service.MaglevFloor)
		}
		// Each distinct backend ID once (a table holds few, many times).
		var distinct []uint32
		for i := range t.Len() {
			b := t.At(i)
			if b == 0 {
				return fmt.Errorf("maglev table of frontend %d: slot %d holds backend ID 0", id, i)
			}
			if len(distinct) < 32 && !slices.Contains(distinct, b) {
				distinct = append(distinct, b)
			}
		}
		for _, b := range distinct {
			if bv, ok := u.Backends[service.BackendKey{ID: b}]; ok && bv.FrontendID != id {
				return fmt.Errorf("maglev table of frontend %d: backend %d belongs to frontend %d", id, b, bv.FrontendID)
			}
			if bv, ok := u.Backends6[service.BackendKey{ID: b}]; ok && bv.FrontendID != id {
				return fmt.Errorf("maglev table of frontend %d: backend %d belongs to frontend %d", id, b, bv.FrontendID)
			}
		}
	}
	for k, v := range u.Backends {
		if k.ID == 0 || v.FrontendID == 0 {
			return fmt.Errorf("backend %d: ID or frontend ID 0", k.ID)
		}
	}
	for k := range u.RevNat {
		if k.FrontendID == 0 {
			return fmt.Errorf("rev-NAT entry of frontend 0")
		}
	}
	for k, v := range u.Backends6 {
		if k.ID == 0 || v.FrontendID == 0 {
			return fmt.Errorf("IPv6 backend %d: ID or frontend ID 0", k.ID)
		}
	}
	for k := range u.RevNat6 {
		if k.FrontendID == 0 {
			return fmt.Errorf("IPv6 rev-NAT entry of frontend 0")
		}
	}
	for _, k := range u.SrcRanges {
		if _, ok := k.Prefix(); !ok || k.FrontendID == 0 {
			return fmt.Errorf("source range %+v: frontend ID 0 or not a masked prefix", k)
		}
	}
	return nil
}

// ApplyServices implements ServiceDatapath.
func (l *Loader) ApplyServices(u *service.Update) error {
	if err := checkUpdate(u); err != nil {
		return fmt.Errorf("apply services: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.applyServices(u); err != nil {
		return fmt.Errorf("apply services (%s): %w", u, err)
	}
	return nil
}

func (l *Loader) applyServices(u *service.Update) error {
	if len(u.Backends) > 0 {
		keys := make([]service.BackendKey, 0, len(u.Backends))
		vals := make([]service.BackendValue, 0, len(u.Backends))
		for k, v := range u.Backends {
			keys = append(keys, k)
			vals = append(vals, v)
		}
		if err := batchPut(l.pod.LkLbBackends, keys, vals); err != nil {
			return fmt.Errorf("backends: %w", err)
		}
	}
	if err := putMap(l.pod.LkLbBackends6, u.Backends6); err != nil { // services6.go
		return fmt.Errorf("IPv6 backends: %w", err)
	}
	if err := l.putMaglev(u.Maglev); err != nil {
		return err
	}
	if err := putMap(l.pod.LkLbRevnat6, u.RevNat6); err != nil {
		return fmt.Errorf("IPv6 rev-NAT: %w", err)
	}
	if len(u.RevNat) > 0 {
		keys := make([]service.RevNatKey, 0, len(u.RevNat))
		vals := make([]service.RevNatValue, 0, len(u.RevNat))
		for k, v := range u.RevNat {
			keys = append(keys, k)
			vals = append(vals, v)
		}
		if err := batchPut(l.pod.LkLbRevnat, keys, vals); err != nil {
			return fmt.Errorf("rev-NAT: %w", err)
		}
	}
	if err := l.putSrcRanges(u.SrcRanges); err != nil { // services6.go
		return err
	}
	if len(u.Services) > 0 {
		keys := make([]service.ServiceKey, 0, len(u.Services))
		vals := make([]service.ServiceValue, 0, len(u.Services))
		for k, v := range u.Services {
			keys = append(keys, k)
			vals = append(vals, v)
		}
		if err := batchPut(l.pod.LkLbSvc, keys, vals); err != nil {
			return fmt.Errorf("services: %w", err)
		}
	}
	if err := putMap(l.pod.LkLbSvc6, u.Services6); err != nil {
		return fmt.Errorf("IPv6 services: %w", err)
	}
	for _, k := range u.ServiceDeletes {
		if err := deleteIfPresent(l.pod.LkLbSvc, k); err != nil {
			return fmt.Errorf("delete service %v:%d: %w", netip.AddrFrom4(k.Addr), k.Port, err)
		}
	}
	for _, k := range u.ServiceDeletes6 {
		if err := deleteIfPresent(l.pod.LkLbSvc6, k); err != nil {
			return fmt.Errorf("delete service [%v]:%d: %w", netip.AddrFrom16(k.Addr), k.Port, err)
		}
	}
	for _, k := range u.SrcRangeDeletes {
		if err := deleteIfPresent(l.pod.LkLbSrcRange, k); err != nil {
			return fmt.Errorf("delete source range of frontend %d: %w", k.FrontendID, err)
		}
	}
	for _, k := range u.RevNatDeletes { // IDs of either family
		if err := deleteIfPresent(l.pod.LkLbRevnat, k); err != nil {
			return fmt.Errorf("delete rev-NAT %d: %w", k.FrontendID, err)
		}
		if err := deleteIfPresent(l.pod.LkLbRevnat6, k); err != nil {
			return fmt.Errorf("delete rev-NAT %d: %w", k.FrontendID, err)
		}
	}
	if err := l.deleteMaglev(u.MaglevDeletes); err != nil {
		return err
	}
	for _, k := range u.BackendDeletes { // IDs of either family
		if err := deleteIfPresent(l.pod.LkLbBackends, k); err != nil {
			return fmt.Errorf("delete backend %d: %w", k.ID, err)
		}
		if err := deleteIfPresent(l.pod.LkLbBackends6, k); err != nil {
			return fmt.Errorf("delete backend %d: %w", k.ID, err)
		}
	}
	return nil
}

// batchPut writes keys/values in one BPF_MAP_UPDATE_BATCH (element by
// element where the kernel lacks batch operations).
func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	_, err := m.BatchUpdate(keys, vals, nil)
	if errors.Is(err, ebpf.ErrNotSupported) {
		for i := range keys {
			if err := m.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return err
}

func deleteIfPresent(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// putMaglev writes Maglev tables. A table whose size is unchanged is
// rewritten in place (one batch write into the frontend's array: a new flow
// racing with it may take a slot of the old or of the new table, both of
// which name backends that exist). A new or resized table is a new array of
// exactly its size, swapped into lk_lb_maglev. The swaps go in batches of
// maglevInstallBatch, because every write to a map of maps waits for an RCU
// grace period (maybe_wait_bpf_programs, ~10-20 ms here), once per syscall;
// a new array is a file descriptor until its batch is installed, so a batch
// bounds the descriptors an update holds whatever its size (an agent's
// first full set at 30,000 Services held one per Service and ran out of
// RLIMIT_NOFILE).
func (l *Loader) putMaglev(tables map[uint32]service.MaglevIDs) error {
	var (
		ids  []uint32
		fds  []uint32
		news []*ebpf.Map
	)
	closeNews := func() {
		for _, m := range news {
			m.Close()
		}
		ids, fds, news = ids[:0], fds[:0], news[:0]
	}
	defer closeNews()
	install := func() error {
		if len(ids) == 0 {
			return nil
		}
		if err := batchPut(l.pod.LkLbMaglev, ids, fds); err != nil {
			return fmt.Errorf("install %d maglev tables: %w", len(ids), err)
		}
		closeNews()
		return nil
	}
	for id, packed := range tables {
		table := packed.Table() // 4 bytes a slot for this write only
		if cur := l.maglevTable(id); cur != nil {
			same := cur.MaxEntries() == uint32(len(table))
			var err error
			if same {
				keys := make([]uint32, len(table))
				for i := range keys {
					keys[i] = uint32(i)
				}
				err = batchPut(cur, keys, table)
			}
			cur.Close()
			if same && err == nil {
				continue
			}
			if err != nil {
				return fmt.Errorf("maglev table of frontend %d: rewrite: %w", id, err)
			}
		}
		inner, err := ebpf.NewMap(&ebpf.MapSpec{
			Name: "lk_lb_maglev_in", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: uint32(len(table)),
			Flags: maglevFlags,
		})
		if err != nil {
			return fmt.Errorf("maglev table of frontend %d: create: %w", id, explainMapCreate(err, uint32(len(table)), maglevFlags))
		}
		news = append(news, inner)
		if err := fillArray(inner, table); err != nil {
			return fmt.Errorf("maglev table of frontend %d: fill: %w", id, err)
		}
		ids = append(ids, id)
		fds = append(fds, uint32(inner.FD()))
		if len(ids) == maglevInstallBatch {
			if err := install(); err != nil {
				return err
			}
		}
	}
	return install()
}

// maglevFlags are an inner Maglev array's flags, as the template in
// lb_maps.h.
const maglevFlags = unix.BPF_F_INNER_MAP | unix.BPF_F_MMAPABLE

// maglevInstallBatch is how many new Maglev arrays putMaglev installs with
// one write to lk_lb_maglev (and so holds open at most).
var maglevInstallBatch = 512

// arrayStride is an array map's element size for 4-byte values: the kernel
// rounds elements up to 8 bytes (round_up(value_size, 8) in arraymap.c).
const arrayStride = 8

// fillArray writes a new (not yet installed) mmapable u32 array in one copy.
func fillArray(m *ebpf.Map, vals []uint32) error {
	if len(vals) > int(m.MaxEntries()) {
		return fmt.Errorf("%d values for an array of %d", len(vals), m.MaxEntries())
	}
	return withArrayMapping(m, true, func(b []byte) {
		for i, v := range vals {
			nativeEndian.PutUint32(b[arrayStride*i:], v)
		}
	})
}

// withArrayMapping maps the u32 array m (BPF_F_MMAPABLE) into memory for fn
// and unmaps it when fn returns. Not ebpf.Map.Memory: its mapping lives
// until the garbage collector finds the Memory, and a full set of 100,000
// Services mapped 100,000 arrays between two collections — past
// vm.max_map_count (65,530 by default), where every mmap fails, the Go
// runtime's own too ("fatal error: runtime: out of memory").
func withArrayMapping(m *ebpf.Map, write bool, fn func([]byte)) error {
	size := arrayStride * int(m.MaxEntries())
	page := unix.Getpagesize()
	prot := unix.PROT_READ
	if write {
		prot |= unix.PROT_WRITE
	}
	b, err := unix.Mmap(m.FD(), 0, (size+page-1)/page*page, prot, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap array map: %w", err)
	}
	fn(b[:size])
	return unix.Munmap(b)
}

// maglevTable returns the array installed for frontend id, or nil.
func (l *Loader) maglevTable(id uint32) *ebpf.Map {
	var innerID uint32
	if err := l.pod.LkLbMaglev.Lookup(id, &innerID); err != nil {
		return nil
	}
	m, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
	if err != nil {
		return nil
	}
	return m
}

// deleteMaglev removes the tables of ids that are present, in one batch.
func (l *Loader) deleteMaglev(ids []uint32) error {
	var present []uint32
	var innerID uint32
	for _, id := range ids {
		if l.pod.LkLbMaglev.Lookup(id, &innerID) == nil {
			present = append(present, id)
		}
	}
	if len(present) == 0 {
		return nil
	}
	if _, err := l.pod.LkLbMaglev.BatchDelete(present, nil); err != nil {
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("delete %d maglev tables: %w", len(present), err)
		}
		for _, id := range present {
			if err := deleteIfPresent(l.pod.LkLbMaglev, id); err != nil {
				return fmt.Errorf("delete maglev table %d: %w", id, err)
			}
		}
	}
	return nil
}

// DumpServices implements ServiceDatapath.
func (l *Loader) DumpServices() (*service.Update, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := &service.Update{
		Backends: map[service.BackendKey]service.BackendValue{}, Maglev: map[uint32]service.MaglevIDs{},
		RevNat: map[service.RevNatKey]service.RevNatValue{}, Services: map[service.ServiceKey]service.ServiceValue{},
		Backends6: map[service.BackendKey]service.BackendValue6{}, RevNat6: map[service.RevNatKey]service.RevNatValue6{},
		Services6: map[service.ServiceKey6]service.ServiceValue{},
	}
	if err := dumpInto(l.pod.LkLbSvc, u.Services); err != nil {
		return nil, fmt.Errorf("dump services: %w", err)
	}
	if err := errors.Join(dumpInto(l.pod.LkLbSvc6, u.Services6), dumpInto(l.pod.LkLbBackends6, u.Backends6),
		dumpInto(l.pod.LkLbRevnat6, u.RevNat6)); err != nil {
		return nil, fmt.Errorf("dump IPv6 services: %w", err)
	}
	if err := dumpInto(l.pod.LkLbBackends, u.Backends); err != nil {
		return nil, fmt.Errorf("dump backends: %w", err)
	}
	if err := dumpInto(l.pod.LkLbRevnat, u.RevNat); err != nil {
		return nil, fmt.Errorf("dump rev-NAT: %w", err)
	}
	var (
		rk service.SrcRangeKey
		rv uint8
	)
	rit := l.pod.LkLbSrcRange.Iterate()
	for rit.Next(&rk, &rv) {
		u.SrcRanges = append(u.SrcRanges, rk)
	}
	if err := rit.Err(); err != nil {
		return nil, fmt.Errorf("dump source ranges: %w", err)
	}
	var (
		id, innerID uint32
		ids         = map[uint32]uint32{}
	)
	it := l.pod.LkLbMaglev.Iterate()
	for it.Next(&id, &innerID) {
		ids[id] = innerID
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump maglev: %w", err)
	}
	for id, innerID := range ids {
		inner, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
		if errors.Is(err, unix.ENOENT) {
			continue // replaced meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("dump maglev table %d: %w", id, err)
		}
		table, err := readArray(inner)
		inner.Close()
		if err != nil {
			return nil, fmt.Errorf("dump maglev table %d: %w", id, err)
		}
		u.Maglev[id] = service.MaglevIDsOf(table)
	}
	return u, nil
}

// readArray reads an mmapable u32 array.
func readArray(m *ebpf.Map) ([]uint32, error) {
	out := make([]uint32, m.MaxEntries())
	err := withArrayMapping(m, false, func(b []byte) {
		for i := range out {
			out[i] = nativeEndian.Uint32(b[arrayStride*i:])
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func dumpInto[K comparable, V any](m *ebpf.Map, out map[K]V) error {
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return it.Err()
}

// GCConntrack implements ServiceDatapath: both conntrack tables (lk_ct4,
// lk_ct6; gcCT in ct6.go), then the affinity table.
func (l *Loader) GCConntrack() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := monotonicNow()
	removed, err := gcCT(l.pod.LkCt4, l.pod.LkCtCount, now, func(k podCtKey) uint8 { return k.Proto })
	if err != nil {
		return removed, fmt.Errorf("conntrack gc: %w", err)
	}
	removed6, err := gcCT(l.pod.LkCt6, l.pod.LkCt6Count, now, func(k podCt6Key) uint8 { return k.Proto })
	removed += removed6
	if err != nil {
		return removed, fmt.Errorf("conntrack gc (IPv6): %w", err)
	}
	if err := l.gcAffinity(now); err != nil {
		return removed, err
	}
	return removed, nil
}

// walkCT visits every conntrack entry, in batches of ctBatch (one
// syscall per batch; element by element where the kernel lacks batches).
func walkCT[K any](m *ebpf.Map, visit func(K, podCtEntry)) error {
	keys := make([]K, ctBatch)
	vals := make([]podCtEntry, ctBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			visit(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return err
		}
	}
	var (
		k K
		v podCtEntry
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		visit(k, v)
	}
	return it.Err()
}

const ctBatch = 4096

// deleteExpiredCT deletes the entries of keys that are still expired when
// deleted. Between the walk that found them and the delete, the datapath may
// have refreshed an entry or replaced it with a new connection's (same tuple):
// each key is taken out with one atomic lookup-and-delete, and an entry that
// is not expired any more goes back (unless the datapath made a new one in
// that instant), so GC never removes a live flow's state. Returns how many it
// removed.
func deleteExpiredCT[K any](m *ebpf.Map, keys []K, expired func(K, podCtEntry) bool) (int, error) {
	removed := 0
	for _, k := range keys {
		var v podCtEntry
		err := m.LookupAndDelete(k, &v)
		if errors.Is(err, ebpf.ErrNotSupported) {
			// No atomic lookup-and-delete (kernel < 5.14): check, then delete.
			if err = m.Lookup(k, &v); err == nil {
				if !expired(k, v) {
					continue
				}
				err = m.Delete(k)
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return removed, err
		}
		if !expired(k, v) {
			if err := m.Update(k, v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
				return removed, fmt.Errorf("put back refreshed entry: %w", err)
			}
			continue
		}
		removed++
	}
	return removed, nil
}

// gcAffinity removes affinity entries of frontends that are gone or older
// than any affinity timeout.
func (l *Loader) gcAffinity(now uint64) error {
	var (
		k     podLbAffinityKey
		v     podLbAffinityValue
		stale []podLbAffinityKey
		rn    service.RevNatValue
	)
	it := l.pod.LkLbAffinity.Iterate()
	for it.Next(&k, &v) {
		old := now > v.LastUsed && time.Duration(now-v.LastUsed) > maxAffinity
		if old || errors.Is(l.pod.LkLbRevnat.Lookup(k.FrontendId, &rn), ebpf.ErrKeyNotExist) {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("affinity gc: %w", err)
	}
	for _, k := range stale {
		if err := deleteIfPresent(l.pod.LkLbAffinity, k); err != nil {
			return fmt.Errorf("affinity gc: %w", err)
		}
	}
	return nil
}

// ServiceStats implements ServiceDatapath.
func (l *Loader) ServiceStats() (ServiceStats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s ServiceStats
	var counts [4]uint64
	for i := range counts {
		if err := l.pod.LkCtCount.Lookup(uint32(i), &counts[i]); err != nil {
			return s, fmt.Errorf("service stats: conntrack counters: %w", err)
		}
	}
	s.ConntrackCreated = counts[ctCountCreated]
	s.ConntrackEvicted = counts[ctCountEvicted]
	s.ConntrackFailed = counts[ctCountFailed]
	if gone := counts[ctCountEvicted] + counts[ctCountGCRemoved]; counts[ctCountCreated] > gone {
		s.ConntrackEntries = counts[ctCountCreated] - gone
	}
	s.ConntrackCapacity = uint64(l.pod.LkCt4.MaxEntries())
	s.ConntrackEntries = min(s.ConntrackEntries, s.ConntrackCapacity)
	stats := make([]uint64, podLkLbStatLB_STAT_MAX)
	for i := range stats {
		var per []uint64
		if err := l.pod.LkLbStats.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("service stats: lb counters: %w", err)
		}
		for _, c := range per {
			stats[i] += c
		}
	}
	s.NewFlows = stats[podLkLbStatLB_STAT_NEW_FLOW]
	s.ConntrackHits = stats[podLkLbStatLB_STAT_CT_HIT]
	s.Reselected = stats[podLkLbStatLB_STAT_RESELECT]
	s.AffinityHits = stats[podLkLbStatLB_STAT_AFFINITY]
	s.RevNAT = stats[podLkLbStatLB_STAT_REVNAT]
	s.NoBackend = stats[podLkLbStatLB_STAT_NO_BACKEND]
	s.Hairpin = stats[podLkLbStatLB_STAT_HAIRPIN]
	s.NodePortLocal = stats[podLkLbStatLB_STAT_NODEPORT_LOCAL]
	s.NodePortSNAT = stats[podLkLbStatLB_STAT_NODEPORT_SNAT]
	s.Masqueraded = stats[podLkLbStatLB_STAT_MASQ]
	s.MasqueradedPackets = stats[podLkLbStatLB_STAT_MASQ_PKT]
	var err error
	s.Sock, err = l.sockStats()
	return s, err
}
