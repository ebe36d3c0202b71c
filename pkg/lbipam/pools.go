// Package lbipam assigns addresses to LoadBalancer Services on clusters no
// cloud serves (LB IPAM: pools, one Lease-elected writer) and announces them
// on the node uplinks (L2: ARP replies and NDP neighbour advertisements from
// one node per Service, moved when that node's agent stops).
package lbipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// Names the agents and the manifests share.
const (
	// Class is the spec.loadBalancerClass lanekit serves; a Service without a
	// class is served too (the cluster's default implementation), one with
	// any other class is left to its controller.
	Class = "lanekit.io/lb"
	// AnnotationIPs requests specific addresses (comma-separated, one per
	// family at most), as spec.loadBalancerIP (deprecated upstream) does.
	AnnotationIPs = "lanekit.io/lb-ips"
	// ConditionType is the Service status condition lanekit sets on the
	// Services it assigns addresses to: it also marks them as lanekit's, so
	// their addresses are released (and never announced) when they stop
	// being LoadBalancer Services.
	ConditionType = "lanekit.io/lb-ipam"
	// PoolsKey is the ConfigMap key holding the pools (YAML).
	PoolsKey = "pools.yaml"
	// DefaultPoolsConfigMap is the ConfigMap (in the agent's namespace) the
	// pools are read from.
	DefaultPoolsConfigMap = "lanekit-lb-pools"
)

// PoolSpec is one pool as written in the ConfigMap:
//
//	pools:
//	- name: public
//	  addresses: ["192.0.2.0/28", "2001:db8::10-2001:db8::1f"]
//	  serviceSelector: {matchLabels: {expose: public}}
//	  namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [web]}]}
type PoolSpec struct {
	Name              string                `json:"name"`
	Addresses         []string              `json:"addresses"`
	ServiceSelector   *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// PoolsConfig is the document under PoolsKey.
type PoolsConfig struct {
	Pools []PoolSpec `json:"pools"`
}

// Range is an inclusive address range of one family.
type Range struct{ First, Last netip.Addr }

// Contains reports whether a is in r.
func (r Range) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Pool is a parsed pool: selectors nil match everything.
type Pool struct {
	Name      string
	Ranges    []Range
	Services  labels.Selector
	Namespace labels.Selector
}

// Subject is what pool selectors look at: the Service's and its
// namespace's labels.
type Subject struct {
	Service   labels.Set
	Namespace labels.Set
}

// Matches reports whether p may serve s.
func (p *Pool) Matches(s Subject) bool {
	return (p.Services == nil || p.Services.Matches(s.Service)) &&
		(p.Namespace == nil || p.Namespace.Matches(s.Namespace))
}

// Contains reports whether a is one of p's addresses.
func (p *Pool) Contains(a netip.Addr) bool {
	return slices.ContainsFunc(p.Ranges, func(r Range) bool { return r.Contains(a) })
}

// ParsePools parses the ConfigMap document. Errors name the pool and the
// entry at fault; pools may not share addresses or names.
func ParsePools(doc string) ([]*Pool, error) {
	var c PoolsConfig
	if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
		return nil, fmt.Errorf("pools: %w", err)
	}
	var out []*Pool
	seen := map[string]bool{}
	for i, ps := range c.Pools {
		if ps.Name == "" {
			return nil, fmt.Errorf("pools[%d]: name is empty", i)
		}
		if seen[ps.Name] {
			return nil, fmt.Errorf("pool %q: named twice", ps.Name)
		}
		seen[ps.Name] = true
		p := &Pool{Name: ps.Name}
		var err error
		if ps.ServiceSelector != nil {
			if p.Services, err = metav1.LabelSelectorAsSelector(ps.ServiceSelector); err != nil {
				return nil, fmt.Errorf("pool %q: serviceSelector: %w", ps.Name, err)
			}
		}
		if ps.NamespaceSelector != nil {
			if p.Namespace, err = metav1.LabelSelectorAsSelector(ps.NamespaceSelector); err != nil {
				return nil, fmt.Errorf("pool %q: namespaceSelector: %w", ps.Name, err)
			}
		}
		if len(ps.Addresses) == 0 {
			return nil, fmt.Errorf("pool %q: no addresses", ps.Name)
		}
		for _, s := range ps.Addresses {
			r, err := ParseRange(s)
			if err != nil {
				return nil, fmt.Errorf("pool %q: %w", ps.Name, err)
			}
			for _, q := range out {
				for _, qr := range q.Ranges {
					if overlap(r, qr) {
						return nil, fmt.Errorf("pool %q: %s overlaps pool %q", ps.Name, s, q.Name)
					}
				}
			}
			for _, qr := range p.Ranges {
				if overlap(r, qr) {
					return nil, fmt.Errorf("pool %q: %s overlaps another of its ranges", ps.Name, s)
				}
			}
			p.Ranges = append(p.Ranges, r)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Pool) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func overlap(a, b Range) bool {
	return a.First.BitLen() == b.First.BitLen() && a.First.Compare(b.Last) <= 0 && b.First.Compare(a.Last) <= 0
}

// ParseRange parses "CIDR" or "FIRST-LAST" (one family). An IPv4 CIDR
// shorter than /31 leaves out its first and last address (a subnet's
// network and broadcast addresses, which some clients refuse to reach).
func ParseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if a, b, ok := strings.Cut(s, "-"); ok {
		first, err1 := netip.ParseAddr(strings.TrimSpace(a))
		last, err2 := netip.ParseAddr(strings.TrimSpace(b))
		switch {
		case err1 != nil || err2 != nil:
			return Range{}, fmt.Errorf("range %q: want FIRST-LAST addresses", s)
		case first.Zone() != "" || last.Zone() != "" || first.Is4In6() || last.Is4In6():
			return Range{}, fmt.Errorf("range %q: no zones or IPv4-mapped addresses", s)
		case first.BitLen() != last.BitLen():
			return Range{}, fmt.Errorf("range %q: both ends must be of one family", s)
		case last.Less(first):
			return Range{}, fmt.Errorf("range %q: last address before first", s)
		}
		return Range{first, last}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Range{}, fmt.Errorf("%q is neither a CIDR nor FIRST-LAST: %w", s, err)
	}
	if p.Addr().Is4In6() {
		return Range{}, fmt.Errorf("CIDR %q: no IPv4-mapped addresses", s)
	}
	if p != p.Masked() {
		return Range{}, fmt.Errorf("CIDR %q has host bits set (did you mean %s?)", s, p.Masked())
	}
	r := Range{p.Addr(), lastAddr(p)}
	if p.Addr().Is4() && p.Bits() < 31 {
		r = Range{r.First.Next(), r.Last.Prev()}
	}
	return r, nil
}

// Prefixes is the shortest list of CIDRs that covers exactly r, in order.
func (r Range) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for a := r.First; a.IsValid() && a.Compare(r.Last) <= 0; {
		bits := a.BitLen()
		for bits > 0 {
			wider := netip.PrefixFrom(a, bits-1)
			if wider.Masked().Addr() != a || lastAddr(wider).Compare(r.Last) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(a, bits)
		out = append(out, p)
		a = lastAddr(p).Next() // invalid past the family's last address
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
