package bench

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestPolicySetJSON(t *testing.T) {
	data, err := PolicySetJSON(1000, netip.MustParsePrefix("10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8sobj.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1000 {
		t.Fatalf("%d objects", len(objs))
	}
	_, _, pols := k8sobj.Split(objs)
	seen := map[string]bool{}
	for i, p := range pols {
		if p.Namespace != PolicyNamespace || p.Name != PolicyName(i) || len(p.Spec.PodSelector.MatchLabels) != 0 ||
			len(p.Spec.PolicyTypes) != 1 || p.Spec.PolicyTypes[0] != "Ingress" || len(p.Spec.Ingress) != 1 {
			t.Fatalf("policy %d does not select every pod for ingress only: %+v", i, p)
		}
		cidr := p.Spec.Ingress[0].From[0].IPBlock.CIDR
		if seen[cidr] {
			t.Fatalf("policy %d repeats %s", i, cidr)
		}
		seen[cidr] = true
		if i > 0 && (len(p.Spec.Ingress[0].Ports) != 1 || strings.HasPrefix(cidr, "10.244.")) {
			t.Fatalf("policy %d could match the bench traffic: %+v", i, p.Spec.Ingress[0])
		}
	}
	if pols[0].Spec.Ingress[0].From[0].IPBlock.CIDR != "10.244.1.0/24" || len(pols[0].Spec.Ingress[0].Ports) != 0 {
		t.Errorf("policy 0 does not allow the client range on every port: %+v", pols[0].Spec.Ingress[0])
	}
	if _, err := PolicySetJSON(-1, netip.Prefix{}); err == nil {
		t.Error("-1 policies accepted")
	}
}

func TestPolicyTargets(t *testing.T) {
	zero, many := 0, 1000
	r := &Report{Rows: []Row{
		{Path: "lanekit-pod+0-policies", Policies: &zero, PolicyBase: "lanekit-pod",
			Reps: Reps{TCPGbps: ptrs(10, 10, 10), RRP50us: ptrs(30, 30, 30), RRP99us: ptrs(50, 50, 50)}},
		{Path: "lanekit-pod+1000-policies", Policies: &many, PolicyBase: "lanekit-pod",
			Reps: Reps{TCPGbps: ptrs(9.9, 9.8, 10.1), RRP50us: ptrs(30.3, 30, 29), RRP99us: ptrs(60, 55, 50)}},
	}}
	got := policyTargets(r)
	if len(got) != 3 {
		t.Fatalf("%d policy targets: %+v", len(got), got)
	}
	want := map[string]bool{"tcp_gbps": true, "rr_p50_us": true, "rr_p99_us": false}
	for _, g := range got {
		if g.Ref != "lanekit-pod+0-policies" || g.Met != want[g.Metric] || g.Ratio == nil {
			t.Errorf("%s: %+v (ratio %+v), want met %v", g.Metric, g, g.Ratio, want[g.Metric])
		}
	}
}
