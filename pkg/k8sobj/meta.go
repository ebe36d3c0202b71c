package k8sobj

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The slim types (Pod, Service, EndpointSlice) implement metav1.Object and
// runtime.Object without ObjectMeta and TypeMeta. unkeptMeta, embedded first
// (it takes no room there), serves the metadata none of them keeps: its
// getters return zero values and its setters do nothing. Each type's own
// file has the accessors of what it keeps.
type unkeptMeta struct{}

func (unkeptMeta) GetGenerateName() string                       { return "" }
func (unkeptMeta) SetGenerateName(string)                        {}
func (unkeptMeta) GetGeneration() int64                          { return 0 }
func (unkeptMeta) SetGeneration(int64)                           {}
func (unkeptMeta) GetSelfLink() string                           { return "" }
func (unkeptMeta) SetSelfLink(string)                            {}
func (unkeptMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (unkeptMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (unkeptMeta) GetFinalizers() []string                       { return nil }
func (unkeptMeta) SetFinalizers([]string)                        {}
func (unkeptMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (unkeptMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (unkeptMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (unkeptMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

// fixedKind is a slim type's schema.ObjectKind: always its one group,
// version and kind (setting it does nothing).
type fixedKind struct{ gvk schema.GroupVersionKind }

func (fixedKind) SetGroupVersionKind(schema.GroupVersionKind)  {}
func (k *fixedKind) GroupVersionKind() schema.GroupVersionKind { return k.gvk }
