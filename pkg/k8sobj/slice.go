package k8sobj

import (
	"encoding/json"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
)

// EndpointSlice is what lanekit reads of a discovery.k8s.io/v1
// EndpointSlice: its name, namespace, Service, headless mark, trigger time,
// address type, ports and, of each endpoint, its addresses, conditions,
// hints and the pod it names. The agent keeps every slice of the
// cluster; the endpointslice controller writes each with its Service's
// labels copied on, a trigger-time annotation and, per endpoint, an object
// reference with the pod's UID and three condition pointers, a map or an
// allocation each. As Pod, it is converted from the decoded v1 object
// (SlimEndpointSlice: Decode for files and the agent's store, the API-server
// informers' transform) and encodes as a v1 EndpointSlice (V1, MarshalJSON):
// a stored slice reads back the same, and one stored whole by an older agent
// reads as any decoded one.
//
// Of its metadata it keeps the name, namespace, resourceVersion and
// creationTimestamp (a metav1.ObjectMeta is 232 bytes whatever it holds);
// it implements metav1.Object (slicemeta.go) for the informers' caches, and its
// kind is always discovery.k8s.io/v1 EndpointSlice (no TypeMeta). There is
// no Labels or Annotations field: what is read of them is ServiceName,
// Headless and TriggerTime.
type EndpointSlice struct {
	unkeptMeta                       // metav1.Object's accessors of what it does not keep (meta.go)
	Name, Namespace, ResourceVersion string
	CreationTimestamp                metav1.Time
	// InvalidLabels is nil unless a label of the slice is invalid: then it
	// holds them all, so that Validate refuses the slice as it refuses the
	// v1 object.
	InvalidLabels map[string]string
	// ServiceName is the kubernetes.io/service-name label.
	ServiceName string
	// Headless: the slice carries service.kubernetes.io/headless.
	Headless bool
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, as written ("" if none; an empty annotation reads as none:
	// the latency tracker falls back to the Service's creation for a new slice).
	TriggerTime string
	AddressType discoveryv1.AddressType
	Endpoints   []Endpoint
	Ports       []discoveryv1.EndpointPort
}

// Endpoint is what lanekit reads of a discoveryv1.Endpoint: not its node
// name or zone (topology is read from the hints; the health check counts
// local endpoints by address), hostname or deprecated topology.
type Endpoint struct {
	Addresses  []string
	Conditions EndpointConditions
	Hints      *discoveryv1.EndpointHints
	// TargetRef is the pod the endpoint names, nil if it names none.
	TargetRef *PodRef
}

// PodRef is an endpoint's targetRef when it is a Pod: its namespace ("" is
// the slice's) and name.
type PodRef struct {
	Namespace, Name string
}

// EndpointConditions are an endpoint's conditions, each unset, true or
// false as in the API (its pointers).
type EndpointConditions struct {
	Ready, Serving, Terminating Condition
}

// Condition is an endpoint condition: ConditionUnset (the API's nil),
// ConditionTrue or ConditionFalse.
type Condition uint8

// Condition values.
const (
	ConditionUnset Condition = iota
	ConditionTrue
	ConditionFalse
)

// Is reports whether c is set and equal to v.
func (c Condition) Is(v bool) bool { return c != ConditionUnset && (c == ConditionTrue) == v }

// IsSet reports whether c is set.
func (c Condition) IsSet() bool { return c != ConditionUnset }

func conditionOf(b *bool) Condition {
	switch {
	case b == nil:
		return ConditionUnset
	case *b:
		return ConditionTrue
	}
	return ConditionFalse
}

func (c Condition) ptr() *bool {
	if c == ConditionUnset {
		return nil
	}
	b := c == ConditionTrue
	return &b
}

// SlimEndpointSlice returns what lanekit keeps of es, in a few allocations
// of its own: one string holds its name, resourceVersion, trigger time,
// addresses and pod names, and one array each its endpoints, addresses, pod
// references and ports. A decoded slice is hundreds of small allocations; a
// converted slice that kept some of them (an address here, a port pointer
// there) would keep the heap's spans they sit in from being reused once the
// rest is garbage. It shares es's namespace, Service name, address type,
// hints and invalid labels (the transform interns the strings).
func SlimEndpointSlice(es *discoveryv1.EndpointSlice) *EndpointSlice {
	trigger := es.Annotations[corev1.EndpointsLastChangeTriggerTime]
	size, naddrs, nrefs := len(es.Name)+len(es.ResourceVersion)+len(trigger), 0, 0
	for _, e := range es.Endpoints {
		naddrs += len(e.Addresses)
		for _, a := range e.Addresses {
			size += len(a)
		}
		if isPodRef(e.TargetRef) {
			nrefs++
			size += len(e.TargetRef.Name)
		}
	}
	// The strings go into b in order; each is then cut from b's string.
	var b strings.Builder
	b.Grow(size)
	for _, s := range []string{es.Name, es.ResourceVersion, trigger} {
		b.WriteString(s)
	}
	out := &EndpointSlice{Namespace: es.Namespace, CreationTimestamp: es.CreationTimestamp,
		ServiceName: es.Labels[ServiceNameLabel], AddressType: es.AddressType, Ports: copyPorts(es.Ports)}
	_, out.Headless = es.Labels[corev1.IsHeadlessService]
	for k, v := range es.Labels {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			out.InvalidLabels = es.Labels // Validate names them: the slice is refused
			break
		}
	}
	if len(es.Endpoints) > 0 {
		out.Endpoints = make([]Endpoint, len(es.Endpoints))
		addrs := make([]string, naddrs)
		var refs []PodRef
		if nrefs > 0 {
			refs = make([]PodRef, nrefs)
		}
		for i, e := range es.Endpoints {
			o := &out.Endpoints[i]
			if e.Addresses != nil {
				n := len(e.Addresses)
				o.Addresses, addrs = addrs[:n:n], addrs[n:]
				for _, a := range e.Addresses {
					b.WriteString(a)
				}
			}
			o.Hints = e.Hints
			o.Conditions = EndpointConditions{conditionOf(e.Conditions.Ready), conditionOf(e.Conditions.Serving),
				conditionOf(e.Conditions.Terminating)}
			if isPodRef(e.TargetRef) {
				o.TargetRef, refs = &refs[0], refs[1:]
				o.TargetRef.Namespace = e.TargetRef.Namespace
				b.WriteString(e.TargetRef.Name)
			}
		}
	}
	all := b.String()
	cut := func(n int) string {
		s := all[:n]
		all = all[n:]
		return s
	}
	out.Name, out.ResourceVersion, out.TriggerTime = cut(len(es.Name)), cut(len(es.ResourceVersion)), cut(len(trigger))
	for i, e := range es.Endpoints {
		o := &out.Endpoints[i]
		for j, a := range e.Addresses {
			o.Addresses[j] = cut(len(a))
		}
		if o.TargetRef != nil {
			o.TargetRef.Name = cut(len(e.TargetRef.Name))
		}
	}
	return out
}

