package lab

import (
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/bench"
)

func TestCheckRouting(t *testing.T) {
	t.Setenv(RoutingEnv, "")
	for _, c := range []struct {
		cfg  Config
		want string // "" ok, else a substring of the error
	}{
		{Config{}, ""},
		{Config{Routing: RoutingTunnel}, ""},
		{Config{Routing: RoutingNative, Underlay: UnderlayRouted}, ""},
		{Config{Routing: "vxlan"}, "want native or tunnel"},
		{Config{Routing: RoutingTunnel, Underlay: UnderlayBridged}, "routed underlay"},
		{Config{Underlay: "flat"}, "want bridged or routed"},
		{Config{Routing: RoutingTunnel, K8s: true}, ""},
		{Config{Routing: RoutingTunnel, K8s: true, Kubelet: true}, ""},
		{Config{Routing: RoutingTunnel, K8s: true, Kubelet: true, Install: InstallHelm}, "installs lanekit with kustomize"},
	} {
		err := c.cfg.checkRouting()
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if u := (Config{Routing: RoutingTunnel}).underlay(); u != UnderlayRouted {
		t.Errorf("tunnel underlay %s", u)
	}
	t.Setenv(RoutingEnv, RoutingTunnel)
	if r := (Config{}).routing(); r != RoutingTunnel {
		t.Errorf("routing from $%s: %s", RoutingEnv, r)
	}
}

func TestRoutingAgentArgs(t *testing.T) {
	st := &State{Routing: RoutingTunnel, Nodes: []Node{
		{Index: 1, UnderlayIP: "10.77.0.1", PodCIDR: "10.244.1.0/24"},
		{Index: 2, UnderlayIP: "10.77.0.2", PodCIDR: "10.244.2.0/24"},
		{Index: 3, UnderlayIP: "10.77.0.3", PodCIDR: "10.244.3.0/24"},
	}}
	got := strings.Join(routingAgentArgs(st, 2), " ")
	want := "--routing-mode tunnel --tunnel-port 8472 --tunnel-node 10.244.1.0/24=10.77.0.1 --tunnel-node 10.244.3.0/24=10.77.0.3"
	if got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	st.Routing = RoutingNative
	if a := routingAgentArgs(st, 2); len(a) != 0 {
		t.Errorf("native lab: %v", a)
	}
}

func TestTunnelBenchRows(t *testing.T) {
	st := &State{Routing: RoutingTunnel, Underlay: UnderlayRouted, Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP: "10.77.0.1", RawNS: RawNS(1), RawIP: RawIP(1), Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.1"}, {NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"}}},
		{Index: 2, NS: "lk-node2", UnderlayIP: "10.77.0.2", RawNS: RawNS(2), RawIP: RawIP(2), Pods: []Pod{
			{NS: "lk-n2-p1", Kind: KindLanekit, IP: "10.244.2.1"}, {NS: "lk-n2-b1", Kind: KindBaseline, IP: "10.245.2.2"}}},
	}}
	paths, _ := st.BenchPaths()
	var names []string
	for _, p := range paths {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, ","); got != bench.RawPath+","+bench.HostPath+","+BenchFlannelVXLAN+","+BenchLanekitTunnel {
		t.Fatalf("tunnel lab rows %s", got)
	}
	st.Routing, st.Underlay = "", ""
	paths, _ = st.BenchPaths()
	if paths[3].Name != "lanekit-pod" || paths[2].Name != "bridge-iptables" {
		t.Fatalf("native lab rows renamed: %+v", paths)
	}
}

// TestRoutingBenchGroups: one group per named mode, in order; bad lists are
// refused with the reason.
func TestRoutingBenchGroups(t *testing.T) {
	gs, err := RoutingBenchGroups(Bins{}, []string{RoutingNative, RoutingTunnel}, nil)
	if err != nil || len(gs) != 2 || gs[0].Name != RoutingNative || gs[1].Name != RoutingTunnel || gs[0].Up == nil || gs[1].Down == nil {
		t.Fatalf("groups %+v, %v", gs, err)
	}
	for _, bad := range [][]string{nil, {"native", "native"}, {"vxlan"}} {
		if _, err := RoutingBenchGroups(Bins{}, bad, nil); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
