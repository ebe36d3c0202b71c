package agent

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
)

// The policy maps' fill is reported beside the service maps (lanekit status,
// the lanekit_map_* metrics): what the compiled policy holds of each map
// (the ipcache with the node's own addresses) against the size lanekitd was
// given (--policy-*), defaults where unset. An ipcache with room for two
// pod addresses beside the node's keeps the local pod's and one remote
// pod's, and counts the other remote address as left out.
func TestPolicyMapFill(t *testing.T) {
	host, err := (&Agent{host: &netdev.Host{}}).listHostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var h4, h6 int
	for _, a := range host {
		if a.Is4() {
			h4++
		} else {
			h6++
		}
	}
	size := h4 + 2 // the room for IPv4 pod addresses: 2
	a := newCtlAgentWith(t, t.TempDir(), agenttest.NewMemoryDatapath(), func(c *Config) {
		c.PolicyMaps = datapath.PolicySizes{IPCache: size, Rules: 7}
	})
	addLocal(t, a, 11, "10.244.1.2", "shop", "web-0", map[string]string{"app": "web"})
	if err := a.UpsertObjects(decodeObjs(t, ctlPolicy)); err != nil { // two remote pods
		t.Fatal(err)
	}
	got := map[string]MapStat{}
	for _, m := range a.ControlStats().Maps {
		got[m.Map] = m
	}
	c := a.ctl
	c.mu.Lock()
	rules, addrs := len(c.compiled.Rules), len(c.compiled.IPCache)
	_, local := c.compiled.IPCache[netip.MustParseAddr("10.244.1.2")]
	c.mu.Unlock()
	for name, want := range map[string][3]int{
		"lk_policy_ipcache":   {h4 + 2, size, 1},
		"lk_policy_ipcache6":  {h6, size, 0},
		"lk_policy_rules":     {rules, 7, 0},
		"lk_policy_isolation": {1, datapath.DefaultPolicyIdentities, 0},
		"lk_policy_cidrs":     {1, datapath.DefaultPolicyCIDRs, 0}, // 0.0.0.0/0: the world
	} {
		m, ok := got[name]
		if !ok {
			t.Errorf("%s not reported (maps: %v)", name, got)
			continue
		}
		if m.Entries != want[0] || m.Capacity != want[1] || m.UnprogrammedEntries != want[2] {
			t.Errorf("%s: %d/%d entries, %d left out, want %d/%d, %d", name, m.Entries, m.Capacity, m.UnprogrammedEntries, want[0], want[1], want[2])
		}
	}
	if addrs != 2 || !local || !got["lk_policy_ipcache"].Near() {
		t.Errorf("%d pod addresses compiled (local one: %v) for room for 2: not fitted or not reported as full (%+v)", addrs, local, got["lk_policy_ipcache"])
	}
	if _, ok := got["lk_lb_svc"]; !ok {
		t.Errorf("the service maps are no longer reported: %v", got)
	}
}