// isPodRef reports whether an endpoint's targetRef names a pod.
func isPodRef(r *corev1.ObjectReference) bool {
	return r != nil && r.Kind == string(KindPod) && r.Name != ""
}

// portValues are what an EndpointPort's pointers point at.
type portValues struct {
	name, appProtocol string
	protocol          corev1.Protocol
	port              int32
}

// copyPorts copies ports into two allocations (the ports and the values
// they point at), sharing only their strings.
func copyPorts(ports []discoveryv1.EndpointPort) []discoveryv1.EndpointPort {
	if ports == nil {
		return nil
	}
	out := make([]discoveryv1.EndpointPort, len(ports))
	vals := make([]portValues, len(ports))
	for i, p := range ports {
		v, o := &vals[i], &out[i]
		if p.Name != nil {
			v.name, o.Name = *p.Name, &v.name
		}
		if p.AppProtocol != nil {
			v.appProtocol, o.AppProtocol = *p.AppProtocol, &v.appProtocol
		}
		if p.Protocol != nil {
			v.protocol, o.Protocol = *p.Protocol, &v.protocol
		}
		if p.Port != nil {
			v.port, o.Port = *p.Port, &v.port
		}
	}
	return out
}

// V1 returns es as a discovery.k8s.io/v1 EndpointSlice (what it encodes
// as). It shares es's strings, hints and ports.
func (es *EndpointSlice) V1() *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{TypeMeta: metav1.TypeMeta{APIVersion: apiVersions[KindEndpointSlice], Kind: string(KindEndpointSlice)},
		ObjectMeta: metav1.ObjectMeta{Name: es.Name, Namespace: es.Namespace, ResourceVersion: es.ResourceVersion,
			CreationTimestamp: es.CreationTimestamp, Labels: es.GetLabels(), Annotations: es.GetAnnotations()},
		AddressType: es.AddressType, Ports: es.Ports}
	if len(es.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(es.Endpoints))
		for i, e := range es.Endpoints {
			o := &out.Endpoints[i]
			o.Addresses, o.Hints = e.Addresses, e.Hints
			o.Conditions = discoveryv1.EndpointConditions{Ready: e.Conditions.Ready.ptr(), Serving: e.Conditions.Serving.ptr(),
				Terminating: e.Conditions.Terminating.ptr()}
			if r := e.TargetRef; r != nil {
				o.TargetRef = &corev1.ObjectReference{Kind: string(KindPod), Namespace: r.Namespace, Name: r.Name}
			}
		}
	}
	return out
}

