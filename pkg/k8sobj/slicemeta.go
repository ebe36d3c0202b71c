package k8sobj

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// EndpointSlice implements metav1.Object and runtime.Object without
// ObjectMeta and TypeMeta: the informers' caches key it by namespace and
// name, and it is always a discovery.k8s.io/v1 EndpointSlice. The getters
// of what it does not keep return zero values (its labels and annotations:
// those it keeps, as a v1 slice has them), and their setters do nothing.

var _ metav1.Object = (*EndpointSlice)(nil)

// sliceKind is every EndpointSlice's schema.ObjectKind.
var sliceKind = fixedKind{schema.GroupVersionKind{Group: "discovery.k8s.io", Version: "v1", Kind: string(KindEndpointSlice)}}

func (es *EndpointSlice) GetObjectKind() schema.ObjectKind   { return &sliceKind }
func (es *EndpointSlice) GetNamespace() string               { return es.Namespace }
func (es *EndpointSlice) SetNamespace(ns string)             { es.Namespace = ns }
func (es *EndpointSlice) GetName() string                    { return es.Name }
func (es *EndpointSlice) SetName(name string)                { es.Name = name }
func (es *EndpointSlice) GetUID() types.UID                  { return "" }
func (es *EndpointSlice) SetUID(types.UID)                   {}
func (es *EndpointSlice) GetResourceVersion() string         { return es.ResourceVersion }
func (es *EndpointSlice) SetResourceVersion(v string)        { es.ResourceVersion = v }
func (es *EndpointSlice) GetCreationTimestamp() metav1.Time  { return es.CreationTimestamp }
func (es *EndpointSlice) SetCreationTimestamp(t metav1.Time) { es.CreationTimestamp = t }
func (es *EndpointSlice) GetDeletionTimestamp() *metav1.Time { return nil }
func (es *EndpointSlice) SetDeletionTimestamp(*metav1.Time)  {}
func (es *EndpointSlice) SetLabels(map[string]string)        {}

// GetLabels returns the slice's labels: those it keeps (all of them if one
// is invalid).
func (es *EndpointSlice) GetLabels() map[string]string {
	if es.InvalidLabels != nil || (es.ServiceName == "" && !es.Headless) {
		return es.InvalidLabels
	}
	out := make(map[string]string, 2)
	if es.ServiceName != "" {
		out[ServiceNameLabel] = es.ServiceName
	}
	if es.Headless {
		out[corev1.IsHeadlessService] = ""
	}
	return out
}

// GetAnnotations returns the slice's annotations: its trigger time.
func (es *EndpointSlice) GetAnnotations() map[string]string {
	if es.TriggerTime == "" {
		return nil
	}
	return map[string]string{corev1.EndpointsLastChangeTriggerTime: es.TriggerTime}
}

func (es *EndpointSlice) SetAnnotations(map[string]string) {}
