package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// Full policy maps fail closed, per NetworkPolicy. The datapath's policy
// maps have fixed sizes (lanekitd --policy-*); Compile fits its result into
// Input.Limits instead of producing a compilation the maps cannot take:
//
//   - Rules and ipBlock prefixes belong to policies: a policy whose rules
//     (or prefixes) do not fit in the room the policies before it left is
//     left out whole (Compiled.LeftOut). Policies are taken oldest first
//     (creation time, then input order), so a new policy never pushes out
//     one that is programmed. A left-out policy still isolates the pods it
//     selects (Isolated is computed from every policy): what only its rules
//     would allow is dropped, nothing is opened.
//   - Addresses (the ipcache) belong to endpoints: this node's endpoints
//     come first, then the others in input order; the addresses that do not
//     fit are left out (Compiled.Overflow). The datapath resolves an address
//     it does not know as a non-endpoint: by its longest ipBlock prefix
//     (else the world). That can only lose allows: every rule that admits
//     a prefix identity admits the endpoint too (a known endpoint is matched
//     by its ipBlocks as well), and rules naming the endpoint's identity
//     no longer match it. An isolated pod's traffic to or from a left-out
//     address is therefore dropped unless an ipBlock (or an all-peers rule)
//     admits that address.
//   - Isolation entries belong to identities, and the datapath reads them
//     only for this node's endpoints: local identities come first; the
//     entries of identities with no local endpoint are what is left out.
//
// A local endpoint whose address or isolation finds no room is not
// isolated by the datapath (it has no identity there): Unpoliced names it,
// and the agent refuses the CNI ADD that would create it; it cannot happen
// while the maps hold this node's endpoints (a node has a pod CIDR's worth
// of them).

// The policy maps, as the datapath pins them.
const (
	MapIPCache   = "lk_policy_ipcache"
	MapIPCache6  = "lk_policy_ipcache6"
	MapCIDRs     = "lk_policy_cidrs"
	MapCIDRs6    = "lk_policy_cidrs6"
	MapIsolation = "lk_policy_isolation"
	MapRules     = "lk_policy_rules"
)

// Limits are the entries a compilation may use in each policy map; 0 is no
// limit. IPCache and IPCache6 are the address maps' room per family (the
// datapath's size less the node's own addresses, which it writes itself);
// CIDRs is per family.
type Limits struct {
	IPCache, IPCache6 int
	CIDRs             int
	Identities        int
	Rules             int
}

// LeftOut is a policy whose rules or prefixes are not in the compilation:
// Map had Free entries left after the policies before it, and it needed
// Entries more.
type LeftOut struct {
	Policy  PolicyRef
	Index   int // into Compiled.Policies
	Map     string
	Entries int
	Free    int
}

// fitOrder is the order in which policies get room: oldest first (creation
// time; objects without one first), then input order.
func fitOrder(pols []*networkingv1.NetworkPolicy) []int {
	order := make([]int, len(pols))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return pols[a].CreationTimestamp.Time.Compare(pols[b].CreationTimestamp.Time)
	})
	return order
}

