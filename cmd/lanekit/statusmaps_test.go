package main

import (
	"strings"
	"testing"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// lanekit status names a full map and what it could not take, warns at
// 90 %, and says nothing of a map with room.
func TestPrintMaps(t *testing.T) {
	var b strings.Builder
	printMaps(&b, []*apiv1.MapFill{
		{Name: "lk_lb_svc", Entries: 4, Capacity: 4, UnprogrammedFrontends: 3, UnprogrammedServices: 2},
		{Name: "lk_lb_backends", Entries: 90, Capacity: 100},
		{Name: "lk_lb_svc6", Entries: 1, Capacity: 100},
		{Name: "lk_policy_rules", Entries: 11, Capacity: 11, UnprogrammedPolicies: 2},
		{Name: "lk_policy_ipcache", Entries: 8, Capacity: 8, UnprogrammedEntries: 3},
		{Name: "lk_policy_ipcache6", Entries: 0, Capacity: 65536},
	})
	got := b.String()
	for _, want := range []string{
		"error:      map lk_lb_svc full (4/4 entries): 3 frontends of 2 Services not programmed",
		"warning:    map lk_lb_backends nearly full (90/100 entries)",
		"error:      map lk_policy_rules full (11/11 entries): 2 NetworkPolicies not programmed (their pods stay isolated, their allow rules wait: `lanekit policy list`); raise lanekitd's --policy-rules",
		"error:      map lk_policy_ipcache full (8/8 entries): 3 pod addresses left out (this node's own are kept first); raise lanekitd's --policy-ipcache",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "lk_lb_svc6") || strings.Contains(got, "lk_policy_ipcache6") {
		t.Errorf("a map with room is reported:\n%s", got)
	}
}
