package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// Proto numbers in rule keys; ProtoAny matches every protocol.
const (
	ProtoAny  uint8 = 0
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Direction of a rule, seen from its subject endpoint.
type Direction uint8

const (
	Ingress Direction = 0
	Egress  Direction = 1
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// NamedPort is a container port with a name (from the pod spec), needed to
// resolve NetworkPolicy ports given by name.
type NamedPort struct {
	Name  string
	Proto uint8
	Port  uint16
}

// Endpoint is a pod or VM endpoint as policy sees it.
type Endpoint struct {
	Namespace string
	Name      string
	Labels    map[string]string
	// IP is the endpoint's IPv4 address; IP6 its IPv6 address (invalid:
	// none). Either may be missing, not both; both get the endpoint's
	// identity.
	IP         netip.Addr
	IP6        netip.Addr
	NamedPorts []NamedPort
	// Local: the endpoint is on this node (its addresses and isolation
	// go into the maps first when they are full: fit.go).
	Local bool
}

// Input is everything a compilation needs.
type Input struct {
	Endpoints []Endpoint
	// NamespaceLabels: labels of each namespace; kubernetes.io/metadata.name
	// is added as Kubernetes does. Namespaces not listed have only that label.
	NamespaceLabels map[string]map[string]string
	Policies        []*networkingv1.NetworkPolicy
	// Limits are the sizes of the maps the result must fit (fit.go).
	Limits Limits
	// Validated: the caller validated every policy (k8sobj.Validate) when it
	// took it, so Compile does not again. The agent compiles its whole set
	// on every change; validating a thousand policies each time was a third
	// of that work.
	Validated bool
}

// RuleKey keys the policy map (C: struct policy_key, an LPM trie key). The
// fixed part is Subject, Direction, Peer and Proto; PortPrefix is the number of
// leading bits of Port that must match (0 = any port, 16 = exactly Port). A
// datapath looks up (subject, dir, peer, proto, port) with the peer as is and
// as IdentityAny, and the proto as is and as ProtoAny: four LPM lookups.
type RuleKey struct {
	Subject    Identity
	Peer       Identity
	Direction  Direction
	Proto      uint8
	Port       uint16
	PortPrefix uint8
	_          [3]byte
}

// PrefixLen is the LPM trie prefix length of the key in bits, counting the
// fixed fields (Subject 32, Peer 32, Direction 8, Proto 8) plus PortPrefix.
func (k RuleKey) PrefixLen() uint32 { return 80 + uint32(k.PortPrefix) }

// RuleValue is the policy map value: which policy (index into
// Compiled.Policies) allowed the traffic, for per-policy verdict counters.
type RuleValue struct{ Policy uint32 }

// Isolation is the per-identity default-deny state (C: struct policy_isolation,
// keyed by identity): a direction is default-deny when Policy{In,E}gress ≠ 0;
// the value is 1 + the index of the first policy that isolates it.
type Isolation struct {
	PolicyIngress uint32
	PolicyEgress  uint32
}

// PolicyRef names a compiled policy.
type PolicyRef struct{ Namespace, Name string }

func (r PolicyRef) String() string { return r.Namespace + "/" + r.Name }

// Compiled is the datapath-ready result.
type Compiled struct {
	// Policies in input order; RuleValue.Policy indexes it.
	Policies []PolicyRef
	// IPCache maps endpoint IPs (IPv4 and IPv6) to their identity (exact
	// entries).
	IPCache map[netip.Addr]Identity
	// CIDRs maps every ipBlock prefix (and 0.0.0.0/0 → IdentityWorld, ::/0
	// → IdentityWorld6) to its CIDR identity; a non-endpoint IP resolves by
	// longest prefix match within its family.
	CIDRs map[netip.Prefix]Identity
	// Isolated lists identities that are default-deny in some direction.
	Isolated map[Identity]Isolation
	// Rules are the allow entries.
	Rules map[RuleKey]RuleValue
	// LeftOut are the policies whose allow rules or ipBlock prefixes did
	// not fit Limits, in input order: Rules and CIDRs hold none of theirs,
	// Isolated still isolates their pods (fit.go).
	LeftOut []LeftOut
	// Overflow counts the addresses (by ipcache map) and isolation entries
	// Limits had no room for (fit.go).
	Overflow map[string]int
	// Unpoliced are the addresses of local endpoints (Endpoint.Local) whose
	// ipcache or isolation entry did not fit: the datapath does not enforce
	// their policy (fit.go).
	Unpoliced []netip.Addr
	// Warnings: named ports whose number differs between endpoints of one
	// identity (the compiled rule allows all those numbers); named ports in
	// egress rules with an ipBlock peer (they match nothing through it).
	Warnings []string
}

// identityState is the per-compilation view of one endpoint identity.
type identityState struct {
	id     Identity
	ns     string
	labels labels.Set
	ports  map[string]map[portProto]bool // name → numbers
}

type portProto struct {
	proto uint8
	port  uint16
}

// Compile compiles the input into in.Limits (fit.go: what does not fit is
// left out, failing closed, and named in LeftOut and Overflow). Policies are
// validated (k8sobj.Validate), unless in.Validated, and an invalid one fails
// the whole compilation, naming it.
func Compile(in Input, ids *Identities) (*Compiled, error) {
	c := &Compiled{IPCache: map[netip.Addr]Identity{}, CIDRs: map[netip.Prefix]Identity{},
		Isolated: map[Identity]Isolation{}, Rules: map[RuleKey]RuleValue{}}
	for _, p := range in.Policies {
		if !in.Validated {
			if err := k8sobj.Validate(k8sobj.Object{Kind: k8sobj.KindNetworkPolicy, NetworkPolicy: p}); err != nil {
				return nil, fmt.Errorf("networkpolicy %s/%s: %w", p.Namespace, p.Name, err)
			}
		}
		c.Policies = append(c.Policies, PolicyRef{p.Namespace, p.Name})
	}
	// Endpoint identities.
	states := map[Identity]*identityState{}
	for _, ep := range in.Endpoints {
		if ep.IP.IsValid() && !ep.IP.Is4() {
			return nil, fmt.Errorf("endpoint %s/%s: IP: IPv4 address required, got %v", ep.Namespace, ep.Name, ep.IP)
		}
		if ep.IP6.IsValid() && (!ep.IP6.Is6() || ep.IP6.Is4In6()) {
			return nil, fmt.Errorf("endpoint %s/%s: IP6: IPv6 address required, got %v", ep.Namespace, ep.Name, ep.IP6)
		}
		if !ep.IP.IsValid() && !ep.IP6.IsValid() {
			return nil, fmt.Errorf("endpoint %s/%s: no address", ep.Namespace, ep.Name)
		}
		id := ids.ForLabels(ep.Namespace, ep.Labels)
		for _, ip := range []netip.Addr{ep.IP, ep.IP6} {
			if !ip.IsValid() {
				continue
			}
			if prev, dup := c.IPCache[ip]; dup {
				return nil, fmt.Errorf("endpoint %s/%s: IP %s already used (identity %d)", ep.Namespace, ep.Name, ip, prev)
			}
			c.IPCache[ip] = id
		}
		st := states[id]
		if st == nil {
			st = &identityState{id: id, ns: ep.Namespace, labels: labels.Set(ep.Labels), ports: map[string]map[portProto]bool{}}
			states[id] = st
		}
		for _, np := range ep.NamedPorts {
			if st.ports[np.Name] == nil {
				st.ports[np.Name] = map[portProto]bool{}
			}
			st.ports[np.Name][portProto{np.Proto, np.Port}] = true
		}
	}
	byID := slices.SortedFunc(maps.Values(states), func(a, b *identityState) int { return cmp.Compare(a.id, b.id) })
	for _, st := range byID {
		for _, name := range slices.Sorted(maps.Keys(st.ports)) {
			if len(st.ports[name]) > 1 {
				c.Warnings = append(c.Warnings, fmt.Sprintf("identity %d (namespace %s): port name %q maps to %d different numbers; all are allowed",
					st.id, st.ns, name, len(st.ports[name])))
			}
		}
	}
	// CIDR identities: every prefix that appears in an ipBlock of a policy
	// whose prefixes fit (fit.go).
	c.CIDRs[netip.MustParsePrefix("0.0.0.0/0")] = IdentityWorld
	c.CIDRs[netip.MustParsePrefix("::/0")] = IdentityWorld6
	order := fitOrder(in.Policies)
	left := fitCIDRs(c, in, order, ids)
	if len(c.CIDRs) >= int(firstEndpointIdentity-firstCIDRIdentity) {
		return nil, fmt.Errorf("too many distinct ipBlock prefixes (%d)", len(c.CIDRs))
	}
	nsLabels := func(ns string) labels.Set {
		l := labels.Set{}
		maps.Copy(l, in.NamespaceLabels[ns])
		l[MetadataNameLabel] = ns
		return l
	}
	comp := compiler{c: c, cidrs: slices.SortedFunc(maps.Keys(c.CIDRs), netip.Prefix.Compare), states: byID, nsLabels: nsLabels}
	// Every policy isolates its pods, whether its rules fit or not: a pod
	// whose policy is left out stays isolated (fail closed).
	for i, p := range in.Policies {
		comp.isolate(uint32(i), p)
	}
	fitRules(&comp, in, order, left)
	for _, p := range in.Policies {
		for j, r := range p.Spec.Egress {
			if hasNamedPort(r.Ports) && slices.ContainsFunc(r.To, func(pr networkingv1.NetworkPolicyPeer) bool { return pr.IPBlock != nil }) {
				c.Warnings = append(c.Warnings, fmt.Sprintf("networkpolicy %s/%s: spec.egress[%d]: a named port matches nothing through an ipBlock peer (use a number)",
					p.Namespace, p.Name, j))
			}
		}
	}
	fitAddrs(c, in)
	fitIsolation(c, in, ids)
	c.LeftOut = sortedLeftOut(left)
	return c, nil
}

func allPeers(p *networkingv1.NetworkPolicy) []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for _, r := range p.Spec.Ingress {
		out = append(out, r.From...)
	}
	for _, r := range p.Spec.Egress {
		out = append(out, r.To...)
	}
	return out
}

// EffectivePolicyTypes returns the directions a policy governs, with the
// Kubernetes defaulting: [Ingress] plus Egress if it has egress rules.
func EffectivePolicyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

type compiler struct {
	c *Compiled
	// cidrs are c.CIDRs's prefixes (all masked) sorted by address, then
	// length (netip.Prefix.Compare): the known prefixes inside an ipBlock
	// are a run of it (peers).
	cidrs []netip.Prefix
	// out collects the rules of the policy being compiled: keys c.Rules
	// lacks or holds for a later policy (fit.go).
	out      map[RuleKey]RuleValue
	states   []*identityState
	nsLabels func(string) labels.Set
}

func mustSelector(s *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		panic(fmt.Sprintf("validated selector does not parse: %v", err)) // Compile validated it
	}
	return sel
}

