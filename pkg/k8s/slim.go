package k8s

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kvv1 "kubevirt.io/api/core/v1"

	"github.com/lanekit/lanekit/pkg/agent"
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
// bandwidth and network-status annotations) but its managedFields and
// kubectl's last-applied copy of the whole object. Pods become the agent's own k8sobj.Pod (a corev1.Pod is
// 1,240 bytes whatever it holds): their node, hostNetwork, each container
// with ports (its name, ports, restart policy) and their addresses and
// phase; of their metadata, not the owner references, finalizers or
// generateName, and only the annotations the agent reads (podAnnotations:
// pod annotations are anyone's who may edit pods, of any size). Nodes keep
// their pod CIDRs, addresses and taints; their image lists, volumes,
// capacity and conditions go. Services become the agent's own
// k8sobj.Service (a corev1.Service is 592 bytes, its ObjectMeta 232 of
// them): their name, namespace, UID, resourceVersion, creation time,
// labels, the source-ranges annotation, the spec the agent reads and the
// load-balancer status; not their spec.selector (the endpointslice
// controller's input: the agent reads the slices, and a Service's selector
// is nearly always a label set of its own, a map per Service), their other
// annotations, owner references and finalizers, nor the spec fields only
// the LB IPAM controller reads (it has informers of its own). Their port
// lists, IP families and family and internal traffic policies are shared
// between Services that have equal ones (sharedSpec, intern.go). EndpointSlices become the agent's own k8sobj.EndpointSlice:
// their name, namespace, Service name, headless mark, trigger-time
// annotation, address type, ports and, of each endpoint, its addresses,
// conditions (three states, not three pointers), hints and the pod it
// names (namespace and name); not the labels the controller copies from
// the Service (a map per slice), the annotation map, owner references and
// UID, nor the endpoints' node names, zones, hostnames and the rest of
// their object references. Namespaces and NetworkPolicies are read whole.

// lastApplied is kubectl apply's annotation: the whole object again, as JSON.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// podAnnotations are the pod annotations the agent reads.
var podAnnotations = []string{
	agent.AnnotationEgressBandwidth, agent.AnnotationIngressBandwidth, // bandwidth.go
	k8sobj.NetworkStatusAnnotation,                    // vmitrust.go: a launcher pod's networks
	annotationDomain, kvv1.MigrationJobNameAnnotation, // vmi.go: a launcher pod's VMI and migration
}

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
		p := slimPod(o)
		internMeta(p, true)
		internPod(p)
		return p, nil
	case *corev1.Node:
		slimNode(o)
	case *corev1.Namespace:
		o.TypeMeta = typeMeta[k8sobj.KindNamespace]
	case *corev1.Service:
		svc := k8sobj.SlimService(o)
		svc.Labels = sharedLabels.share(svc.Labels)
		svc.Namespace = intern(svc.Namespace)
		internService(svc)
		return svc, nil
	case *discoveryv1.EndpointSlice:
		es := k8sobj.SlimEndpointSlice(o)
		internSlice(es)
		return es, nil
	case *networkingv1.NetworkPolicy:
		o.TypeMeta = typeMeta[k8sobj.KindNetworkPolicy]
	}
	internMeta(m, true)
	return obj, nil
}

// slimPod is what the agent keeps of a pod from the API server: the
// transform's, or a pod read with a Get.
func slimPod(p *corev1.Pod) *k8sobj.Pod {
	out := k8sobj.SlimPod(p)
	var keep map[string]string
	for _, k := range podAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if keep == nil {
				keep = map[string]string{}
			}
			keep[k] = v
		}
	}
	out.Annotations = keep
	return out
}

func slimNode(n *corev1.Node) {
	n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses}
}
