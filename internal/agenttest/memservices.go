package agenttest

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

var (
	_ datapath.ServiceDatapath = (*MemoryDatapath)(nil)
	_ datapath.PolicyDatapath  = (*MemoryDatapath)(nil)
)

// memServices is MemoryDatapath's copy of the service maps.
type memServices struct {
	svc    map[service.ServiceKey]service.ServiceValue
	back   map[service.BackendKey]service.BackendValue
	maglev map[uint32][]uint32
	revnat map[service.RevNatKey]service.RevNatValue
	// The IPv6 frontends' tables (service.Update's *6 fields).
	svc6    map[service.ServiceKey6]service.ServiceValue
	back6   map[service.BackendKey]service.BackendValue6
	revnat6 map[service.RevNatKey]service.RevNatValue6
	// Source ranges (lk_lb_src_range) of frontends of either family.
	srcRanges map[service.SrcRangeKey]bool
}

// memPolicy is MemoryDatapath's copy of the policy maps.
type memPolicy struct {
	ipcache  map[netip.Addr]policy.Identity
	cidrs    map[netip.Prefix]policy.Identity
	rules    map[policy.RuleKey]policy.RuleValue
	isolated map[policy.Identity]policy.Isolation
}

// ErrInjected is what MemoryDatapath returns while FailApply is set.
var ErrInjected = errors.New("injected datapath failure")

func (m *MemoryDatapath) initServices() {
	if m.svcs.svc == nil {
		m.svcs = memServices{svc: map[service.ServiceKey]service.ServiceValue{}, back: map[service.BackendKey]service.BackendValue{},
			maglev: map[uint32][]uint32{}, revnat: map[service.RevNatKey]service.RevNatValue{},
			svc6: map[service.ServiceKey6]service.ServiceValue{}, back6: map[service.BackendKey]service.BackendValue6{},
			revnat6: map[service.RevNatKey]service.RevNatValue6{}, srcRanges: map[service.SrcRangeKey]bool{}}
		m.pol = memPolicy{ipcache: map[netip.Addr]policy.Identity{}, cidrs: map[netip.Prefix]policy.Identity{},
			rules: map[policy.RuleKey]policy.RuleValue{}, isolated: map[policy.Identity]policy.Isolation{}}
	}
}

// SetFailApply makes ApplyServices and ApplyPolicy fail (true) or work again.
func (m *MemoryDatapath) SetFailApply(fail bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failApply = fail
}

// RefuseService makes ApplyServices refuse (ErrInjected, nothing applied)
// every update that writes frontend k's service entry, as the kernel
// refuses one frontend's Maglev array; false takes it back.
func (m *MemoryDatapath) RefuseService(k service.ServiceKey, refuse bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuseSvc == nil {
		m.refuseSvc = map[service.ServiceKey]bool{}
	}
	m.refuseSvc[k] = refuse
}

// ApplyServices applies u in the documented order.
func (m *MemoryDatapath) ApplyServices(u *service.Update) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failApply {
		return ErrInjected
	}
	for k := range u.Services {
		if m.refuseSvc[k] {
			return fmt.Errorf("service %v:%d: %w", netip.AddrFrom4(k.Addr), k.Port, ErrInjected)
		}
	}
	m.initServices()
	s := &m.svcs
	maps.Copy(s.back, u.Backends)
	for id, t := range u.Maglev {
		s.maglev[id] = t.Table()
	}
	maps.Copy(s.revnat, u.RevNat)
	for _, k := range u.SrcRanges {
		s.srcRanges[k] = true
	}
	maps.Copy(s.svc, u.Services)
	maps.Copy(s.back6, u.Backends6)
	maps.Copy(s.revnat6, u.RevNat6)
	maps.Copy(s.svc6, u.Services6)
	for _, k := range u.ServiceDeletes {
		delete(s.svc, k)
	}
	for _, k := range u.ServiceDeletes6 {
		delete(s.svc6, k)
	}
	for _, k := range u.SrcRangeDeletes {
		delete(s.srcRanges, k)
	}
	for _, k := range u.RevNatDeletes {
		delete(s.revnat, k)
		delete(s.revnat6, k)
	}
	for _, k := range u.MaglevDeletes {
		delete(s.maglev, k)
	}
	for _, k := range u.BackendDeletes {
		delete(s.back, k)
		delete(s.back6, k)
	}
	m.svcApplies++
	return nil
}

