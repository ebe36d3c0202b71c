package agent

import (
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

// MapStat is one service map's fill and what waits for room in it.
type MapStat struct {
	service.MapFill
	UnprogrammedFrontends int
	UnprogrammedServices  int
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

// policyFill is what the compiled policy needs of each policy map against
// its size (lanekitd --policy-*): a compilation past a size fails to apply
// (retried, logged) and shows here as a full map. Called with ctl.mu.
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
	fill := func(name string, n, capacity int) MapStat {
		return MapStat{MapFill: service.MapFill{Map: name, Entries: n, Capacity: capacity}}
	}
	return []MapStat{
		fill("lk_policy_ipcache", ip4, sz.IPCache), fill("lk_policy_ipcache6", ip6, sz.IPCache),
		fill("lk_policy_cidrs", cidr4, sz.CIDRs), fill("lk_policy_cidrs6", cidr6, sz.CIDRs),
		fill("lk_policy_isolation", len(p.Isolated), sz.Identities), fill("lk_policy_rules", len(p.Rules), sz.Rules),
	}
}
