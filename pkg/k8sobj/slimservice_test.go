package k8sobj

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// fullService is a LoadBalancer Service as the API server serves it: what
// lanekit reads and much it does not.
func fullService() *corev1.Service {
	local, dual := corev1.ServiceInternalTrafficPolicyLocal, corev1.IPFamilyPolicyPreferDualStack
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u-1", ResourceVersion: "42", Generation: 2,
			CreationTimestamp: metav1.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC),
			Labels:            map[string]string{"app.kubernetes.io/name": "web", "service.kubernetes.io/headless": ""},
			Annotations: map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8", "example.com/note": "n",
				"meta.helm.sh/release-name": "shop"},
			Finalizers:      []string{"service.kubernetes.io/load-balancer-cleanup"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "c-1"}}},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("http"), Port: 80,
				TargetPort: intstr.FromString("http"), NodePort: 30080}},
			Selector:  map[string]string{"app": "web"},
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"}, Type: corev1.ServiceTypeLoadBalancer,
			ExternalIPs: []string{"192.0.2.10"}, SessionAffinity: corev1.ServiceAffinityClientIP, LoadBalancerIP: "192.0.2.20",
			LoadBalancerSourceRanges: []string{"10.1.0.0/16"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort: 31000, PublishNotReadyAddresses: true,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, IPFamilyPolicy: &dual,
			AllocateLoadBalancerNodePorts: ptr.To(true), LoadBalancerClass: ptr.To("example.com/lb"),
			InternalTrafficPolicy: &local, TrafficDistribution: ptr.To("PreferClose"),
		},
		Status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.30"}}},
			Conditions:   []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
		},
	}
}

// serviceSpecDropped are the corev1.ServiceSpec fields a Service does not
// keep (service.go says why).
var serviceSpecDropped = map[string]bool{"Selector": true, "LoadBalancerIP": true, "PublishNotReadyAddresses": true,
	"AllocateLoadBalancerNodePorts": true, "LoadBalancerClass": true, "TrafficDistribution": true}

// TestSlimService: a Service keeps every ServiceSpec field it has, with the
// v1 object's value, its load-balancer status, name, namespace, UID,
// resourceVersion, creation time, labels and the source-ranges annotation;
// what it drops of the spec is the list above, so a field a k8s.io/api bump
// adds is a decision, not a silent drop. Drop a field's copy from
// SlimService or V1 and this fails.
func TestSlimService(t *testing.T) {
	full := fullService()
	full.Spec.ExternalName = "web.example.com" // an ExternalName Service's; here for the field's copy
	s := SlimService(full)
	st, ft := reflect.TypeFor[ServiceSpec](), reflect.TypeFor[corev1.ServiceSpec]()
	sv, fv := reflect.ValueOf(s.Spec), reflect.ValueOf(full.Spec)
	for i := range st.NumField() {
		f := st.Field(i)
		want, ok := ft.FieldByName(f.Name)
		if !ok || want.Type != f.Type {
			t.Errorf("ServiceSpec.%s is not a corev1.ServiceSpec field of type %s", f.Name, f.Type)
			continue
		}
		if fv.FieldByName(f.Name).IsZero() {
			t.Errorf("fullService sets no %s", f.Name)
		}
		if !reflect.DeepEqual(sv.Field(i).Interface(), fv.FieldByName(f.Name).Interface()) {
			t.Errorf("spec.%s: %v, want %v", f.Name, sv.Field(i), fv.FieldByName(f.Name))
		}
	}
	for i := range ft.NumField() {
		if n := ft.Field(i).Name; !serviceSpecDropped[n] {
			if _, ok := st.FieldByName(n); !ok {
				t.Errorf("corev1.ServiceSpec.%s is neither kept nor among the dropped", n)
			}
		}
	}
	want := &Service{Name: "web", Namespace: "shop", UID: "u-1", ResourceVersion: "42", CreationTimestamp: full.CreationTimestamp,
		Labels: full.Labels, Annotations: map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8"},
		Spec: s.Spec, Status: ServiceStatus{LoadBalancer: full.Status.LoadBalancer}}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("slim:\n got %+v\nwant %+v", s, want)
	}
	// It encodes as the v1 Service it keeps.
	v1 := full.DeepCopy()
	v1.Generation, v1.Finalizers, v1.OwnerReferences, v1.Annotations = 0, nil, nil, want.Annotations
	v1.Spec.Selector, v1.Spec.LoadBalancerIP, v1.Spec.PublishNotReadyAddresses = nil, "", false
	v1.Spec.AllocateLoadBalancerNodePorts, v1.Spec.LoadBalancerClass, v1.Spec.TrafficDistribution = nil, nil, nil
	v1.Status.Conditions = nil
	if got := s.V1(); !reflect.DeepEqual(got, v1) {
		t.Errorf("V1:\n got %+v\nwant %+v", got, v1)
	}
	// A deep copy shares nothing.
	c := s.DeepCopy()
	if !reflect.DeepEqual(c, s) {
		t.Fatalf("copy %+v, want %+v", c, s)
	}
	c.Labels["app.kubernetes.io/name"], c.Spec.Ports[0].Port, c.Spec.ClusterIPs[0] = "x", 1, "10.0.0.1"
	*c.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = 1
	c.Status.LoadBalancer.Ingress[0].IP = "192.0.2.99"
	if s.Labels["app.kubernetes.io/name"] != "web" || s.Spec.Ports[0].Port != 80 || s.Spec.ClusterIPs[0] != "10.96.0.10" ||
		*s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 60 || s.Status.LoadBalancer.Ingress[0].IP != "192.0.2.30" {
		t.Errorf("the copy shares with the Service: %+v", s)
	}
}

