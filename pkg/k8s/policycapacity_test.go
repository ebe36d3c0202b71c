package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/policy"
)

// More NetworkPolicies than the agent's rule map holds (--policy-rules 2,
// one entry each), through the real API server into the real agent: the
// third is left out whole and reported — a PolicyMapFull Warning Event on
// it naming the map and the flag, lanekit_map_unprogrammed_policies, the
// agent's UnprogrammedPolicies; deleting a policy makes room and it is
// programmed, with a PolicyProgrammed Event.
func TestFullPolicyMapsFailLoudly(t *testing.T) {
	a, _ := newMemAgentWith(t, func(c *agent.Config) { c.PolicyMaps.Rules = 2 })
	e := newEnv(t)
	m := metrics.New(metrics.Options{Log: slog.New(slog.DiscardHandler)})
	if err := m.Watch(a); err != nil {
		t.Fatal(err)
	}
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: a})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	ctx := context.Background()
	// A remote pod the policies select (its address is outside the agent's pod CIDR).
	web := mustCreate(t, e.c.CoreV1().Pods("default").Create, pod("default", "web", "node-2", map[string]string{"app": "web"}))
	web.Status.PodIP, web.Status.PodIPs = "10.80.0.5", []corev1.PodIP{{IP: "10.80.0.5"}}
	if _, err := e.c.CoreV1().Pods("default").UpdateStatus(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		mustCreate(t, e.c.NetworkingV1().NetworkPolicies("default").Create, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "default"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(int32(80 + i)))}}}}}})
	}
	leftOut := func() []string {
		var out []string
		for _, l := range a.UnprogrammedPolicies() {
			out = append(out, l.Policy.String()+" "+l.Map)
		}
		return out
	}
	eventually(t, "p3 left out of lk_policy_rules", func() bool {
		return slices.Equal(leftOut(), []string{"default/p3 " + policy.MapRules})
	})
	if v := gaugeValue(t, m, metrics.NameMapUnprogPolicies, policy.MapRules); v != 1 {
		t.Errorf("%s{map=%s} = %v, want 1", metrics.NameMapUnprogPolicies, policy.MapRules, v)
	}
	if v := gaugeValue(t, m, metrics.NameMapEntries, policy.MapRules); v != 2 {
		t.Errorf("%s{map=%s} = %v, want 2", metrics.NameMapEntries, policy.MapRules, v)
	}
	eventually(t, "a PolicyMapFull Warning on p3 naming the map and the flag", func() bool {
		evs := events(t, e, "NetworkPolicy", ReasonPolicyMapFull)
		return len(evs) == 1 && evs[0].InvolvedObject.Name == "p3" && evs[0].Type == corev1.EventTypeWarning &&
			contains(evs[0].Message, policy.MapRules, "--policy-rules", "stay isolated")
	})

	if err := e.c.NetworkingV1().NetworkPolicies("default").Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "p3 programmed once p1 went", func() bool { return len(leftOut()) == 0 })
	eventually(t, "a PolicyProgrammed event on p3", func() bool {
		evs := events(t, e, "NetworkPolicy", ReasonPolicyProgrammed)
		return len(evs) == 1 && evs[0].InvolvedObject.Name == "p3" && evs[0].Type == corev1.EventTypeNormal
	})
	if v := gaugeValue(t, m, metrics.NameMapUnprogPolicies, policy.MapRules); v != 0 {
		t.Errorf("%s{map=%s} = %v after room returned", metrics.NameMapUnprogPolicies, policy.MapRules, v)
	}
	if n := len(events(t, e, "NetworkPolicy", ReasonPolicyMapFull)); n != 1 {
		t.Errorf("%d PolicyMapFull events, want 1 (once per state change)", n)
	}
}

// events are the events in default of reason on objects of kind.
func events(t *testing.T, e *env, kind, reason string) []corev1.Event {
	t.Helper()
	evs, err := e.c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range evs.Items {
		if ev.Reason == reason && ev.InvolvedObject.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
