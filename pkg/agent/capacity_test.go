package agent

import (
	"testing"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// The policy maps' fill is reported beside the service maps (lanekit status,
// the lanekit_map_* metrics): what the compiled policy needs of each map
// against the size lanekitd was given (--policy-*), defaults where unset.
func TestPolicyMapFill(t *testing.T) {
	a := newCtlAgentWith(t, t.TempDir(), agenttest.NewMemoryDatapath(), func(c *Config) {
		c.PolicyMaps = datapath.PolicySizes{IPCache: 2, Rules: 7}
	})
	addLocal(t, a, 11, "10.244.1.2", "shop", "web-0", map[string]string{"app": "web"})
	if err := a.UpsertObjects(decodeObjs(t, ctlPolicy)); err != nil {
		t.Fatal(err)
	}
	got := map[string]MapStat{}
	for _, m := range a.ControlStats().Maps {
		got[m.Map] = m
	}
	c := a.ctl
	c.mu.Lock()
	rules, addrs := len(c.compiled.Rules), len(c.compiled.IPCache)
	c.mu.Unlock()
	for name, want := range map[string][2]int{
		"lk_policy_ipcache":   {addrs, 2},
		"lk_policy_ipcache6":  {0, 2},
		"lk_policy_rules":     {rules, 7},
		"lk_policy_isolation": {1, datapath.DefaultPolicyIdentities},
		"lk_policy_cidrs":     {1, datapath.DefaultPolicyCIDRs}, // 0.0.0.0/0: the world
	} {
		m, ok := got[name]
		if !ok {
			t.Errorf("%s not reported (maps: %v)", name, got)
			continue
		}
		if m.Entries != want[0] || m.Capacity != want[1] {
			t.Errorf("%s: %d/%d entries, want %d/%d", name, m.Entries, m.Capacity, want[0], want[1])
		}
	}
	if addrs < 3 || !got["lk_policy_ipcache"].Near() {
		t.Errorf("%d endpoint addresses in a map of 2: not reported as full (%+v)", addrs, got["lk_policy_ipcache"])
	}
	if _, ok := got["lk_lb_svc"]; !ok {
		t.Errorf("the service maps are no longer reported: %v", got)
	}
}
