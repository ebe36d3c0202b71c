// Package policymodel is an independent model of Kubernetes NetworkPolicy
// semantics: the oracle that pkg/policy's compiler (its unit tests) and the
// lab's datapath (its truth-table e2e test) are checked against. It is
// written from the API reference and evaluates the objects directly, and it
// is deliberately naive. It shares no code with pkg/policy (the code under
// test) or pkg/k8sobj (its decoder): DecodePolicies uses sigs.k8s.io/yaml.
// Keep it that way: importing either would make it check itself.
//
// A peer matches by identity (podSelector/namespaceSelector: pods only) or
// by address (ipBlock: every address in cidr minus except, pods' included);
// a rule admits the union. Kubernetes' own netpol e2e tests rely on ipBlocks
// covering pod addresses ("should allow egress access to server in CIDR
// block", "...except clause...").
package policymodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// Pod is a pod (or VM) as the model sees it.
type Pod struct {
	Name, Namespace string
	IP              netip.Addr
	Labels          map[string]string
	Ports           []Port // named container ports
}

// Port is a named container port.
type Port struct {
	Name     string
	Port     int
	Protocol corev1.Protocol
}

// Model is a cluster: pods, namespace labels and policies.
type Model struct {
	Pods []Pod
	// NamespaceLabels are the labels besides kubernetes.io/metadata.name,
	// which every namespace has.
	NamespaceLabels map[string]map[string]string
	Policies        []*networkingv1.NetworkPolicy
}

// Verdict of a connection attempt: allowed, or which side denied it first
// (the sender's egress is checked before the receiver's ingress).
type Verdict int

// The verdicts.
const (
	Allowed Verdict = iota
	DeniedEgress
	DeniedIngress
)

func (v Verdict) String() string {
	return [...]string{"allow", "deny(egress)", "deny(ingress)"}[v]
}

// DecodePolicies decodes a multi-document YAML ("---" lines between
// documents) and returns its NetworkPolicies; other kinds are skipped.
func DecodePolicies(doc string) ([]*networkingv1.NetworkPolicy, error) {
	var out []*networkingv1.NetworkPolicy
	for _, d := range strings.Split(doc, "\n---\n") {
		var p networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(d), &p); err != nil {
			return nil, fmt.Errorf("policymodel: %w in\n%s", err, d)
		}
		if p.Kind != "NetworkPolicy" {
			continue
		}
		out = append(out, &p)
	}
	return out, nil
}

// PodAt is the pod with address ip, or nil (an address outside the cluster).
func (m *Model) PodAt(ip netip.Addr) *Pod {
	for i := range m.Pods {
		if m.Pods[i].IP == ip {
			return &m.Pods[i]
		}
	}
	return nil
}

// Decide is the model's verdict for a new connection src → dst:port.
func (m *Model) Decide(src, dst netip.Addr, proto corev1.Protocol, port int) Verdict {
	sp, dp := m.PodAt(src), m.PodAt(dst)
	if sp != nil {
		isolated, ok := false, false
		for _, p := range m.Policies {
			if !appliesTo(p, sp, true) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Egress {
				ok = ok || (m.peerAdmits(p.Namespace, r.To, dst, dp) && portAdmits(r.Ports, proto, port, dp))
			}
		}
		if isolated && !ok {
			return DeniedEgress
		}
	}
	if dp != nil {
		isolated, ok := false, false
		for _, p := range m.Policies {
			if !appliesTo(p, dp, false) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Ingress {
				ok = ok || (m.peerAdmits(p.Namespace, r.From, src, sp) && portAdmits(r.Ports, proto, port, dp))
			}
		}
		if isolated && !ok {
			return DeniedIngress
		}
	}
	return Allowed
}

func matches(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		panic(err)
	}
	return s.Matches(labels.Set(l))
}

func (m *Model) namespaceLabels(ns string) map[string]string {
	l := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range m.NamespaceLabels[ns] {
		l[k] = v
	}
	return l
}

// appliesTo: does policy p select pod for the direction? API reference: "If
// this field is not specified, it will default based on the existence of
// ingress or egress rules; policies that contain an egress section are
// assumed to affect egress, and all policies (whether or not they contain an
// ingress section) are assumed to affect ingress."
func appliesTo(p *networkingv1.NetworkPolicy, pod *Pod, egress bool) bool {
	if p.Namespace != pod.Namespace || !matches(&p.Spec.PodSelector, pod.Labels) {
		return false
	}
	if len(p.Spec.PolicyTypes) == 0 {
		if egress {
			return len(p.Spec.Egress) > 0
		}
		return true
	}
	want := networkingv1.PolicyTypeIngress
	if egress {
		want = networkingv1.PolicyTypeEgress
	}
	return slices.Contains(p.Spec.PolicyTypes, want)
}

// peerAdmits: does a rule's peer list admit the other side (ip, its pod or nil)?
func (m *Model) peerAdmits(policyNS string, peers []networkingv1.NetworkPolicyPeer, ip netip.Addr, other *Pod) bool {
	if len(peers) == 0 {
		return true // empty from/to: every peer
	}
	for _, pr := range peers {
		if pr.IPBlock != nil {
			// By address, whether or not a pod has it.
			if !netip.MustParsePrefix(pr.IPBlock.CIDR).Contains(ip) {
				continue
			}
			excluded := false
			for _, e := range pr.IPBlock.Except {
				excluded = excluded || netip.MustParsePrefix(e).Contains(ip)
			}
			if !excluded {
				return true
			}
			continue
		}
		if other == nil {
			continue // pod/namespace selectors select pods only
		}
		nsOK := other.Namespace == policyNS // podSelector alone: the policy's namespace
		if pr.NamespaceSelector != nil {
			nsOK = matches(pr.NamespaceSelector, m.namespaceLabels(other.Namespace))
		}
		podOK := pr.PodSelector == nil || matches(pr.PodSelector, other.Labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// portAdmits: does a rule's port list admit proto/port at the receiver
// (named ports resolve against the receiving pod's container ports)?
func portAdmits(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int, receiver *Pod) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want := corev1.ProtocolTCP
		if p.Protocol != nil {
			want = *p.Protocol
		}
		if want != proto {
			continue
		}
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal != "" {
			if receiver == nil {
				continue
			}
			for _, np := range receiver.Ports {
				if np.Name == p.Port.StrVal && np.Protocol == proto && np.Port == port {
					return true
				}
			}
			continue
		}
		lo, hi := int(p.Port.IntVal), int(p.Port.IntVal)
		if p.EndPort != nil {
			hi = int(*p.EndPort)
		}
		if port >= lo && port <= hi {
			return true
		}
	}
	return false
}