// fitCIDRs adds the ipBlock prefixes of each policy, in order, whose new
// prefixes fit; the rest are left out.
func fitCIDRs(c *Compiled, in Input, order []int, ids *Identities) map[int]LeftOut {
	left := map[int]LeftOut{}
	count := func(v6 bool) int {
		n := 0
		for p := range c.CIDRs {
			if p.Addr().Is6() == v6 {
				n++
			}
		}
		return n
	}
	have := [2]int{count(false), count(true)}
	for _, i := range order {
		p := in.Policies[i]
		fresh := map[netip.Prefix]bool{}
		var need [2]int
		for _, peer := range allPeers(p) {
			if peer.IPBlock == nil {
				continue
			}
			for _, s := range append([]string{peer.IPBlock.CIDR}, peer.IPBlock.Except...) {
				pfx := netip.MustParsePrefix(s).Masked() // validated
				if _, ok := c.CIDRs[pfx]; ok || fresh[pfx] {
					continue
				}
				fresh[pfx] = true
				need[b2i(pfx.Addr().Is6())]++
			}
		}
		if lim := in.Limits.CIDRs; lim > 0 {
			for f := range need {
				if need[f] > 0 && have[f]+need[f] > lim {
					left[i] = LeftOut{Policy: PolicyRef{p.Namespace, p.Name}, Index: i,
						Map: []string{MapCIDRs, MapCIDRs6}[f], Entries: need[f], Free: max(lim-have[f], 0)}
					break
				}
			}
			if _, out := left[i]; out {
				continue
			}
		}
		for pfx := range fresh {
			c.CIDRs[pfx] = ids.ForCIDR(pfx)
		}
		have[0], have[1] = have[0]+need[0], have[1]+need[1]
	}
	return left
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fitRules compiles the rules of each policy not yet left out, in order,
// and keeps them when they fit.
func fitRules(cp *compiler, in Input, order []int, left map[int]LeftOut) {
	c, lim := cp.c, in.Limits.Rules
	for _, i := range order {
		if _, out := left[i]; out {
			continue
		}
		p := in.Policies[i]
		cp.out = map[RuleKey]RuleValue{}
		cp.rules(uint32(i), p)
		fresh := 0
		for k := range cp.out {
			if _, ok := c.Rules[k]; !ok {
				fresh++
			}
		}
		if lim > 0 && len(c.Rules)+fresh > lim {
			left[i] = LeftOut{Policy: PolicyRef{p.Namespace, p.Name}, Index: i, Map: MapRules, Entries: fresh, Free: max(lim-len(c.Rules), 0)}
			continue
		}
		maps.Copy(c.Rules, cp.out) // keys already held: now charged to the earlier policy i
	}
	cp.out = nil
}

// fitAddrs keeps the ipcache within its limits: this node's endpoints'
// addresses first, then the others in input order.
func fitAddrs(c *Compiled, in Input) {
	lim := [2]int{in.Limits.IPCache, in.Limits.IPCache6}
	if lim == [2]int{} {
		return
	}
	var used [2]int
	for _, local := range []bool{true, false} {
		for _, ep := range in.Endpoints {
			if ep.Local != local {
				continue
			}
			for _, ip := range []netip.Addr{ep.IP, ep.IP6} {
				if !ip.IsValid() {
					continue
				}
				f := b2i(ip.Is6())
				if lim[f] == 0 || used[f] < lim[f] {
					used[f]++
					continue
				}
				delete(c.IPCache, ip)
				c.overflow([]string{MapIPCache, MapIPCache6}[f])
				if local {
					c.Unpoliced = append(c.Unpoliced, ip)
				}
			}
		}
	}
}

// fitIsolation keeps the isolation entries within their limit: the
// identities of this node's endpoints first, then the others by identity.
func fitIsolation(c *Compiled, in Input, ids *Identities) {
	lim := in.Limits.Identities
	if lim <= 0 || len(c.Isolated) <= lim {
		return
	}
	local := map[Identity]bool{}
	for _, ep := range in.Endpoints {
		if ep.Local {
			local[ids.ForLabels(ep.Namespace, ep.Labels)] = true
		}
	}
	order := slices.SortedFunc(maps.Keys(c.Isolated), func(a, b Identity) int {
		if local[a] != local[b] {
			return -cmp.Compare(b2i(local[a]), b2i(local[b]))
		}
		return cmp.Compare(a, b)
	})
	dropped := map[Identity]bool{}
	for _, id := range order[lim:] {
		delete(c.Isolated, id)
		c.overflow(MapIsolation)
		dropped[id] = true
	}
	for _, ep := range in.Endpoints {
		if !ep.Local || !dropped[ids.ForLabels(ep.Namespace, ep.Labels)] {
			continue
		}
		for _, ip := range []netip.Addr{ep.IP, ep.IP6} {
			if ip.IsValid() && !slices.Contains(c.Unpoliced, ip) {
				c.Unpoliced = append(c.Unpoliced, ip)
			}
		}
	}
}

func (c *Compiled) overflow(m string) {
	if c.Overflow == nil {
		c.Overflow = map[string]int{}
	}
	c.Overflow[m]++
}

func sortedLeftOut(left map[int]LeftOut) []LeftOut {
	out := slices.Collect(maps.Values(left))
	slices.SortFunc(out, func(a, b LeftOut) int { return cmp.Compare(a.Index, b.Index) })
	return out
}
