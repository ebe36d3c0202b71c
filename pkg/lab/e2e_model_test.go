package lab

import (
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// An independent model of Kubernetes NetworkPolicy semantics for the lab's
// truth table, written from the API reference and evaluated directly on the
// objects. It shares no code with pkg/policy (the code under test) or
// pkg/k8sobj (its decoder): the objects are decoded with sigs.k8s.io/yaml.
// The one implementation choice it encodes is lanekit's (and Cilium's):
// an ipBlock never matches the IP of a pod (pods are selected by labels).

// modelPod is a pod as the model sees it.
type modelPod struct {
	name, ns string
	ip       netip.Addr
	labels   map[string]string
	ports    []modelPort // named container ports
}

type modelPort struct {
	name  string
	port  int
	proto string // "TCP" / "UDP"
}

type policyModel struct {
	pods     []*modelPod
	nsLabels map[string]map[string]string // labels besides kubernetes.io/metadata.name
	policies []*networkingv1.NetworkPolicy
}

// verdict of a connection attempt: allowed, or which side denied it first
// (the sender's egress is checked before the receiver's ingress).
type verdict int

const (
	allowed verdict = iota
	deniedEgress
	deniedIngress
)

func (v verdict) String() string {
	return [...]string{"allow", "deny(egress)", "deny(ingress)"}[v]
}

// parsePolicies decodes a multi-document YAML of NetworkPolicies.
func parsePolicies(t *testing.T, doc string) []*networkingv1.NetworkPolicy {
	t.Helper()
	var out []*networkingv1.NetworkPolicy
	for _, d := range strings.Split(doc, "\n---\n") {
		var p networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(d), &p); err != nil {
			t.Fatalf("model: %v in\n%s", err, d)
		}
		if p.Kind != "NetworkPolicy" {
			continue
		}
		out = append(out, &p)
	}
	return out
}

func (m *policyModel) podAt(ip netip.Addr) *modelPod {
	for _, p := range m.pods {
		if p.ip == ip {
			return p
		}
	}
	return nil
}

func matches(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		panic(err)
	}
	return s.Matches(labels.Set(l))
}

func (m *policyModel) namespaceLabels(ns string) map[string]string {
	l := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range m.nsLabels[ns] {
		l[k] = v
	}
	return l
}

// appliesTo: does policy p select pod for the direction? policyTypes
// default to Ingress, plus Egress when the policy has egress rules.
func appliesTo(p *networkingv1.NetworkPolicy, pod *modelPod, egress bool) bool {
	if p.Namespace != pod.ns || !matches(&p.Spec.PodSelector, pod.labels) {
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
	for _, ty := range p.Spec.PolicyTypes {
		if ty == want {
			return true
		}
	}
	return false
}

// peerAdmits: does a rule's peer list admit the other side (ip, its pod or nil)?
func (m *policyModel) peerAdmits(policyNS string, peers []networkingv1.NetworkPolicyPeer, ip netip.Addr, other *modelPod) bool {
	if len(peers) == 0 {
		return true // empty from/to: every peer
	}
	for _, pr := range peers {
		if pr.IPBlock != nil {
			if other != nil {
				continue
			}
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
		nsOK := other.ns == policyNS // podSelector alone: the policy's namespace
		if pr.NamespaceSelector != nil {
			nsOK = matches(pr.NamespaceSelector, m.namespaceLabels(other.ns))
		}
		podOK := pr.PodSelector == nil || matches(pr.PodSelector, other.labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// portAdmits: does a rule's port list admit proto/port at the receiver
// (named ports resolve against the receiving pod's container ports)?
func portAdmits(ports []networkingv1.NetworkPolicyPort, proto string, port int, receiver *modelPod) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want := "TCP"
		if p.Protocol != nil {
			want = string(*p.Protocol)
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
			for _, np := range receiver.ports {
				if np.name == p.Port.StrVal && np.proto == proto && np.port == port {
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

// decide is the model's verdict for a new connection src → dst:port.
func (m *policyModel) decide(src, dst netip.Addr, proto string, port int) verdict {
	sp, dp := m.podAt(src), m.podAt(dst)
	if sp != nil {
		isolated, ok := false, false
		for _, p := range m.policies {
			if !appliesTo(p, sp, true) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Egress {
				ok = ok || (m.peerAdmits(p.Namespace, r.To, dst, dp) && portAdmits(r.Ports, proto, port, dp))
			}
		}
		if isolated && !ok {
			return deniedEgress
		}
	}
	if dp != nil {
		isolated, ok := false, false
		for _, p := range m.policies {
			if !appliesTo(p, dp, false) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Ingress {
				ok = ok || (m.peerAdmits(p.Namespace, r.From, src, sp) && portAdmits(r.Ports, proto, port, dp))
			}
		}
		if isolated && !ok {
			return deniedIngress
		}
	}
	return allowed
}
