package k8sobj

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Service is what lanekit reads of a v1 Service: its name, namespace,
// resourceVersion, UID, creation time and labels (the service-proxy-name and
// headless labels), the spec fields service translation and validation
// read, and its load-balancer status. The agent keeps every Service of the
// cluster; a corev1.Service is 592 bytes before any of its contents (a
// metav1.ObjectMeta alone is 232), and a Service has no field the
// agent reads that is not here. As EndpointSlice, it is converted from the
// decoded v1 object (SlimService: Decode for files and the agent's store,
// the API-server informers' transform) and encodes as a v1 Service (V1,
// MarshalJSON): a stored Service reads back the same, and one stored whole
// by an older agent reads as any decoded one.
//
// Not kept: the selector (the endpointslice controller's input: the agent
// reads the slices), the annotations but the source-ranges one and the rest of the metadata, the
// deprecated loadBalancerIP, loadBalancerClass and
// allocateLoadBalancerNodePorts (the LB IPAM controller, which reads them,
// has informers of its own), publishNotReadyAddresses (the controller
// writes the endpoints' conditions by it), trafficDistribution and the
// status conditions. It implements metav1.Object (servicemeta.go) for the
// informers' caches, and its kind is always v1 Service (no TypeMeta).
type Service struct {
	unkeptMeta                       // metav1.Object's accessors of what it does not keep (meta.go)
	Name, Namespace, ResourceVersion string
	// UID names the Service in the events the agent records on it.
	UID               types.UID
	CreationTimestamp metav1.Time
	Labels            map[string]string
	// Annotations holds the annotations lanekit reads (serviceAnnotations),
	// nil if the Service has none of them.
	Annotations map[string]string
	Spec        ServiceSpec
	Status      ServiceStatus
}

// ServiceSpec is what lanekit reads of a corev1.ServiceSpec: the same
// fields, with the same names and types.
type ServiceSpec struct {
	Ports                    []corev1.ServicePort
	ClusterIP                string
	ClusterIPs               []string
	Type                     corev1.ServiceType
	ExternalIPs              []string
	SessionAffinity          corev1.ServiceAffinity
	LoadBalancerSourceRanges []string
	ExternalName             string
	ExternalTrafficPolicy    corev1.ServiceExternalTrafficPolicy
	HealthCheckNodePort      int32
	SessionAffinityConfig    *corev1.SessionAffinityConfig
	IPFamilies               []corev1.IPFamily
	IPFamilyPolicy           *corev1.IPFamilyPolicy
	InternalTrafficPolicy    *corev1.ServiceInternalTrafficPolicy
}

// ServiceStatus is what lanekit reads of a corev1.ServiceStatus.
type ServiceStatus struct {
	LoadBalancer corev1.LoadBalancerStatus
}

// SlimService returns what lanekit keeps of s. The result shares s's
// strings, maps, slices and pointers: s must not change afterwards.
func SlimService(s *corev1.Service) *Service {
	sp := &s.Spec
	return &Service{Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.ResourceVersion, UID: s.UID,
		CreationTimestamp: s.CreationTimestamp, Labels: s.Labels, Annotations: keepAnnotations(s.Annotations, serviceAnnotations),
		Spec: ServiceSpec{Ports: sp.Ports, ClusterIP: sp.ClusterIP, ClusterIPs: sp.ClusterIPs, Type: sp.Type,
			ExternalIPs: sp.ExternalIPs, SessionAffinity: sp.SessionAffinity, LoadBalancerSourceRanges: sp.LoadBalancerSourceRanges,
			ExternalName: sp.ExternalName, ExternalTrafficPolicy: sp.ExternalTrafficPolicy, HealthCheckNodePort: sp.HealthCheckNodePort,
			SessionAffinityConfig: sp.SessionAffinityConfig, IPFamilies: sp.IPFamilies, IPFamilyPolicy: sp.IPFamilyPolicy,
			InternalTrafficPolicy: sp.InternalTrafficPolicy},
		Status: ServiceStatus{LoadBalancer: s.Status.LoadBalancer}}
}

// serviceAnnotations are the Service annotations lanekit reads.
var serviceAnnotations = []string{corev1.AnnotationLoadBalancerSourceRangesKey}

// keepAnnotations returns those of the annotations a named in keep (a map
// of its own), nil if none.
func keepAnnotations(a map[string]string, keep []string) map[string]string {
	var out map[string]string
	for _, k := range keep {
		if v, ok := a[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keep))
			}
			out[k] = v
		}
	}
	return out
}

// V1 returns s as a v1 Service (what it encodes as). It shares s's
// strings, maps, slices and pointers.
func (s *Service) V1() *corev1.Service {
	sp := &s.Spec
	return &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: apiVersions[KindService], Kind: string(KindService)},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.ResourceVersion, UID: s.UID,
			CreationTimestamp: s.CreationTimestamp, Labels: s.Labels, Annotations: s.Annotations},
		Spec: corev1.ServiceSpec{Ports: sp.Ports, ClusterIP: sp.ClusterIP, ClusterIPs: sp.ClusterIPs, Type: sp.Type,
			ExternalIPs: sp.ExternalIPs, SessionAffinity: sp.SessionAffinity, LoadBalancerSourceRanges: sp.LoadBalancerSourceRanges,
			ExternalName: sp.ExternalName, ExternalTrafficPolicy: sp.ExternalTrafficPolicy, HealthCheckNodePort: sp.HealthCheckNodePort,
			SessionAffinityConfig: sp.SessionAffinityConfig, IPFamilies: sp.IPFamilies, IPFamilyPolicy: sp.IPFamilyPolicy,
			InternalTrafficPolicy: sp.InternalTrafficPolicy},
		Status: corev1.ServiceStatus{LoadBalancer: s.Status.LoadBalancer}}
}

// MarshalJSON encodes s as a v1 Service.
func (s *Service) MarshalJSON() ([]byte, error) { return json.Marshal(s.V1()) }

// UnmarshalJSON decodes a v1 Service into s (not strictly: Decode and
// DecodeJSON are the strict, validating readers).
func (s *Service) UnmarshalJSON(b []byte) error {
	var v corev1.Service
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = *SlimService(&v)
	return nil
}

// DeepCopy returns a copy of s sharing nothing with it.
func (s *Service) DeepCopy() *Service {
	if s == nil {
		return nil
	}
	return SlimService(s.V1().DeepCopy())
}

// DeepCopyObject makes Service a runtime.Object (the informers' caches
// hold it).
func (s *Service) DeepCopyObject() runtime.Object {
	if c := s.DeepCopy(); c != nil {
		return c
	}
	return nil
}

var _ runtime.Object = (*Service)(nil)
