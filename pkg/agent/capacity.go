package agent

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

// Full maps fail loudly. The service maps have fixed sizes (--lb-frontends,
// --lb-backends); the tables program a frontend only when its entries fit
// (service.Tables, capacity.go), so a full map never leaves a Service half
// written or an update stuck at the head of the retry queue. What does not
// fit waits and is reported: ControlStats.Maps (lanekit status, the
// lanekit_map_* metrics) and Unprogrammed (the Kubernetes source's Events
// on the Services); it is programmed as soon as a removal frees room.

// NearFull is the fill from which a map is reported as nearly full.
const NearFull = 0.9

// MapStat is one service or policy map's fill and what waits for room in
// it: Service frontends (service maps); NetworkPolicies left out and the
// addresses or isolation entries left out (policy maps).
type MapStat struct {
	service.MapFill
	UnprogrammedFrontends int
	UnprogrammedServices  int
	UnprogrammedPolicies  int
	UnprogrammedEntries   int
}

// Near reports whether the map is at least NearFull full.
func (m MapStat) Near() bool {
	return m.Capacity > 0 && float64(m.Entries) >= NearFull*float64(m.Capacity)
}

// mapStats is the fill of every service map, then of the policy maps (as
// compiled: what the maps must hold). Called with ctl.mu.
func (c *ctlPlane) mapStats() []MapStat {
	return append(c.serviceFill(), c.policyFill()...)
}

// serviceFill is the fill of every service map and what waits for room in
// it. Called with ctl.mu.
func (c *ctlPlane) serviceFill() []MapStat {
	fill := c.tables.Fill()
	out := make([]MapStat, len(fill))
	byMap := map[string]int{}
	for i, f := range fill {
		out[i].MapFill = f
		byMap[f.Map] = i
	}
	svcs := map[string]map[service.ServiceID]bool{}
	for _, u := range c.tables.Unprogrammed() {
		i, ok := byMap[u.Map]
		if !ok {
			continue
		}
		out[i].UnprogrammedFrontends++
		if svcs[u.Map] == nil {
			svcs[u.Map] = map[service.ServiceID]bool{}
		}
		if !svcs[u.Map][u.Service] {
			svcs[u.Map][u.Service] = true
			out[i].UnprogrammedServices++
		}
	}
	return out
}

// Unprogrammed returns the frontends the service maps had no room for.
func (a *Agent) Unprogrammed() []service.Unprogrammed {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tables.Unprogrammed()
}

// Full policy maps fail closed, per NetworkPolicy (pkg/policy's fit.go):
// the agent compiles into the sizes lanekitd was given (--policy-*), so every
// compilation fits its maps and an update is never refused whole. What did
// not fit is reported: the policies left out (their pods stay isolated;
// their allow rules wait) and the addresses and isolation entries left out,
// by map: ControlStats.Maps (lanekit status, the lanekit_map_* metrics) and
// UnprogrammedPolicies (the Kubernetes source's Events on the
// NetworkPolicies). Each recompilation (an object or endpoint change) fits
// again, so a removal that frees room programs what waited.

// policyLimits are the entries a compilation may use in each policy map:
// their sizes, less the node's own addresses in the ipcache (the datapath
// writes those itself: hostaddrs.go). Called with ctl.mu.
func (c *ctlPlane) policyLimits() policy.Limits {
	sz := c.policySizes
	if sz.IPCache == 0 { // no sizes: nothing to fit (a datapath without policy maps)
		return policy.Limits{}
	}
	host4, host6 := c.hostAddrCounts()
	return policy.Limits{IPCache: max(sz.IPCache-host4, 0), IPCache6: max(sz.IPCache-host6, 0), CIDRs: sz.CIDRs,
		Identities: sz.Identities, Rules: sz.Rules}
}

// hostAddrCounts are the node's own addresses by family, as the datapath
// holds them in the ipcache (SetPolicyHostAddrs). Called with ctl.mu.
func (c *ctlPlane) hostAddrCounts() (v4, v6 int) {
	for _, a := range c.svcOpts.HostAddrs {
		if a.Is4() {
			v4++
		} else {
			v6++
		}
	}
	return v4, v6
}

