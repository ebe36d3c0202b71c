package k8s

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/service"
)

// Services as the real API server stores them (defaulted, allocated): a
// LoadBalancer with externalTrafficPolicy Local (healthCheckNodePort
// allocated), external IPs, ExternalName and headless Services apply; a
// LoadBalancer with loadBalancerSourceRanges applies too, its ranges on
// the ingress IP its status gets (and on nothing else), nothing refused.
func TestServicesTrafficPolicyFromAPIServer(t *testing.T) {
	a := newMemAgent(t)
	e := newEnv(t)
	m := metrics.New(metrics.Options{Log: slog.New(slog.DiscardHandler)})
	if err := m.Watch(a); err != nil {
		t.Fatal(err)
	}
	port := []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}
	svc := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}
	}
	local := corev1.ServiceInternalTrafficPolicyLocal
	mustCreate(t, e.c.CoreV1().Services("default").Create, svc("lb-local", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, Ports: port}))
	mustCreate(t, e.c.CoreV1().Services("default").Create, svc("ext", corev1.ServiceSpec{ExternalIPs: []string{"192.0.2.44"},
		InternalTrafficPolicy: &local, Ports: port}))
	mustCreate(t, e.c.CoreV1().Services("default").Create, svc("alias", corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName,
		ExternalName: "db.example.com"}))
	mustCreate(t, e.c.CoreV1().Services("default").Create, svc("headless", corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: port}))
	mustCreate(t, e.c.CoreV1().Services("default").Create, svc("ranges", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
		LoadBalancerSourceRanges: []string{"10.0.0.0/8"}, Ports: port}))

	// lb-local has an endpoint on another node only: its NodePort is Local
	// with no backend (the datapath drops: no-local-backend).
	ready := true
	addrType := discoveryv1.AddressTypeIPv4
	pp, pn := int32(8080), "p"
	mustCreate(t, e.c.DiscoveryV1().EndpointSlices("default").Create, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "lb-local-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "lb-local"}},
		AddressType: addrType, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &pp}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.80.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}})
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: a})
	eventually(t, "initial sync", func() bool {
		return src.Synced() == nil && len(a.Objects("Service")) == 6 && len(a.Objects("EndpointSlice")) >= 1
	})
	got := map[string]bool{}
	for _, o := range a.Objects("Service") {
		got[o.Name()] = true
	}
	for _, n := range []string{"kubernetes", "lb-local", "ext", "alias", "headless", "ranges"} {
		if !got[n] {
			t.Errorf("service %s not applied (have %v)", n, got)
		}
	}
	if r := src.Refused(); len(r) != 0 {
		t.Errorf("refused %v", r)
	}
	if got := refusedMetric(t, m, "Service"); got != 0 {
		t.Errorf("%s{kind=Service} = %v, want 0", metrics.NameObjectsRefused, got)
	}
	// A load-balancer controller gives "ranges" its ingress IP: that
	// frontend takes the ranges, the ClusterIP and NodePort do not.
	rs, err := e.c.CoreV1().Services("default").Get(context.Background(), "ranges", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.45"}}
	if _, err := e.c.CoreV1().Services("default").UpdateStatus(context.Background(), rs, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ranges on the ingress IP", func() bool {
		n := 0
		for _, f := range a.Frontends() {
			if f.Service.Name != "ranges" {
				continue
			}
			want := f.Key.Addr == netip.MustParseAddr("192.0.2.45")
			if got := slices.Equal(f.SourceRanges, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); got != want {
				return false
			}
			if want {
				n++
			}
		}
		return n == 1
	})
	var npLocal, extNP, itpLocal bool
	for _, f := range a.Frontends() {
		switch {
		case f.Service.Name == "lb-local" && f.Key.Scope == service.ScopeNodePort:
			npLocal = f.Local
		case f.Service.Name == "ext" && f.Key.Addr.String() == "192.0.2.44":
			extNP = f.External && f.Key.Scope == service.ScopeNodePort
		case f.Service.Name == "ext" && f.Key.Scope == service.ScopeClusterIP:
			itpLocal = true // no endpoints: not Local (answers no-backend), but translated
		}
	}
	if !npLocal || !extNP || !itpLocal {
		t.Errorf("frontends: lb-local NodePort Local %v, ext external %v, ext ClusterIP %v", npLocal, extNP, itpLocal)
	}
}