// subjects are the endpoint identities p selects.
func (cp *compiler) subjects(p *networkingv1.NetworkPolicy) []*identityState {
	podSel := mustSelector(&p.Spec.PodSelector)
	var out []*identityState
	for _, st := range cp.states {
		if st.ns == p.Namespace && podSel.Matches(st.labels) {
			out = append(out, st)
		}
	}
	return out
}

// isolate makes p's subjects default-deny in the directions p governs.
func (cp *compiler) isolate(idx uint32, p *networkingv1.NetworkPolicy) {
	ing, egr := EffectivePolicyTypes(p)
	for _, s := range cp.subjects(p) {
		iso := cp.c.Isolated[s.id]
		if ing && iso.PolicyIngress == 0 {
			iso.PolicyIngress = idx + 1
		}
		if egr && iso.PolicyEgress == 0 {
			iso.PolicyEgress = idx + 1
		}
		cp.c.Isolated[s.id] = iso
	}
}

// rules compiles p's allow rules into cp.out (fit.go merges them).
func (cp *compiler) rules(idx uint32, p *networkingv1.NetworkPolicy) {
	subjects := cp.subjects(p)
	ing, egr := EffectivePolicyTypes(p)
	if ing {
		for _, r := range p.Spec.Ingress {
			cp.rule(idx, p.Namespace, subjects, Ingress, r.From, r.Ports)
		}
	}
	if egr {
		for _, r := range p.Spec.Egress {
			cp.rule(idx, p.Namespace, subjects, Egress, r.To, r.Ports)
		}
	}
}

