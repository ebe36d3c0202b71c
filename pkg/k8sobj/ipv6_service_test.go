package k8sobj

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestIPv6ServicesValidated: IPv6 and dual-stack ClusterIP Services and
// IPv6 EndpointSlices are accepted (pkg/service programs them per family);
// so are IPv6-only NodePort Services and IPv6 external addresses (NodePort
// scope frontends per family); malformed dual-stack input is refused per
// object with the field named.
func TestIPv6ServicesValidated(t *testing.T) {
	svc := func(typ corev1.ServiceType, ips ...string) Object {
		s := SlimService(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: corev1.ServiceSpec{Type: typ, ClusterIP: ips[0], ClusterIPs: ips,
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		})
		if typ == corev1.ServiceTypeNodePort {
			s.Spec.Ports[0].NodePort = 30080
		}
		return Object{Kind: KindService, Service: s}
	}
	slice := func(typ discoveryv1.AddressType, addr string) Object {
		return Object{Kind: KindEndpointSlice, EndpointSlice: SlimEndpointSlice(&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: typ,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
		})}
	}
	dual := svc(corev1.ServiceTypeClusterIP, "10.96.0.10", "fd00:96::10")
	pol := corev1.IPFamilyPolicyRequireDualStack
	dual.Service.Spec.IPFamilyPolicy = &pol
	dual.Service.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	ext6 := svc(corev1.ServiceTypeClusterIP, "10.96.0.10", "fd00:96::10")
	ext6.Service.Spec.ExternalIPs = []string{"2001:db8::7"}
	mapped := svc(corev1.ServiceTypeClusterIP, "10.96.0.10", "fd00:96::10")
	mapped.Service.Spec.ExternalIPs = []string{"::ffff:10.0.0.7"}
	for name, o := range map[string]Object{
		"IPv4":                         svc(corev1.ServiceTypeClusterIP, "10.96.0.10"),
		"IPv6 cluster IP":              svc(corev1.ServiceTypeClusterIP, "fd00:96::10"),
		"dual-stack, RequireDualStack": dual,
		"IPv6 first, dual-stack":       svc(corev1.ServiceTypeClusterIP, "fd00:96::10", "10.96.0.10"),
		"dual-stack NodePort":          svc(corev1.ServiceTypeNodePort, "10.96.0.10", "fd00:96::10"),
		"IPv6-only NodePort":           svc(corev1.ServiceTypeNodePort, "fd00:96::10"),
		"IPv6 external IP":             ext6,
		"IPv6 EndpointSlice":           slice(discoveryv1.AddressTypeIPv6, "fd00:10:244:1::5"),
	} {
		if err := Validate(o); err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
	for _, c := range []struct {
		name string
		o    Object
		want string
	}{
		{"two cluster IPs of one family", svc(corev1.ServiceTypeClusterIP, "10.96.0.10", "10.96.0.11"), "spec.clusterIPs[1]"},
		{"three cluster IPs", svc(corev1.ServiceTypeClusterIP, "10.96.0.10", "fd00:96::10", "10.96.0.11"), "spec.clusterIPs"},
		{"an IPv4-mapped cluster IP", svc(corev1.ServiceTypeClusterIP, "::ffff:10.96.0.10"), "spec.clusterIP"},
		{"an IPv4-mapped external IP", mapped, "spec.externalIPs[0]"},
		{"IPv4 address in an IPv6 slice", slice(discoveryv1.AddressTypeIPv6, "10.0.0.5"), "endpoints[0].addresses[0]"},
		{"IPv6 address in an IPv4 slice", slice(discoveryv1.AddressTypeIPv4, "fd00::5"), "endpoints[0].addresses[0]"},
	} {
		err := Validate(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one naming %s", c.name, err, c.want)
		}
	}
}