// DumpServices returns a copy of the service maps.
func (m *MemoryDatapath) DumpServices() (*service.Update, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initServices()
	u := &service.Update{Services: maps.Clone(m.svcs.svc), Backends: maps.Clone(m.svcs.back),
		Maglev: map[uint32]service.MaglevIDs{}, RevNat: maps.Clone(m.svcs.revnat),
		Services6: maps.Clone(m.svcs.svc6), Backends6: maps.Clone(m.svcs.back6), RevNat6: maps.Clone(m.svcs.revnat6)}
	for id, t := range m.svcs.maglev {
		u.Maglev[id] = service.MaglevIDsOf(slices.Clone(t))
	}
	for k := range m.svcs.srcRanges {
		u.SrcRanges = append(u.SrcRanges, k)
	}
	return u, nil
}

// GCConntrack counts calls; the memory datapath tracks no connections.
func (m *MemoryDatapath) GCConntrack() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gcCalls++
	return 0, nil
}

// GCCalls returns how often GCConntrack ran.
func (m *MemoryDatapath) GCCalls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gcCalls
}

// ServiceStats reports an empty conntrack table.
func (m *MemoryDatapath) ServiceStats() (datapath.ServiceStats, error) {
	return datapath.ServiceStats{ConntrackCapacity: 65536}, nil
}

// Resolve returns the backend a new flow to the frontend at key takes for a
// flow hash, as the BPF datapath would look it up: service map → Maglev
// table → backend map.
func (m *MemoryDatapath) Resolve(key service.ServiceKey, hash uint32) (netip.AddrPort, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initServices()
	v, ok := m.svcs.svc[key]
	if !ok || v.MaglevSize == 0 {
		return netip.AddrPort{}, false
	}
	t := m.svcs.maglev[v.FrontendID]
	if len(t) != int(v.MaglevSize) {
		return netip.AddrPort{}, false
	}
	b, ok := m.svcs.back[service.BackendKey{ID: t[hash%uint32(len(t))]}]
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4(b.Addr), b.Port), true
}

// SourceAllowed says whether a packet from src reaches the frontend at key
// as the BPF datapath decides it (bpf/lib/lb_maps.h lb_src_range_ok): the
// service value's ServiceFlagSrcRange, then a source-range entry of its
// frontend ID holding src. ok is false when there is no such frontend.
func (m *MemoryDatapath) SourceAllowed(key service.FrontendKey, src netip.Addr) (allowed, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initServices()
	var v service.ServiceValue
	if key.Addr.Is4() {
		v, ok = m.svcs.svc[service.ServiceKeyOf(key)]
	} else {
		v, ok = m.svcs.svc6[service.ServiceKey6Of(key)]
	}
	if !ok {
		return false, false
	}
	if v.Flags&service.ServiceFlagSrcRange == 0 {
		return true, true
	}
	for k := range m.svcs.srcRanges {
		if p, valid := k.Prefix(); valid && k.FrontendID == v.FrontendID && p.Contains(src) {
			return true, true
		}
	}
	return false, true
}

// SrcRangeEntries returns the number of source-range entries.
func (m *MemoryDatapath) SrcRangeEntries() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.svcs.srcRanges)
}

// ServiceEntries returns the number of entries in the service, backend,
// Maglev and rev-NAT maps.
func (m *MemoryDatapath) ServiceEntries() (svcs, backends, maglev, revnat int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.svcs.svc), len(m.svcs.back), len(m.svcs.maglev), len(m.svcs.revnat)
}

