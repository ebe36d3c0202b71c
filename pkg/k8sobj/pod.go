package k8sobj

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is what lanekit reads of a v1 Pod: its name, namespace,
// resourceVersion, UID, creation and deletion times, labels and
// annotations, node, host network, the containers that declare ports (named
// ports, hostPorts) and its phase and addresses. A corev1.Pod is 1,240 bytes before any of its contents,
// whatever it holds; the agent keeps every pod of the cluster (remote pods
// give identities), so it keeps this one (as Cilium's slim types do), with
// metadata of its own as Service and EndpointSlice (no ObjectMeta or
// TypeMeta: podmeta.go). The field names are a Pod's (pod.Name,
// pod.Spec.NodeName, pod.Status.PodIPs) and it encodes as a v1 Pod (V1,
// MarshalJSON): a Pod stored by an older agent, with its whole metadata,
// reads back as a decoded one.
//
// Decode reads a file's Pod into a corev1.Pod (strictly, as any object) and
// keeps this of it (SlimPod); the API-server watchers convert in their
// informers' transform, before the cache keeps anything.
type Pod struct {
	unkeptMeta                       // metav1.Object's accessors of what it does not keep (meta.go)
	Name, Namespace, ResourceVersion string
	UID                              types.UID
	CreationTimestamp                metav1.Time
	DeletionTimestamp                *metav1.Time
	Labels                           map[string]string
	Annotations                      map[string]string
	Spec                             PodSpec   `json:"spec,omitempty"`
	Status                           PodStatus `json:"status,omitempty"`
}

// PodSpec is what lanekit reads of a corev1.PodSpec.
type PodSpec struct {
	NodeName    string `json:"nodeName,omitempty"`
	HostNetwork bool   `json:"hostNetwork,omitempty"`
	// Only the containers that declare ports.
	InitContainers []Container `json:"initContainers,omitempty"`
	Containers     []Container `json:"containers,omitempty"`
}

// Container is what lanekit reads of a corev1.Container (a sidecar is an
// init container with restartPolicy Always).
type Container struct {
	Name          string                         `json:"name"`
	Ports         []corev1.ContainerPort         `json:"ports,omitempty"`
	RestartPolicy *corev1.ContainerRestartPolicy `json:"restartPolicy,omitempty"`
}

// PodStatus is what lanekit reads of a corev1.PodStatus.
type PodStatus struct {
	Phase   corev1.PodPhase `json:"phase,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	HostIP  string          `json:"hostIP,omitempty"`
	HostIPs []corev1.HostIP `json:"hostIPs,omitempty"`
	PodIP   string          `json:"podIP,omitempty"`
	PodIPs  []corev1.PodIP  `json:"podIPs,omitempty"`
}

// SlimPod returns what lanekit keeps of p: the fields of Pod (not the
// managed fields, owner references, finalizers, generateName and the rest
// of the metadata, which nothing reads). The result shares p's strings,
// maps and port slices: p must not change afterwards.
func SlimPod(p *corev1.Pod) *Pod {
	m := &p.ObjectMeta
	out := &Pod{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion, UID: m.UID,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp, Labels: m.Labels, Annotations: m.Annotations}
	out.Spec = PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork,
		InitContainers: slimContainers(p.Spec.InitContainers), Containers: slimContainers(p.Spec.Containers)}
	s := &p.Status
	out.Status = PodStatus{Phase: s.Phase, Reason: s.Reason, HostIP: s.HostIP, HostIPs: s.HostIPs, PodIP: s.PodIP, PodIPs: s.PodIPs}
	return out
}

// slimContainers keeps the containers that declare ports: lanekit reads
// named ports and hostPorts, nothing else of a container.
func slimContainers(cs []corev1.Container) []Container {
	n := 0
	for _, c := range cs {
		if len(c.Ports) > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]Container, 0, n)
	for _, c := range cs {
		if len(c.Ports) > 0 {
			out = append(out, Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
		}
	}
	return out
}

// DeepCopy returns a copy of p sharing nothing with it.
func (p *Pod) DeepCopy() *Pod {
	if p == nil {
		return nil
	}
	m := (&metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion, UID: p.UID,
		CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp, Labels: p.Labels, Annotations: p.Annotations}).DeepCopy()
	out := &Pod{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion, UID: m.UID,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp, Labels: m.Labels, Annotations: m.Annotations}
	out.Spec = PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork,
		InitContainers: copyContainers(p.Spec.InitContainers), Containers: copyContainers(p.Spec.Containers)}
	s := p.Status
	out.Status = PodStatus{Phase: s.Phase, Reason: s.Reason, HostIP: s.HostIP, PodIP: s.PodIP}
	if s.HostIPs != nil {
		out.Status.HostIPs = append([]corev1.HostIP{}, s.HostIPs...)
	}
	if s.PodIPs != nil {
		out.Status.PodIPs = append([]corev1.PodIP{}, s.PodIPs...)
	}
	return out
}

// DeepCopyObject makes Pod a runtime.Object (the informers' caches hold it).
func (p *Pod) DeepCopyObject() runtime.Object {
	if c := p.DeepCopy(); c != nil {
		return c
	}
	return nil
}

func copyContainers(cs []Container) []Container {
	if cs == nil {
		return nil
	}
	out := make([]Container, len(cs))
	for i, c := range cs {
		out[i] = Container{Name: c.Name}
		if c.Ports != nil {
			out[i].Ports = append([]corev1.ContainerPort{}, c.Ports...)
		}
		if c.RestartPolicy != nil {
			rp := *c.RestartPolicy
			out[i].RestartPolicy = &rp
		}
	}
	return out
}

var _ runtime.Object = (*Pod)(nil)

// V1 returns p as a v1 Pod (what it encodes as). It shares p's strings,
// maps, slices and pointers.
func (p *Pod) V1() *corev1.Pod {
	s := &p.Status
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: apiVersions[KindPod], Kind: string(KindPod)},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion, UID: p.UID,
			CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp, Labels: p.Labels, Annotations: p.Annotations},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork,
			InitContainers: v1Containers(p.Spec.InitContainers), Containers: v1Containers(p.Spec.Containers)},
		Status: corev1.PodStatus{Phase: s.Phase, Reason: s.Reason, HostIP: s.HostIP, HostIPs: s.HostIPs, PodIP: s.PodIP, PodIPs: s.PodIPs}}
}

func v1Containers(cs []Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// MarshalJSON encodes p as a v1 Pod.
func (p *Pod) MarshalJSON() ([]byte, error) { return json.Marshal(p.V1()) }

// UnmarshalJSON decodes a v1 Pod into p (not strictly: Decode and
// DecodeJSON are the strict, validating readers).
func (p *Pod) UnmarshalJSON(b []byte) error {
	var v corev1.Pod
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = *SlimPod(&v)
	return nil
}