// logFit logs what the compilation next left out when that differs from
// the compilation applied. Called with ctl.mu.
func (c *ctlPlane) logFit(next *policy.Compiled) {
	if c.log == nil {
		return
	}
	var prev *policy.Compiled
	if prev = c.compiled; prev == nil {
		prev = &policy.Compiled{}
	}
	if fitState(prev) == fitState(next) {
		return
	}
	for _, l := range next.LeftOut {
		c.log.Error("policy map full: NetworkPolicy not programmed (its pods stay isolated)", "policy", l.Policy.String(), "map", l.Map,
			"entries", l.Entries, "free", l.Free, "flag", policyMapFlags[l.Map])
	}
	for _, m := range slices.Sorted(maps.Keys(next.Overflow)) {
		c.log.Error("policy map full: entries left out", "map", m, "entries", next.Overflow[m], "flag", policyMapFlags[m])
	}
	if len(next.LeftOut) == 0 && len(next.Overflow) == 0 {
		c.log.Info("policy maps have room: every NetworkPolicy is programmed")
	}
}

// fitState is what c left out, without the counts (pods coming and going
// change those): the policies with their maps, the maps with entries left out.
func fitState(c *policy.Compiled) string {
	var b strings.Builder
	for _, l := range c.LeftOut {
		fmt.Fprintf(&b, "%s %s;", l.Policy, l.Map)
	}
	for _, m := range slices.Sorted(maps.Keys(c.Overflow)) {
		fmt.Fprintf(&b, "%s;", m)
	}
	return b.String()
}

// policyMapFlags are the lanekitd flags sizing each policy map.
var policyMapFlags = map[string]string{
	policy.MapIPCache: "--policy-ipcache", policy.MapIPCache6: "--policy-ipcache",
	policy.MapCIDRs: "--policy-cidrs", policy.MapCIDRs6: "--policy-cidrs",
	policy.MapIsolation: "--policy-identities", policy.MapRules: "--policy-rules",
}

// unpoliced says which policy map has no room to police ep (its address
// or its isolation entry did not fit) and the flag to raise; "" when ep is
// policed (or nil).
func (a *Agent) unpoliced(ep *endpoint.Endpoint) string {
	c := a.ctl
	if c == nil || ep == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.compiled == nil {
		return ""
	}
	for _, ip := range c.compiled.Unpoliced {
		if ip == ep.IP || ip == ep.IP6 {
			m := policy.MapIPCache
			switch _, known := c.compiled.IPCache[ip]; {
			case known:
				m = policy.MapIsolation
			case ip.Is6():
				m = policy.MapIPCache6
			}
			return fmt.Sprintf("map %s full: no room to police %s; raise lanekitd %s", m, ip, policyMapFlags[m])
		}
	}
	return ""
}

// UnprogrammedPolicies returns the NetworkPolicies the policy maps had no
// room for (their pods stay isolated; their allow rules are not
// programmed), in compilation order.
func (a *Agent) UnprogrammedPolicies() []policy.LeftOut {
	c := a.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.compiled == nil {
		return nil
	}
	return slices.Clone(c.compiled.LeftOut)
}

// policyFill is what the compiled policy holds of each policy map against
// its size (lanekitd --policy-*), with the policies and entries that did not
// fit. Called with ctl.mu.
func (c *ctlPlane) policyFill() []MapStat {
	p, sz := c.compiled, c.policySizes
	if p == nil || sz.IPCache == 0 {
		return nil
	}
	var ip4, ip6, cidr4, cidr6 int
	for a := range p.IPCache {
		if a.Is4() {
			ip4++
		} else {
			ip6++
		}
	}
	for pf := range p.CIDRs {
		if pf.Addr().Is4() {
			cidr4++
		} else {
			cidr6++
		}
	}
	host4, host6 := c.hostAddrCounts()
	fill := func(name string, n, capacity int) MapStat {
		m := MapStat{MapFill: service.MapFill{Map: name, Entries: n, Capacity: capacity}, UnprogrammedEntries: p.Overflow[name]}
		for _, l := range p.LeftOut {
			if l.Map == name {
				m.UnprogrammedPolicies++
			}
		}
		return m
	}
	return []MapStat{
		fill(policy.MapIPCache, ip4+host4, sz.IPCache), fill(policy.MapIPCache6, ip6+host6, sz.IPCache),
		fill(policy.MapCIDRs, cidr4, sz.CIDRs), fill(policy.MapCIDRs6, cidr6, sz.CIDRs),
		fill(policy.MapIsolation, len(p.Isolated), sz.Identities), fill(policy.MapRules, len(p.Rules), sz.Rules),
	}
}
