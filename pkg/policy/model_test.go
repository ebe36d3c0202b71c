package policy

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/lanekit/lanekit/internal/policymodel"
)

// world is the test's cluster, judged by the INDEPENDENT reference model in
// internal/policymodel (Kubernetes NetworkPolicy semantics evaluated directly
// on the objects, sharing no code with the compiler). It only translates the
// endpoints and protocol numbers the compiler takes into the model's terms.
type world struct {
	pods     []Endpoint
	nsLabels map[string]map[string]string
	policies []*networkingv1.NetworkPolicy
	model    []policymodel.Pod // pods, translated on first use
}

func (w *world) pod(ip netip.Addr) *Endpoint {
	for i := range w.pods {
		if w.pods[i].IP == ip {
			return &w.pods[i]
		}
	}
	return nil
}

// allowed: the reference decision for a new connection src → dst:port.
func (w *world) allowed(src, dst netip.Addr, proto uint8, port uint16) bool {
	if w.model == nil {
		for _, ep := range w.pods {
			p := policymodel.Pod{Name: ep.Name, Namespace: ep.Namespace, IP: ep.IP, Labels: ep.Labels}
			for _, np := range ep.NamedPorts {
				p.Ports = append(p.Ports, policymodel.Port{Name: np.Name, Port: int(np.Port), Protocol: modelProto(np.Proto)})
			}
			w.model = append(w.model, p)
		}
	}
	m := policymodel.Model{Pods: w.model, NamespaceLabels: w.nsLabels, Policies: w.policies}
	return m.Decide(src, dst, modelProto(proto), int(port)) == policymodel.Allowed
}

func modelProto(p uint8) corev1.Protocol {
	switch p {
	case ProtoTCP:
		return corev1.ProtocolTCP
	case ProtoUDP:
		return corev1.ProtocolUDP
	}
	panic(fmt.Sprintf("model: IP protocol %d", p))
}
