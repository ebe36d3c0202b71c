package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/policy"
)

// PolicyDatapath is NetworkPolicy enforcement as the agent drives it (the
// agent type-asserts it on its Datapath). The BPF side is bpf/lib/policy.h.
type PolicyDatapath interface {
	// ApplyPolicy writes u (policy.Diff of the last applied and the new
	// compilation) into the pinned maps in u's documented order. It checks
	// all of u before writing anything; it is idempotent.
	ApplyPolicy(u *policy.Update) error
	// PolicyVerdicts returns the verdict counters of every policy index
	// that has counted something, keyed by policy.RuleValue.Policy (the
	// index into Compiled.Policies of the compilation applied).
	PolicyVerdicts() (map[uint32]PolicyVerdict, error)
}

var _ PolicyDatapath = (*Loader)(nil)

// PolicyVerdict counts the packets a policy decided, summed over CPUs.
// Allowed: new connections a rule of the policy allowed (later packets of
// an allowed connection are not re-evaluated). Denied: packets dropped
// because the policy isolates the endpoint (the first isolating policy is
// charged) and no rule allowed them.
type PolicyVerdict struct {
	Allowed, Denied uint64
}

// MaxPolicies bounds policy indices (lk_policy_verdicts' size, fixed): a
// compilation with more policies is refused. The other policy maps are
// sized by Config (PolicySizes).
const MaxPolicies = 16384

// IdentityHost is the reserved identity of the node's own addresses in
// lk_policy_ipcache (LK_IDENTITY_HOST, SetPolicyHostAddrs); pkg/policy never
// allocates it.
const IdentityHost policy.Identity = 1

