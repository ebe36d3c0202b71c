package k8sobj

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Service implements metav1.Object and runtime.Object without ObjectMeta
// and TypeMeta, as EndpointSlice does: the informers' caches key it by
// namespace and name, and it is always a v1 Service. The getters of what
// it does not keep return zero values, and their setters do nothing.

var _ metav1.Object = (*Service)(nil)

// serviceKind is every Service's schema.ObjectKind.
var serviceKind = fixedKind{schema.GroupVersionKind{Version: "v1", Kind: string(KindService)}}

func (s *Service) GetObjectKind() schema.ObjectKind   { return &serviceKind }
func (s *Service) GetNamespace() string               { return s.Namespace }
func (s *Service) SetNamespace(ns string)             { s.Namespace = ns }
func (s *Service) GetName() string                    { return s.Name }
func (s *Service) SetName(name string)                { s.Name = name }
func (s *Service) GetUID() types.UID                  { return s.UID }
func (s *Service) SetUID(uid types.UID)               { s.UID = uid }
func (s *Service) GetResourceVersion() string         { return s.ResourceVersion }
func (s *Service) SetResourceVersion(v string)        { s.ResourceVersion = v }
func (s *Service) GetCreationTimestamp() metav1.Time  { return s.CreationTimestamp }
func (s *Service) SetCreationTimestamp(t metav1.Time) { s.CreationTimestamp = t }
func (s *Service) GetDeletionTimestamp() *metav1.Time { return nil }
func (s *Service) SetDeletionTimestamp(*metav1.Time)  {}
func (s *Service) GetLabels() map[string]string       { return s.Labels }
func (s *Service) SetLabels(l map[string]string)      { s.Labels = l }
func (s *Service) GetAnnotations() map[string]string  { return s.Annotations }
func (s *Service) SetAnnotations(a map[string]string) { s.Annotations = a }