// peer is a resolved rule peer: an identity, or IdentityAny for "all peers".
type peer struct {
	id    Identity
	state *identityState // nil for CIDR identities and IdentityAny
}

func (cp *compiler) peers(ns string, from []networkingv1.NetworkPolicyPeer) []peer {
	if len(from) == 0 {
		return []peer{{id: IdentityAny}}
	}
	set := map[Identity]*identityState{}
	for _, pr := range from {
		if b := pr.IPBlock; b != nil {
			cidr := netip.MustParsePrefix(b.CIDR).Masked()
			var except []netip.Prefix
			for _, e := range b.Except {
				except = append(except, netip.MustParsePrefix(e).Masked())
			}
			// A non-endpoint IP resolves to its longest matching known
			// prefix P; it is in cidr∖except exactly when P ⊆ cidr and P ⊄
			// every except prefix.
			for _, pfx := range cp.inside(cidr) {
				if slices.ContainsFunc(except, func(e netip.Prefix) bool { return within(pfx, e) }) {
					continue
				}
				set[cp.c.CIDRs[pfx]] = nil
			}
			continue
		}
		var nsSel, podSel labels.Selector
		if pr.NamespaceSelector != nil {
			nsSel = mustSelector(pr.NamespaceSelector)
		}
		if pr.PodSelector != nil {
			podSel = mustSelector(pr.PodSelector)
		}
		for _, st := range cp.states {
			if nsSel == nil {
				if st.ns != ns { // podSelector alone: the policy's namespace
					continue
				}
			} else if !nsSel.Matches(cp.nsLabels(st.ns)) {
				continue
			}
			if podSel != nil && !podSel.Matches(st.labels) {
				continue
			}
			set[st.id] = st
		}
	}
	out := make([]peer, 0, len(set))
	for _, id := range slices.Sorted(maps.Keys(set)) {
		out = append(out, peer{id: id, state: set[id]})
	}
	return out
}

