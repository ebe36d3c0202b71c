package k8s

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
)

// Event reasons on a NetworkPolicy the agent's policy maps have no room
// for, and on it again once it is programmed.
const (
	ReasonPolicyMapFull    = "PolicyMapFull"
	ReasonPolicyProgrammed = "PolicyProgrammed"
)

// PolicyUnprogrammedSource is an ObjectSink that reports the
// NetworkPolicies its full policy maps left out (*agent.Agent is one).
type PolicyUnprogrammedSource interface {
	UnprogrammedPolicies() []policy.LeftOut
}

// policyMapFlags are lanekitd's flags sizing each policy map.
var policyMapFlags = map[string]string{
	policy.MapCIDRs: "--policy-cidrs", policy.MapCIDRs6: "--policy-cidrs", policy.MapRules: "--policy-rules",
}

// checkPolicies turns the agent's left-out NetworkPolicies into Events on
// them: a Warning naming the full map and the flag to raise when a policy is
// first left out (or its message changes), a Normal event once it is
// programmed.
func (w *capacityWatcher) checkPolicies() {
	if w.pol == nil {
		return
	}
	now := map[policy.PolicyRef]string{}
	for _, l := range w.pol.UnprogrammedPolicies() {
		// The message names the map, not the counts: pods coming and going
		// change those, and each new message is a new Event.
		now[l.Policy] = fmt.Sprintf("node %s: map %s full: the policy's rules (or ipBlock prefixes) do not fit; its pods stay isolated, its allow rules are not programmed; raise lanekitd %s or remove NetworkPolicies",
			w.s.cfg.NodeName, l.Map, policyMapFlags[l.Map])
	}
	for _, ref := range slices.SortedFunc(maps.Keys(now), comparePolicyRefs) {
		msg := now[ref]
		if w.polMissing[ref] == msg {
			continue
		}
		w.polMissing[ref] = msg
		w.s.log.Warn("networkpolicy not programmed: policy map full", "policy", ref.String(), "msg", msg)
		w.policyEvent(ref, corev1.EventTypeWarning, ReasonPolicyMapFull, msg)
	}
	for _, ref := range slices.SortedFunc(maps.Keys(w.polMissing), comparePolicyRefs) {
		if _, still := now[ref]; still {
			continue
		}
		delete(w.polMissing, ref)
		w.s.log.Info("networkpolicy programmed: its map has room again", "policy", ref.String())
		w.policyEvent(ref, corev1.EventTypeNormal, ReasonPolicyProgrammed, fmt.Sprintf("node %s: programmed", w.s.cfg.NodeName))
	}
}

// policyEvent records an event on the NetworkPolicy ref, if it still exists.
func (w *capacityWatcher) policyEvent(ref policy.PolicyRef, typ, reason, msg string) {
	o, ok, err := w.s.kinds[k8sobj.KindNetworkPolicy].GetStore().GetByKey(ref.Namespace + "/" + ref.Name)
	if err != nil || !ok {
		return
	}
	if np, ok := o.(*networkingv1.NetworkPolicy); ok {
		w.recorder.Event(np, typ, reason, msg)
	}
}

func comparePolicyRefs(a, b policy.PolicyRef) int { return strings.Compare(a.String(), b.String()) }
