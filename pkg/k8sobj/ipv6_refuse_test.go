package k8sobj

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestIPv6ServicesRefusedPerObject: until Services cover IPv6 (a later slice
// of issue 25) an IPv6 cluster IP, a dual-stack Service and an IPv6
// EndpointSlice are each refused with a reason naming the field, so that
// none is half-programmed (IPv4 only, silently).
func TestIPv6ServicesRefusedPerObject(t *testing.T) {
	svc := func(ips ...string) Object {
		return Object{Kind: KindService, Service: &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: ips[0], ClusterIPs: ips,
				Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}}
	}
	if err := Validate(svc("10.96.0.10")); err != nil {
		t.Fatalf("IPv4 service refused: %v", err)
	}
	for _, c := range []struct {
		name string
		o    Object
		want string
	}{
		{"IPv6 cluster IP", svc("fd00:96::10"), "spec.clusterIP"},
		{"dual-stack cluster IPs", svc("10.96.0.10", "fd00:96::10"), "spec.clusterIPs[1]"},
		{"IPv6 EndpointSlice", Object{Kind: KindEndpointSlice, EndpointSlice: &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv6,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"fd00:10:244:1::5"}}},
		}}, "addressType"},
	} {
		err := Validate(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one naming %s", c.name, err, c.want)
		}
	}
}
