package bench

import (
	"bytes"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Objects renders service i as the Kubernetes objects a cluster would hold
// for it: a ClusterIP Service and one EndpointSlice with its ready
// endpoints (the input lanekit's rows program through the agent).
func (s *SvcSet) Objects(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &s.Services[i]
	tcp := corev1.ProtocolTCP
	k8ssvc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: svc.IP.String(),
			ClusterIPs: []string{svc.IP.String()}},
	}
	slice := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-ep",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range svc.Ports {
		k8ssvc.Spec.Ports = append(k8ssvc.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: tcp, Port: int32(p.Port),
			TargetPort: intstr.FromInt32(int32(p.TargetPort))})
		name, port := p.Name, int32(p.TargetPort)
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &tcp, Port: &port})
	}
	ready := true
	for _, ep := range svc.Endpoints {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return k8ssvc, slice
}

// ObjectsJSON renders services [from, to) as a JSON object stream (Service,
// then its EndpointSlice), what `lanekit service apply -f` and the agent's
// ApplyObjects take.
func (s *SvcSet) ObjectsJSON(from, to int) ([]byte, error) {
	if from < 0 || to > len(s.Services) || from > to {
		return nil, fmt.Errorf("service objects [%d, %d) of %d services", from, to, len(s.Services))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := from; i < to; i++ {
		svc, slice := s.Objects(i)
		if err := enc.Encode(svc); err != nil {
			return nil, fmt.Errorf("encode %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		if err := enc.Encode(slice); err != nil {
			return nil, fmt.Errorf("encode %s/%s: %w", slice.Namespace, slice.Name, err)
		}
	}
	return buf.Bytes(), nil
}

// SliceJSON renders service i's EndpointSlice alone (a one-change update).
func (s *SvcSet) SliceJSON(i int) ([]byte, error) {
	_, slice := s.Objects(i)
	data, err := json.Marshal(slice)
	if err != nil {
		return nil, fmt.Errorf("encode %s/%s: %w", slice.Namespace, slice.Name, err)
	}
	return data, nil
}
