package k8s

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// The informers' transform (slim) runs before an object enters the cache:
// what the agent never reads goes, as Cilium's slim types keep only the
// fields its agent reads. The agent wraps the cached objects without a copy
// (toObject): the transform also sets the TypeMeta the agent's objects
// carry (informers hand out objects without it), and nothing in the agent
// changes an object it was given.
//
// Kept: every object's metadata (labels and annotations are read: the
// service-name label, trigger times, bandwidth and network-status
// annotations) but its managedFields and kubectl's last-applied copy of the
// whole object. Pods keep their node, hostNetwork, each container's name and
// ports (named ports, hostPorts) and their addresses and phase; their
// volumes, images, commands, environment, probes, resources, scheduling
// constraints, container statuses and containers without ports go. Nodes keep their pod CIDRs,
// addresses and taints; their image lists, volumes, capacity and conditions
// go. Services, EndpointSlices, Namespaces and NetworkPolicies are read
// whole.

// lastApplied is kubectl apply's annotation: the whole object again, as JSON.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

func slim(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil // a cache.DeletedFinalStateUnknown: its object was transformed
	}
	m.SetManagedFields(nil)
	if a := m.GetAnnotations(); a[lastApplied] != "" {
		delete(a, lastApplied)
		if len(a) == 0 {
			m.SetAnnotations(nil)
		}
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		slimPod(o)
		o.TypeMeta = typeMeta[k8sobj.KindPod]
	case *corev1.Node:
		slimNode(o)
	case *corev1.Namespace:
		o.TypeMeta = typeMeta[k8sobj.KindNamespace]
	case *corev1.Service:
		o.TypeMeta = typeMeta[k8sobj.KindService]
	case *discoveryv1.EndpointSlice:
		o.TypeMeta = typeMeta[k8sobj.KindEndpointSlice]
	case *networkingv1.NetworkPolicy:
		o.TypeMeta = typeMeta[k8sobj.KindNetworkPolicy]
	}
	return obj, nil
}

func slimPod(p *corev1.Pod) {
	s := &p.Spec
	*s = corev1.PodSpec{
		NodeName: s.NodeName, HostNetwork: s.HostNetwork,
		InitContainers: slimContainers(s.InitContainers), Containers: slimContainers(s.Containers),
	}
	st := &p.Status
	*st = corev1.PodStatus{Phase: st.Phase, Reason: st.Reason, PodIP: st.PodIP, PodIPs: st.PodIPs, HostIP: st.HostIP, HostIPs: st.HostIPs}
}

// slimContainers keeps the containers that declare ports (the agent reads
// named ports and hostPorts, nothing else of a container): a Container is
// ~500 bytes even with only its name set, so 50,000 pods without ports
// kept 26 MB of empty containers.
func slimContainers(cs []corev1.Container) []corev1.Container {
	n := 0
	for _, c := range cs {
		if len(c.Ports) > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]corev1.Container, 0, n)
	for _, c := range cs {
		if len(c.Ports) > 0 {
			out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
		}
	}
	return out
}

func slimNode(n *corev1.Node) {
	n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses}
}
