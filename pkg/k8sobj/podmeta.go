package k8sobj

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Pod implements metav1.Object and runtime.Object without ObjectMeta and
// TypeMeta, as Service does: the informers' caches key it by namespace and
// name, and it is always a v1 Pod. The getters of what it does not keep
// return zero values, and their setters do nothing.

var _ metav1.Object = (*Pod)(nil)

// podKind is every Pod's schema.ObjectKind.
var podKind = fixedKind{schema.GroupVersionKind{Version: "v1", Kind: string(KindPod)}}

func (p *Pod) GetObjectKind() schema.ObjectKind    { return &podKind }
func (p *Pod) GetNamespace() string                { return p.Namespace }
func (p *Pod) SetNamespace(ns string)              { p.Namespace = ns }
func (p *Pod) GetName() string                     { return p.Name }
func (p *Pod) SetName(name string)                 { p.Name = name }
func (p *Pod) GetUID() types.UID                   { return p.UID }
func (p *Pod) SetUID(uid types.UID)                { p.UID = uid }
func (p *Pod) GetResourceVersion() string          { return p.ResourceVersion }
func (p *Pod) SetResourceVersion(v string)         { p.ResourceVersion = v }
func (p *Pod) GetCreationTimestamp() metav1.Time   { return p.CreationTimestamp }
func (p *Pod) SetCreationTimestamp(t metav1.Time)  { p.CreationTimestamp = t }
func (p *Pod) GetDeletionTimestamp() *metav1.Time  { return p.DeletionTimestamp }
func (p *Pod) SetDeletionTimestamp(t *metav1.Time) { p.DeletionTimestamp = t }
func (p *Pod) GetLabels() map[string]string        { return p.Labels }
func (p *Pod) SetLabels(l map[string]string)       { p.Labels = l }
func (p *Pod) GetAnnotations() map[string]string   { return p.Annotations }
func (p *Pod) SetAnnotations(a map[string]string)  { p.Annotations = a }