// MarshalJSON encodes es as a v1 EndpointSlice.
func (es *EndpointSlice) MarshalJSON() ([]byte, error) { return json.Marshal(es.V1()) }

// UnmarshalJSON decodes a v1 EndpointSlice into es (not strictly: Decode
// and DecodeJSON are the strict, validating readers).
func (es *EndpointSlice) UnmarshalJSON(b []byte) error {
	var v discoveryv1.EndpointSlice
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*es = *SlimEndpointSlice(&v)
	return nil
}

// DeepCopy returns a copy of es sharing nothing with it.
func (es *EndpointSlice) DeepCopy() *EndpointSlice {
	if es == nil {
		return nil
	}
	out := &EndpointSlice{Name: es.Name, Namespace: es.Namespace, ResourceVersion: es.ResourceVersion,
		ServiceName: es.ServiceName, Headless: es.Headless, TriggerTime: es.TriggerTime, AddressType: es.AddressType}
	es.CreationTimestamp.DeepCopyInto(&out.CreationTimestamp)
	if es.InvalidLabels != nil {
		out.InvalidLabels = maps.Clone(es.InvalidLabels)
	}
	if es.Endpoints != nil {
		out.Endpoints = make([]Endpoint, len(es.Endpoints))
		for i, e := range es.Endpoints {
			o := &out.Endpoints[i]
			*o = e
			if e.Addresses != nil {
				o.Addresses = append([]string{}, e.Addresses...)
			}
			o.Hints = e.Hints.DeepCopy()
			if e.TargetRef != nil {
				r := *e.TargetRef
				o.TargetRef = &r
			}
		}
	}
	if es.Ports != nil {
		out.Ports = make([]discoveryv1.EndpointPort, len(es.Ports))
		for i := range es.Ports {
			es.Ports[i].DeepCopyInto(&out.Ports[i])
		}
	}
	return out
}

// DeepCopyObject makes EndpointSlice a runtime.Object (the informers'
// caches hold it).
func (es *EndpointSlice) DeepCopyObject() runtime.Object {
	if c := es.DeepCopy(); c != nil {
		return c
	}
	return nil
}

var _ runtime.Object = (*EndpointSlice)(nil)