// inside returns the known prefixes (cp.cidrs) contained in cidr (masked):
// those whose address lies in cidr's range and that are at least as long.
// A binary search and the run that follows, instead of every known prefix:
// a policy set with n ipBlocks compiled in O(n log n), not O(n²).
func (cp *compiler) inside(cidr netip.Prefix) []netip.Prefix {
	i, _ := slices.BinarySearchFunc(cp.cidrs, cidr.Addr(), func(p netip.Prefix, a netip.Addr) int { return p.Addr().Compare(a) })
	var out []netip.Prefix
	for _, p := range cp.cidrs[i:] {
		if !cidr.Contains(p.Addr()) {
			break
		}
		if p.Bits() >= cidr.Bits() {
			out = append(out, p)
		}
	}
	return out
}

// within reports whether prefix a is contained in prefix b.
func within(a, b netip.Prefix) bool {
	return a.Bits() >= b.Bits() && b.Contains(a.Addr())
}

// portSpec is one resolved port entry: a protocol and a port range.
type portSpec struct {
	proto  uint8
	lo, hi uint16
}

// ProtoNum is the rule-key protocol of a Kubernetes protocol ("" is TCP).
// An unknown protocol has none (ok false): its port entry matches nothing,
// never another protocol. SCTP is itself: the datapath reads no SCTP ports,
// so an SCTP rule with a port admits no packet and one without a port admits
// SCTP alone; neither admits TCP or UDP.
func ProtoNum(p corev1.Protocol) (proto uint8, ok bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return ProtoTCP, true
	case corev1.ProtocolUDP:
		return ProtoUDP, true
	case corev1.ProtocolSCTP:
		return ProtoSCTP, true
	}
	return 0, false
}