// ApplyPolicy applies u in the documented order.
func (m *MemoryDatapath) ApplyPolicy(u *policy.Update) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failApply {
		return ErrInjected
	}
	m.initServices()
	p := &m.pol
	maps.Copy(p.ipcache, u.IPCache)
	maps.Copy(p.cidrs, u.CIDRs)
	maps.Copy(p.rules, u.Rules)
	maps.Copy(p.isolated, u.Isolated)
	for _, k := range u.IsolatedDelete {
		delete(p.isolated, k)
	}
	for _, k := range u.RulesDelete {
		delete(p.rules, k)
	}
	for _, k := range u.CIDRsDelete {
		delete(p.cidrs, k)
	}
	for _, k := range u.IPCacheDelete {
		delete(p.ipcache, k)
	}
	return nil
}

// PolicyVerdicts returns what SetPolicyVerdict recorded.
func (m *MemoryDatapath) PolicyVerdicts() (map[uint32]datapath.PolicyVerdict, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.verdicts), nil
}

// SetPolicyVerdict sets the counters PolicyVerdicts reports for policy index i.
func (m *MemoryDatapath) SetPolicyVerdict(i uint32, v datapath.PolicyVerdict) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.verdicts == nil {
		m.verdicts = map[uint32]datapath.PolicyVerdict{}
	}
	m.verdicts[i] = v
}

// Allowed evaluates a packet against the policy maps the way the BPF
// datapath does (source egress AND destination ingress; an identity is
// allowed by default unless isolated; the ipcache, then the longest CIDR
// prefix, gives an address's identity).
func (m *MemoryDatapath) Allowed(src, dst netip.Addr, proto uint8, port uint16) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initServices()
	p := &m.pol
	idOf := func(ip netip.Addr) policy.Identity {
		if id, ok := p.ipcache[ip]; ok {
			return id
		}
		best, bits := policy.IdentityWorld, -1
		for pfx, id := range p.cidrs {
			if pfx.Contains(ip) && pfx.Bits() > bits {
				best, bits = id, pfx.Bits()
			}
		}
		return best
	}
	s, d := idOf(src), idOf(dst)
	check := func(subject policy.Identity, dir policy.Direction, peer policy.Identity, isolated bool) bool {
		if !isolated {
			return true
		}
		for _, pr := range []policy.Identity{peer, policy.IdentityAny} {
			for _, pt := range []uint8{proto, policy.ProtoAny} {
				for k := range p.rules {
					if k.Subject != subject || k.Direction != dir || k.Peer != pr || k.Proto != pt {
						continue
					}
					if k.PortPrefix == 0 || port>>(16-k.PortPrefix) == k.Port>>(16-k.PortPrefix) {
						return true
					}
				}
			}
		}
		return false
	}
	_, srcEP := p.ipcache[src]
	_, dstEP := p.ipcache[dst]
	egressOK := !srcEP || check(s, policy.Egress, d, p.isolated[s].PolicyEgress != 0)
	ingressOK := !dstEP || check(d, policy.Ingress, s, p.isolated[d].PolicyIngress != 0)
	return egressOK && ingressOK
}

// PolicyEntries returns the number of entries in the ipcache, CIDR, rule and
// isolation maps.
func (m *MemoryDatapath) PolicyEntries() (ipcache, cidrs, rules, isolated int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pol.ipcache), len(m.pol.cidrs), len(m.pol.rules), len(m.pol.isolated)
}

// IdentityOf returns the identity the ipcache holds for ip.
func (m *MemoryDatapath) IdentityOf(ip netip.Addr) (policy.Identity, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.pol.ipcache[ip]
	return id, ok
}

// DumpPolicy returns a copy of the policy maps as a Compiled (maps only).
func (m *MemoryDatapath) DumpPolicy() (*policy.Compiled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initServices()
	return &policy.Compiled{IPCache: maps.Clone(m.pol.ipcache), CIDRs: maps.Clone(m.pol.cidrs),
		Rules: maps.Clone(m.pol.rules), Isolated: maps.Clone(m.pol.isolated)}, nil
}
