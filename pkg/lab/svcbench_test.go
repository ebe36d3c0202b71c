package lab

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/bench"
)

func svcTestState() *State {
	return &State{Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP: "10.77.0.1", PodCIDR: "10.244.1.0/24", Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.1"}, {NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"}}},
		{Index: 2, NS: "lk-node2", UnderlayIP: "10.77.0.2", PodCIDR: "10.244.2.0/24", Pods: []Pod{
			{NS: "lk-n2-p1", Kind: KindLanekit, IP: "10.244.2.1"}, {NS: "lk-n2-p2", Kind: KindLanekit, IP: "10.244.2.2"},
			{NS: "lk-n2-b1", Kind: KindBaseline, IP: "10.245.2.2"}}},
	}}
}

func TestLanekitSvcRows(t *testing.T) {
	st := svcTestState()
	prog := &AgentProgrammer{Socket: "x"}
	rows, why := st.lanekitSvcRows([]int{10, 1000}, netip.MustParsePrefix(SvcClusterCIDR), false, prog)
	if why != "" || len(rows) != 2 {
		t.Fatalf("rows %+v, skipped %q", rows, why)
	}
	r := rows[1]
	if r.Mode != bench.SvcModeLanekit || r.Services != 1000 || r.ClientNS != "lk-n1-p1" || !r.Shared || len(r.Backends) != 2 ||
		r.Backends[1].IP != netip.MustParseAddr("10.244.2.2") || r.Prog != rows[0].Prog {
		t.Errorf("lanekit row %+v: want client lk-n1-p1, node 2's lanekit pods as backends, one shared agent programmer", r)
	}
	// Host-client rows: node 1's netns and cgroup, the same programmer.
	if _, err := os.Stat(NodeCgroup(1)); err == nil {
		hrows, why := st.lanekitSvcRows([]int{10}, netip.MustParsePrefix(SvcClusterCIDR), true, prog)
		if h := hrows[0]; why != "" || h.Mode != bench.SvcModeLanekitHost || h.ClientNS != "lk-node1" || h.ClientCgroup != NodeCgroup(1) || h.Prog != prog || h.Datapath != nil {
			t.Errorf("host row %+v (%q): want a process in lk-node1 and its cgroup, the shared programmer", h, why)
		}
	} else if _, why := st.lanekitSvcRows([]int{10}, netip.MustParsePrefix(SvcClusterCIDR), true, prog); !strings.Contains(why, "node cgroup") {
		t.Errorf("host row without the node cgroup: skipped %q", why)
	}
	if m, host := bench.SvcBaseMode(bench.SvcModeNftablesHost); m != bench.SvcModeNftables || !host {
		t.Errorf("SvcBaseMode(%s) = %s, %v", bench.SvcModeNftablesHost, m, host)
	}
	if got := hostClientDetail(IncludesSvcIptables.Detail); !strings.HasPrefix(got, "client process in the node netns") || !strings.Contains(got, "KUBE-SERVICES") {
		t.Errorf("host detail %q", got)
	}
	st.BaselineOnly = true
	if rows, why := st.lanekitSvcRows([]int{10}, netip.Prefix{}, false, prog); len(rows) != 0 || !strings.Contains(why, "baseline-only") {
		t.Errorf("baseline-only lab: rows %v, skipped %q", rows, why)
	}
	if b := svcBackends(st.Nodes[1], KindBaseline); len(b) != 1 || b[0].NS != "lk-n2-b1" {
		t.Errorf("baseline backends %+v", b)
	}
}

func TestPolicyRows(t *testing.T) {
	st := svcTestState()
	others := []bench.Path{{Name: "lanekit-pod"}, {Name: "host", Prepare: func(context.Context) error { return nil }}}
	paths, skipped, cleanup := st.PolicyRows([]int{0, 1000}, others)
	defer cleanup()
	if len(skipped) != 0 || len(paths) != 4 {
		t.Fatalf("%d paths, skipped %v", len(paths), skipped)
	}
	if paths[0].Prepare == nil || paths[1].Prepare == nil {
		t.Error("the other rows do not remove the policies before they are measured")
	}
	p := paths[3]
	if p.Name != "lanekit-pod+1000-policies" || p.Policies == nil || *p.Policies != 1000 || *paths[2].Policies != 0 ||
		p.PolicyBase != paths[2].PolicyBase || p.ClientNS != "lk-n1-p1" || p.ServerIP != "10.244.2.1" || p.Prepare == nil {
		t.Errorf("policy row %+v", p)
	}
	st.BaselineOnly = true
	if paths, skipped, _ := st.PolicyRows([]int{0}, others); len(paths) != 2 || len(skipped) != 1 {
		t.Errorf("baseline-only lab: %d paths, skipped %v", len(paths), skipped)
	}
}