func protoNum(p *corev1.Protocol) (uint8, bool) {
	if p == nil {
		return ProtoTCP, true
	}
	return ProtoNum(*p)
}

// resolvePorts resolves a rule's ports for a destination identity (nil when the
// destination is not an endpoint: named ports then match nothing).
func resolvePorts(ports []networkingv1.NetworkPolicyPort, dst *identityState) []portSpec {
	if len(ports) == 0 {
		return []portSpec{{proto: ProtoAny, lo: 0, hi: 65535}}
	}
	var out []portSpec
	for _, p := range ports {
		proto, ok := protoNum(p.Protocol)
		switch {
		case !ok:
			continue // matches nothing (validation refuses such objects first)
		case p.Port == nil:
			out = append(out, portSpec{proto, 0, 65535})
		case p.Port.Type == intstr.Int:
			hi := p.Port.IntVal
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			out = append(out, portSpec{proto, uint16(p.Port.IntVal), uint16(hi)})
		default:
			if dst == nil {
				continue
			}
			for pp := range dst.ports[p.Port.StrVal] {
				if pp.proto == proto {
					out = append(out, portSpec{proto, pp.port, pp.port})
				}
			}
		}
	}
	return out
}

func hasNamedPort(ports []networkingv1.NetworkPolicyPort) bool {
	return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.Type == intstr.String
	})
}

func (cp *compiler) rule(idx uint32, ns string, subjects []*identityState, dir Direction,
	from []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
	peers := cp.peers(ns, from)
	if dir == Egress && hasNamedPort(ports) && len(peers) == 1 && peers[0].id == IdentityAny {
		// Egress to all peers on a named port: the name resolves per
		// destination, so expand "all peers" to every endpoint identity (a
		// named port never matches a non-endpoint destination).
		peers = peers[:0]
		for _, st := range cp.states {
			peers = append(peers, peer{id: st.id, state: st})
		}
		// Numeric entries of the same rule still apply to every peer.
		var numeric []networkingv1.NetworkPolicyPort
		for _, p := range ports {
			if p.Port == nil || p.Port.Type == intstr.Int {
				numeric = append(numeric, p)
			}
		}
		if len(numeric) > 0 {
			for _, s := range subjects {
				cp.add(idx, s.id, dir, IdentityAny, resolvePorts(numeric, nil))
			}
		}
	}
	for _, s := range subjects {
		for _, pe := range peers {
			dst := s // ingress: ports are the subject's
			if dir == Egress {
				dst = pe.state
			}
			cp.add(idx, s.id, dir, pe.id, resolvePorts(ports, dst))
		}
	}
}

func (cp *compiler) add(idx uint32, subject Identity, dir Direction, peer Identity, specs []portSpec) {
	for _, ps := range specs {
		for _, blk := range portBlocks(ps.lo, ps.hi) {
			k := RuleKey{Subject: subject, Peer: peer, Direction: dir, Proto: ps.proto, Port: blk.port, PortPrefix: blk.prefix}
			if v, exists := cp.c.Rules[k]; exists && v.Policy <= idx {
				continue // the first policy that allows it is charged
			}
			if _, exists := cp.out[k]; !exists {
				cp.out[k] = RuleValue{Policy: idx}
			}
		}
	}
}

type portBlock struct {
	port   uint16
	prefix uint8
}

// portBlocks splits [lo, hi] into the fewest aligned power-of-two blocks, each
// a (port, prefix length) LPM entry.
func portBlocks(lo, hi uint16) []portBlock {
	var out []portBlock
	l, h := uint32(lo), uint32(hi)
	for l <= h {
		size := uint32(1)
		for l%(size*2) == 0 && l+size*2-1 <= h && size < 1<<16 {
			size *= 2
		}
		bits := uint8(0)
		for s := size; s > 1; s >>= 1 {
			bits++
		}
		out = append(out, portBlock{port: uint16(l), prefix: 16 - bits})
		l += size
	}
	return out
}
