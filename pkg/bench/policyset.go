package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PolicyNamespace is where the bench's NetworkPolicies live: the lab's pods
// (no Pod objects, no namespace in their CNI args) are in "default".
const PolicyNamespace = "default"

// PolicyName is the name of bench policy i.
func PolicyName(i int) string { return fmt.Sprintf("bench-pol-%05d", i) }

// MaxPolicies bounds PolicySetJSON.
const MaxPolicies = 20000

// PolicySet is n NetworkPolicies that all select every pod of
// PolicyNamespace for ingress: policy 0 allows TCP from allow (the
// benchmark client) on any port, every other policy allows one /32 of
// 10.200.0.0/16 on one TCP port, so each adds rules that the benchmark's
// traffic is checked against but none matches it.
func PolicySet(n int, allow networkingv1.NetworkPolicyPeer) ([]*networkingv1.NetworkPolicy, error) {
	if n < 0 || n > MaxPolicies {
		return nil, fmt.Errorf("policy set: %d policies: want 0..%d", n, MaxPolicies)
	}
	tcp := corev1.ProtocolTCP
	var out []*networkingv1.NetworkPolicy
	for i := range n {
		rule := networkingv1.NetworkPolicyIngressRule{}
		if i == 0 {
			rule.From = []networkingv1.NetworkPolicyPeer{allow}
		} else {
			port := intstr.FromInt32(int32(1000 + i%60000))
			rule.From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
				CIDR: fmt.Sprintf("10.200.%d.%d/32", (i/250)%256, 1+i%250)}}}
			rule.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}
		}
		out = append(out, &networkingv1.NetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Namespace: PolicyNamespace, Name: PolicyName(i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{rule},
			},
		})
	}
	return out, nil
}

// PolicySetJSON is PolicySet allowing allowFrom (the benchmark client's pod
// range), as a JSON object stream, as the agent's ApplyObjects takes.
func PolicySetJSON(n int, allowFrom netip.Prefix) ([]byte, error) {
	set, err := PolicySet(n, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: allowFrom.String()}})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, np := range set {
		if err := enc.Encode(np); err != nil {
			return nil, fmt.Errorf("encode %s: %w", np.Name, err)
		}
	}
	return buf.Bytes(), nil
}

// policyBound: rows with policies stay within ±3 % of the same row without.
const policyBound = 0.03

// policyTargets compares every row measured with policies to its
// zero-policy twin (same Base): TCP, RR p50 and RR p99 as paired ratios.
func policyTargets(r *Report) []TargetResult {
	var out []TargetResult
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Policies == nil || *row.Policies == 0 {
			continue
		}
		var ref *Row
		for j := range r.Rows {
			o := &r.Rows[j]
			if o.Policies != nil && *o.Policies == 0 && o.PolicyBase == row.PolicyBase {
				ref = o
			}
		}
		if ref == nil {
			continue
		}
		for _, m := range []string{"tcp_gbps", "rr_p50_us", "rr_p99_us"} {
			res := TargetResult{Path: row.Path, Metric: m, Ref: ref.Path, Want: fmt.Sprintf("within ±%.0f %%", policyBound*100)}
			res.Ratio = pairedRatio(metricReps(row, m), metricReps(ref, m))
			res.Met = res.Ratio != nil && math.Abs(res.Ratio.Median-1) <= policyBound
			out = append(out, res)
		}
	}
	return out
}