// SetPolicyHostAddrs makes addrs (IPv4 and IPv6) the node's own addresses for policy
// (replacing the previous set): Kubernetes does not let a pod block its node
// (kubelet probes). Traffic from the node into a pod does not pass the BPF
// programs; what a pod sends to these addresses passes its egress policy when
// it is shaped like an answer (TCP other than a bare SYN, ICMP echo reply or
// error). New connections from the pod to the node stay subject to its egress
// policy (an ipBlock can allow them). The agent calls it with every address
// of the node netns, at start and whenever they change (pkg/agent's
// hostaddrs.go).
func (l *Loader) SetPolicyHostAddrs(addrs []netip.Addr) error {
	want4 := map[uint32]bool{}
	want6 := map[[16]byte]bool{}
	for _, a := range addrs {
		switch {
		case a.Is4():
			want4[ipKey(a.As4())] = true
		case a.Is6() && !a.Is4In6():
			want6[a.As16()] = true
		default:
			return fmt.Errorf("set policy host addresses: %v is not an IPv4 or IPv6 address", a)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := setHostIdentities(l.pod.LkPolicyIpcache, want4); err != nil {
		return fmt.Errorf("set policy host addresses: %w", err)
	}
	if err := setHostIdentities(l.pod.LkPolicyIpcache6, want6); err != nil {
		return fmt.Errorf("set policy host addresses: %w", err)
	}
	return nil
}

// setHostIdentities makes want the keys of m (an ipcache of either family)
// with IdentityHost.
func setHostIdentities[K comparable](m *ebpf.Map, want map[K]bool) error {
	var (
		k     K
		id    uint32
		stale []K
	)
	it := m.Iterate()
	for it.Next(&k, &id) {
		if policy.Identity(id) == IdentityHost && !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for k := range want {
		if err := m.Put(k, uint32(IdentityHost)); err != nil {
			return err
		}
	}
	for _, k := range stale {
		if err := deleteIgnoreMissing(m, k); err != nil {
			return err
		}
	}
	return nil
}

// PolicyMapCounts are the entry counts of the policy maps (both families
// summed).
type PolicyMapCounts struct {
	IPCache, CIDRs, Isolated, Rules int
}

// policyKey is the C struct policy_key of k: the port in network order.
func policyKey(k policy.RuleKey) podPolicyKey {
	return podPolicyKey{Prefixlen: k.PrefixLen(), Subject: uint32(k.Subject), Peer: uint32(k.Peer),
		Direction: uint8(k.Direction), Proto: k.Proto, Port: portNetOrder(k.Port)}
}

// portNetOrder swaps a port between host and network order (its own inverse).
func portNetOrder(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return nativeEndian.Uint16(b[:])
}

func cidrKey(p netip.Prefix) podPolicyCidrKey {
	return podPolicyCidrKey{Prefixlen: uint32(p.Bits()), Addr: ipKey(p.Addr().As4())}
}

func cidr6Key(p netip.Prefix) podPolicyCidr6Key {
	return podPolicyCidr6Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// isIP6 reports whether a is an IPv6 address the datapath keys as such (an
// IPv4-mapped address is neither family's).
func isIP6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// policyIPMap returns the ipcache of ip's family and its key.
func (l *Loader) policyIPMap(ip netip.Addr) (*ebpf.Map, any) {
	if ip.Is4() {
		return l.pod.LkPolicyIpcache, ipKey(ip.As4())
	}
	return l.pod.LkPolicyIpcache6, ip.As16()
}

// policyCIDRMap returns the ipBlock trie of p's family and p's key.
func (l *Loader) policyCIDRMap(p netip.Prefix) (*ebpf.Map, any) {
	if p.Addr().Is4() {
		return l.pod.LkPolicyCidrs, cidrKey(p)
	}
	return l.pod.LkPolicyCidrs6, cidr6Key(p)
}

// validatePolicyUpdate checks everything ApplyPolicy will write, so that an
// update is refused whole rather than half applied.
func validatePolicyUpdate(u *policy.Update, sizes PolicySizes) error {
	for ip, id := range u.IPCache {
		if !ip.Is4() && !isIP6(ip) {
			return fmt.Errorf("ipcache: %v is not an IPv4 or IPv6 address", ip)
		}
		if id == policy.IdentityAny || id == IdentityHost || id.IsCIDR() {
			return fmt.Errorf("ipcache: %v: identity %d is not an endpoint identity", ip, id)
		}
	}
	for _, ip := range u.IPCacheDelete {
		if !ip.Is4() && !isIP6(ip) {
			return fmt.Errorf("ipcache delete: %v is not an IPv4 or IPv6 address", ip)
		}
	}
	for p, id := range u.CIDRs {
		if !p.IsValid() || (!p.Addr().Is4() && !isIP6(p.Addr())) || p.Masked() != p {
			return fmt.Errorf("cidrs: %v is not a masked IPv4 or IPv6 prefix", p)
		}
		if !id.IsCIDR() {
			return fmt.Errorf("cidrs: %v: identity %d is not a CIDR identity", p, id)
		}
	}
	for _, p := range u.CIDRsDelete {
		if !p.IsValid() || (!p.Addr().Is4() && !isIP6(p.Addr())) {
			return fmt.Errorf("cidrs delete: %v is not an IPv4 or IPv6 prefix", p)
		}
	}
	checkKey := func(what string, k policy.RuleKey) error {
		if k.PortPrefix > 16 || k.Direction > policy.Egress || k.Subject == policy.IdentityAny {
			return fmt.Errorf("%s: invalid key %+v", what, k)
		}
		if mask := ^uint16(0) >> k.PortPrefix; k.PortPrefix < 16 && k.Port&mask != 0 {
			return fmt.Errorf("%s: port %d has bits beyond its prefix /%d", what, k.Port, k.PortPrefix)
		}
		return nil
	}
	for k, v := range u.Rules {
		if err := checkKey("rules", k); err != nil {
			return err
		}
		if v.Policy >= MaxPolicies {
			return fmt.Errorf("rules: policy index %d exceeds the datapath's %d policies", v.Policy, MaxPolicies)
		}
	}
	for _, k := range u.RulesDelete {
		if err := checkKey("rules delete", k); err != nil {
			return err
		}
	}
	for id, iso := range u.Isolated {
		if id == policy.IdentityAny {
			return fmt.Errorf("isolated: identity 0")
		}
		if iso.PolicyIngress > MaxPolicies || iso.PolicyEgress > MaxPolicies {
			return fmt.Errorf("isolated: identity %d: policy index beyond the datapath's %d policies", id, MaxPolicies)
		}
	}
	if n := len(u.Rules); n > sizes.Rules {
		return fmt.Errorf("rules: %d upserts exceed the map's %d entries (lanekitd --policy-rules)", n, sizes.Rules)
	}
	return nil
}

// ApplyPolicy implements PolicyDatapath: upserts (ipcache, CIDRs, rules,
// then isolation, so a newly isolated identity already has its allow rules),
// then deletes (isolation first, so nothing turns default-deny without its
// rules; then rules, CIDRs, ipcache). Deleting what is missing is no error.
// Everything is checked before the first write; a map error after that (a
// full map) stops the update there and is returned: the maps then hold the
// operations before it, in the order above, and applying the same update
// again (upserts and deletes are idempotent) completes it.
func (l *Loader) ApplyPolicy(u *policy.Update) error {
	if u == nil {
		return nil
	}
	if err := validatePolicyUpdate(u, l.cfg.PolicySizes()); err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := &l.pod
	put := func(mp *ebpf.Map, k, v any) error {
		if err := mp.Put(k, v); err != nil {
			return fmt.Errorf("apply policy: update %s: %w", mp, err)
		}
		return nil
	}
	del := func(mp *ebpf.Map, k any) error {
		if err := deleteIgnoreMissing(mp, k); err != nil {
			return fmt.Errorf("apply policy: %w", err)
		}
		return nil
	}
	// Fail closed: a pod a new policy selects is isolated before anything
	// else is written, and a pod no policy selects any more is opened last
	// (first only when the isolation map is full and needs its room);
	// removed allows and prefixes go before new ones (a full map gets the
	// room back first). An update that stops at an error therefore leaves
	// the pods it touches denied, not open; the agent keeps it queued and
	// applies it whole again (every step is idempotent).
	isolate := func() error {
		for id, iso := range u.Isolated {
			val := podPolicyIsolation{PolicyIngress: iso.PolicyIngress, PolicyEgress: iso.PolicyEgress}
			if err := put(m.LkPolicyIsolation, uint32(id), val); err != nil {
				return err
			}
		}
		return nil
	}
	if err := isolate(); err != nil {
		if !errors.Is(err, unix.E2BIG) {
			return err
		}
		// A full isolation map (the agent fits the compilation to its
		// size, so an update that swaps identities needs the room the
		// entries it deletes hold): delete those first. They open pods
		// this update opens anyway, a moment earlier.
		for _, id := range u.IsolatedDelete {
			if err := del(m.LkPolicyIsolation, uint32(id)); err != nil {
				return err
			}
		}
		if err := isolate(); err != nil {
			return err
		}
	}
	for _, k := range u.RulesDelete {
		if err := del(m.LkPolicyRules, policyKey(k)); err != nil {
			return err
		}
	}
	for _, p := range u.CIDRsDelete {
		if err := del(l.policyCIDRMap(p.Masked())); err != nil {
			return err
		}
	}
	for _, ip := range u.IPCacheDelete {
		if err := del(l.policyIPMap(ip)); err != nil {
			return err
		}
	}
	for ip, id := range u.IPCache {
		mp, k := l.policyIPMap(ip)
		if err := put(mp, k, uint32(id)); err != nil {
			return err
		}
	}
	for p, id := range u.CIDRs {
		mp, k := l.policyCIDRMap(p)
		if err := put(mp, k, uint32(id)); err != nil {
			return err
		}
	}
	for k, v := range u.Rules {
		if err := put(m.LkPolicyRules, policyKey(k), podPolicyValue{Policy: v.Policy}); err != nil {
			return err
		}
	}
	for _, id := range u.IsolatedDelete {
		if err := del(m.LkPolicyIsolation, uint32(id)); err != nil {
			return err
		}
	}
	return nil
}

// PolicyVerdicts implements PolicyDatapath.
func (l *Loader) PolicyVerdicts() (map[uint32]PolicyVerdict, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint32]PolicyVerdict{}
	var (
		idx  uint32
		vals []podPolicyVerdict
	)
	it := l.pod.LkPolicyVerdicts.Iterate()
	for it.Next(&idx, &vals) {
		var v PolicyVerdict
		for _, c := range vals {
			v.Allowed += c.Allowed
			v.Denied += c.Denied
		}
		if v != (PolicyVerdict{}) {
			out[idx] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read policy verdicts: %w", err)
	}
	return out, nil
}

// DumpPolicy returns what the pinned policy maps hold as a Compiled (maps
// only: no Policies or Warnings), for a restarted agent to policy.Diff its
// first compilation against (re-adoption without a flush).
func (l *Loader) DumpPolicy() (*policy.Compiled, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := &policy.Compiled{IPCache: map[netip.Addr]policy.Identity{}, CIDRs: map[netip.Prefix]policy.Identity{},
		Isolated: map[policy.Identity]policy.Isolation{}, Rules: map[policy.RuleKey]policy.RuleValue{}}
	var (
		ip4 uint32
		id  uint32
		ck  podPolicyCidrKey
		rk  podPolicyKey
		rv  podPolicyValue
		iso podPolicyIsolation
	)
	var errs []error
	it := l.pod.LkPolicyIpcache.Iterate()
	for it.Next(&ip4, &id) {
		if policy.Identity(id) == IdentityHost {
			continue // SetPolicyHostAddrs', not a compilation's
		}
		var a [4]byte
		nativeEndian.PutUint32(a[:], ip4)
		c.IPCache[netip.AddrFrom4(a)] = policy.Identity(id)
	}
	errs = append(errs, it.Err())
	var ip6 [16]byte
	it = l.pod.LkPolicyIpcache6.Iterate()
	for it.Next(&ip6, &id) {
		if policy.Identity(id) == IdentityHost {
			continue
		}
		c.IPCache[netip.AddrFrom16(ip6)] = policy.Identity(id)
	}
	errs = append(errs, it.Err())
	var ck6 podPolicyCidr6Key
	it = l.pod.LkPolicyCidrs6.Iterate()
	for it.Next(&ck6, &id) {
		c.CIDRs[netip.PrefixFrom(netip.AddrFrom16(ck6.Addr), int(ck6.Prefixlen))] = policy.Identity(id)
	}
	errs = append(errs, it.Err())
	it = l.pod.LkPolicyCidrs.Iterate()
	for it.Next(&ck, &id) {
		var a [4]byte
		nativeEndian.PutUint32(a[:], ck.Addr)
		c.CIDRs[netip.PrefixFrom(netip.AddrFrom4(a), int(ck.Prefixlen))] = policy.Identity(id)
	}
	errs = append(errs, it.Err())
	it = l.pod.LkPolicyRules.Iterate()
	for it.Next(&rk, &rv) {
		k := policy.RuleKey{Subject: policy.Identity(rk.Subject), Peer: policy.Identity(rk.Peer),
			Direction: policy.Direction(rk.Direction), Proto: rk.Proto, Port: portNetOrder(rk.Port), PortPrefix: uint8(rk.Prefixlen - 80)}
		c.Rules[k] = policy.RuleValue{Policy: rv.Policy}
	}
	errs = append(errs, it.Err())
	it = l.pod.LkPolicyIsolation.Iterate()
	for it.Next(&id, &iso) {
		c.Isolated[policy.Identity(id)] = policy.Isolation{PolicyIngress: iso.PolicyIngress, PolicyEgress: iso.PolicyEgress}
	}
	errs = append(errs, it.Err())
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("dump policy maps: %w", err)
	}
	return c, nil
}

// PolicyMapCounts counts the entries of the policy maps.
func (l *Loader) PolicyMapCounts() (PolicyMapCounts, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var c PolicyMapCounts
	var (
		e      [6]error
		n6, c6 int
	)
	c.IPCache, e[0] = countEntries(l.pod.LkPolicyIpcache)
	c.CIDRs, e[1] = countEntries(l.pod.LkPolicyCidrs)
	c.Isolated, e[2] = countEntries(l.pod.LkPolicyIsolation)
	c.Rules, e[3] = countEntries(l.pod.LkPolicyRules)
	n6, e[4] = countEntries(l.pod.LkPolicyIpcache6)
	c6, e[5] = countEntries(l.pod.LkPolicyCidrs6)
	c.IPCache += n6
	c.CIDRs += c6
	if err := errors.Join(e[:]...); err != nil {
		return c, fmt.Errorf("count policy map entries: %w", err)
	}
	return c, nil
}
