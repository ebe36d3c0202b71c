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

// mapStats is the fill of every service map. Called with ctl.mu.
func (c *ctlPlane) mapStats() []MapStat {
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