// TestRestoreStoredFullService: an agent before the slim type stored each
// Service whole, as v1 JSON (selector, annotations, finalizers, status
// conditions...): read back from the store, it is the Service the
// informers' transform would have made of it, and it encodes and decodes
// again to itself.
func TestRestoreStoredFullService(t *testing.T) {
	full := fullService()
	raw, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	o, err := DecodeJSON(raw)
	if err != nil {
		t.Fatalf("a stored full Service does not restore: %v\n%s", err, raw)
	}
	want := SlimService(full)
	if o.Kind != KindService || !sameService(o.Service, want) {
		t.Errorf("restored:\n got %+v\nwant %+v", o.Service, want)
	}
	again, err := EncodeJSON(o)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeJSON(again)
	if err != nil || !sameService(back.Service, want) {
		t.Errorf("stored again and restored: %v\n got %+v\nwant %+v", err, back.Service, want)
	}
	var direct Service
	if err := json.Unmarshal(again, &direct); err != nil || !sameService(&direct, want) {
		t.Errorf("json.Unmarshal: %v\n got %+v\nwant %+v", err, &direct, want)
	}
}

// TestSlimServiceStillRefused: what Validate refused of a v1 Service it
// still refuses of the slim one, through Validate and through Decode.
func TestSlimServiceStillRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*corev1.Service)
		want string
	}{
		{"invalid label", func(s *corev1.Service) { s.Labels["app"] = "no spaces" }, "metadata.labels[app]"},
		{"invalid name", func(s *corev1.Service) { s.Name = "web.v1" }, "metadata.name"},
		{"no name", func(s *corev1.Service) { s.Name = "" }, "metadata.name"},
		{"source-range annotation not a CIDR", func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = nil
			s.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] = "10.0.0.0/8,x"
		}, "load-balancer-source-ranges"},
		{"source-range annotation on a ClusterIP", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.LoadBalancerSourceRanges, s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = corev1.ServiceTypeClusterIP, nil, "", 0
			s.Spec.Ports[0].NodePort = 0
		}, "load-balancer-source-ranges"},
		{"port out of range", func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }, "spec.ports[0].port"},
		{"invalid protocol", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "tcp" }, "spec.ports[0].protocol"},
		{"invalid clusterIP", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs[0] = "10.96.0.300", "10.96.0.300" }, "spec.clusterIP"},
		{"invalid type", func(s *corev1.Service) { s.Spec.Type = "Balanced" }, "spec.type"},
		{"affinity timeout", func(s *corev1.Service) { s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ptr.To[int32](0) },
			"spec.sessionAffinityConfig"},
	} {
		s := fullService()
		c.edit(s)
		err := Validate(Object{Service: SlimService(s)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
		raw, jerr := json.Marshal(s)
		if jerr != nil {
			t.Fatal(jerr)
		}
		if _, err := DecodeJSON(raw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: DecodeJSON: %v, want an error naming %s", c.name, err, c.want)
		}
	}
	if err := Validate(Object{Service: SlimService(fullService())}); err != nil {
		t.Errorf("the full Service: %v", err)
	}
}

// sameService is reflect.DeepEqual but for the creation time's location
// (a decoded time is local).
func sameService(a, b *Service) bool {
	if a == nil || b == nil || !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return false
	}
	x, y := *a, *b
	x.CreationTimestamp, y.CreationTimestamp = metav1.Time{}, metav1.Time{}
	return reflect.DeepEqual(&x, &y)
}
