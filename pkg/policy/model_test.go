package policy

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// This file is the INDEPENDENT reference model: Kubernetes NetworkPolicy
// semantics evaluated directly on the objects, written from the API reference
// without using any of the compiler's code. It is deliberately naive.

type world struct {
	pods     []Endpoint
	nsLabels map[string]map[string]string
	policies []*networkingv1.NetworkPolicy
}

func (w *world) pod(ip netip.Addr) *Endpoint {
	for i := range w.pods {
		if w.pods[i].IP == ip {
			return &w.pods[i]
		}
	}
	return nil
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		panic(err)
	}
	return s.Matches(labels.Set(l))
}

func (w *world) namespaceLabels(ns string) map[string]string {
	l := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range w.nsLabels[ns] {
		l[k] = v
	}
	return l
}

// governs: does policy p govern pod in direction egress/ingress?
func governs(p *networkingv1.NetworkPolicy, pod *Endpoint, egress bool) bool {
	if p.Namespace != pod.Namespace || !selects(&p.Spec.PodSelector, pod.Labels) {
		return false
	}
	types := p.Spec.PolicyTypes
	if len(types) == 0 {
		// API reference: "If this field is not specified, it will default
		// based on the existence of ingress or egress rules; policies that
		// contain an egress section are assumed to affect egress, and all
		// policies (whether or not they contain an ingress section) are
		// assumed to affect ingress."
		if egress {
			return len(p.Spec.Egress) > 0
		}
		return true
	}
	want := networkingv1.PolicyTypeIngress
	if egress {
		want = networkingv1.PolicyTypeEgress
	}
	for _, t := range types {
		if t == want {
			return true
		}
	}
	return false
}

// peerOK: does the peer list admit the other side (ip, and its pod if any)?
func (w *world) peerOK(policyNS string, peers []networkingv1.NetworkPolicyPeer, ip netip.Addr, other *Endpoint) bool {
	if len(peers) == 0 {
		return true
	}
	for _, pr := range peers {
		if pr.IPBlock != nil {
			// lanekit's choice (Cilium's): ipBlock never matches pod IPs.
			if other != nil {
				continue
			}
			in := netip.MustParsePrefix(pr.IPBlock.CIDR).Contains(ip)
			for _, e := range pr.IPBlock.Except {
				if netip.MustParsePrefix(e).Contains(ip) {
					in = false
				}
			}
			if in {
				return true
			}
			continue
		}
		if other == nil {
			continue
		}
		nsOK := other.Namespace == policyNS
		if pr.NamespaceSelector != nil {
			nsOK = selects(pr.NamespaceSelector, w.namespaceLabels(other.Namespace))
		}
		podOK := pr.PodSelector == nil || selects(pr.PodSelector, other.Labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// portOK: does the port list admit proto/port at the destination pod dst?
func portOK(ports []networkingv1.NetworkPolicyPort, proto uint8, port uint16, dst *Endpoint) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want := uint8(6)
		if p.Protocol != nil && *p.Protocol == corev1.ProtocolUDP {
			want = 17
		}
		if want != proto {
			continue
		}
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal != "" {
			if dst == nil {
				continue
			}
			for _, np := range dst.NamedPorts {
				if np.Name == p.Port.StrVal && np.Proto == proto && np.Port == port {
					return true
				}
			}
			continue
		}
		lo, hi := int(p.Port.IntVal), int(p.Port.IntVal)
		if p.EndPort != nil {
			hi = int(*p.EndPort)
		}
		if int(port) >= lo && int(port) <= hi {
			return true
		}
	}
	return false
}

// allowed: the reference decision for a new connection src → dst:port.
func (w *world) allowed(src, dst netip.Addr, proto uint8, port uint16) bool {
	sp, dp := w.pod(src), w.pod(dst)
	if sp != nil {
		isolated, ok := false, false
		for _, p := range w.policies {
			if !governs(p, sp, true) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Egress {
				if w.peerOK(p.Namespace, r.To, dst, dp) && portOK(r.Ports, proto, port, dp) {
					ok = true
				}
			}
		}
		if isolated && !ok {
			return false
		}
	}
	if dp != nil {
		isolated, ok := false, false
		for _, p := range w.policies {
			if !governs(p, dp, false) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Ingress {
				if w.peerOK(p.Namespace, r.From, src, sp) && portOK(r.Ports, proto, port, dp) {
					ok = true
				}
			}
		}
		if isolated && !ok {
			return false
		}
	}
	return true
}
