// Package policy compiles Kubernetes NetworkPolicies into identity-keyed rules a
// BPF datapath can load, with exactly the Kubernetes semantics:
//
//   - a policy selects pods in its own namespace (spec.podSelector);
//   - policyTypes default to [Ingress] plus Egress when spec.egress has rules;
//   - a pod is default-deny only in the directions some policy selecting it has;
//     what is allowed then is the union of those policies' rules (rules OR);
//   - a peer is podSelector (policy namespace), namespaceSelector (all pods of
//     matching namespaces), both (AND), or ipBlock (cidr minus except);
//   - ports: numbers, names (resolved against the destination pod's container
//     ports), ranges (port..endPort); empty from/to = all peers, empty ports =
//     all ports and protocols;
//   - a connection passes when the source's egress AND the destination's ingress
//     allow it; replies of allowed connections pass (the datapath's conntrack).
//
// Identities: every distinct (namespace, label set) of an endpoint gets a
// numeric identity; every prefix that appears in an ipBlock gets a CIDR
// identity. Both address families: an endpoint's IPv4 and IPv6 addresses
// map to its one identity, ipBlocks may be IPv4 or IPv6 (0.0.0.0/0 and ::/0
// are the two world identities). Rules are keyed by (subject identity, direction, peer identity,
// protocol, port prefix), so their number grows with distinct label sets, not
// with pods.
//
// ipBlock and pod IPs: a peer matches by identity (podSelector,
// namespaceSelector) or by address (ipBlock: cidr minus except, pods'
// addresses included, as Kubernetes' netpol e2e tests expect); a rule admits
// the union. An IP resolves first to its endpoint identity (lk_policy_ipcache)
// and, when no rule matches that, to the CIDR identity of its longest ipBlock
// prefix (lk_policy_cidrs), as for any other address: Compiled.LookupPeer.
// The fallback is in the lookup, not in the rules (no per-pod entries for the
// pods an ipBlock covers), so the rules still grow with label sets and
// prefixes, not pods, and a pod that moves in or out of an ipBlock needs no
// rule change. Limitation: a named port in an egress rule whose peer is an
// ipBlock resolves against no pod (a CIDR identity has no container ports),
// so it matches nothing; use a port number.
package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Identity is a numeric security identity.
type Identity uint32

const (
	// IdentityAny is the wildcard peer in rule keys ("all peers").
	IdentityAny Identity = 0
	// IdentityWorld is the CIDR identity of 0.0.0.0/0: an IP that is no
	// endpoint and in no more specific ipBlock prefix.
	IdentityWorld Identity = 2
	// IdentityWorld6 is the CIDR identity of ::/0: an IPv6 address that is
	// no endpoint and in no more specific ipBlock prefix. Its own identity,
	// so that an ipBlock 0.0.0.0/0 does not admit IPv6 and ::/0 no IPv4.
	IdentityWorld6 Identity = 3
	// firstCIDRIdentity and firstEndpointIdentity start the two allocation
	// ranges; CIDR identities live in [firstCIDRIdentity, firstEndpointIdentity).
	firstCIDRIdentity     Identity = 16
	firstEndpointIdentity Identity = 1 << 16
)

// IsCIDR reports whether id is a CIDR (world) identity.
func (id Identity) IsCIDR() bool {
	return id == IdentityWorld || id == IdentityWorld6 || (id >= firstCIDRIdentity && id < firstEndpointIdentity)
}

// MetadataNameLabel is the label Kubernetes puts on every namespace with its name.
const MetadataNameLabel = "kubernetes.io/metadata.name"

// IdentityInfo says what an identity stands for.
type IdentityInfo struct {
	// Namespace and Labels of endpoint identities.
	Namespace string
	Labels    labels.Set
	// Prefix of CIDR identities.
	Prefix netip.Prefix
}

// Identities allocates identities and keeps them stable across compilations
// (an endpoint's identity does not change while its label set exists).
// Not safe for concurrent use.
type Identities struct {
	byKey   map[string]Identity
	byCIDR  map[netip.Prefix]Identity
	info    map[Identity]IdentityInfo
	nextEP  Identity
	nextCID Identity
}

// NewIdentities returns an empty allocator.
func NewIdentities() *Identities {
	ids := &Identities{byKey: map[string]Identity{}, byCIDR: map[netip.Prefix]Identity{},
		info: map[Identity]IdentityInfo{}, nextEP: firstEndpointIdentity, nextCID: firstCIDRIdentity}
	world := netip.MustParsePrefix("0.0.0.0/0")
	ids.byCIDR[world] = IdentityWorld
	ids.info[IdentityWorld] = IdentityInfo{Prefix: world}
	world6 := netip.MustParsePrefix("::/0")
	ids.byCIDR[world6] = IdentityWorld6
	ids.info[IdentityWorld6] = IdentityInfo{Prefix: world6}
	return ids
}

func labelKey(ns string, l map[string]string) string {
	var b strings.Builder
	b.WriteString(ns)
	for _, k := range slices.Sorted(maps.Keys(l)) {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
	}
	return b.String()
}

// ForLabels returns the identity of (namespace, labels), allocating one.
func (ids *Identities) ForLabels(ns string, l map[string]string) Identity {
	k := labelKey(ns, l)
	if id, ok := ids.byKey[k]; ok {
		return id
	}
	id := ids.nextEP
	ids.nextEP++
	ids.byKey[k] = id
	ids.info[id] = IdentityInfo{Namespace: ns, Labels: labels.Set(maps.Clone(l))}
	return id
}

// ForCIDR returns the CIDR identity of p (masked), allocating one.
func (ids *Identities) ForCIDR(p netip.Prefix) Identity {
	p = p.Masked()
	if id, ok := ids.byCIDR[p]; ok {
		return id
	}
	id := ids.nextCID
	ids.nextCID++
	ids.byCIDR[p] = id
	ids.info[id] = IdentityInfo{Prefix: p}
	return id
}

// Info returns what id stands for.
func (ids *Identities) Info(id Identity) (IdentityInfo, bool) {
	i, ok := ids.info[id]
	return i, ok
}
