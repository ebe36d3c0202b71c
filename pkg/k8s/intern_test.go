package k8s

import (
	"maps"
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// fresh is s in memory of its own, as a decoder leaves each object's strings.
func fresh(s string) string { return strings.Clone(s) }

func same(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestTransformInternsRepeatedStrings: two objects decoded apart hold their
// namespace, label keys and values, node names and enum fields in one copy
// after the transform, with their values unchanged; names and annotation
// values keep their own.
func TestTransformInternsRepeatedStrings(t *testing.T) {
	mkPod := func(name string) *k8sobj.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fresh(name), Namespace: fresh("team-i"),
			Labels:      map[string]string{fresh("app.kubernetes.io/name"): fresh("web"), fresh("pod-template-hash"): fresh("5d8f7b")},
			Annotations: map[string]string{fresh(networkStatusAnnotation): fresh(`[{"name":"x"}]`)}},
			Spec:   corev1.PodSpec{NodeName: fresh("node-1"), Containers: []corev1.Container{{Name: fresh("c"), Ports: []corev1.ContainerPort{{Name: fresh("http"), ContainerPort: 80, Protocol: corev1.Protocol(fresh("TCP"))}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodPhase(fresh("Running")), HostIP: fresh("192.168.1.1"), PodIP: name}}
		o, err := slim(p)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*k8sobj.Pod)
	}
	a, b := mkPod("a"), mkPod("b")
	if !maps.Equal(a.Labels, map[string]string{"app.kubernetes.io/name": "web", "pod-template-hash": "5d8f7b"}) || a.Namespace != "team-i" ||
		a.Spec.NodeName != "node-1" || a.Status.Phase != corev1.PodRunning || a.Annotations[networkStatusAnnotation] != `[{"name":"x"}]` {
		t.Fatalf("the transform changed the pod: %+v", a)
	}
	for k, v := range a.Labels {
		for k2, v2 := range b.Labels {
			if k == k2 && (!same(k, k2) || !same(v, v2)) {
				t.Errorf("label %s=%s held twice", k, v)
			}
		}
	}
	for what, pair := range map[string][2]string{
		"namespace": {a.Namespace, b.Namespace}, "node": {a.Spec.NodeName, b.Spec.NodeName}, "phase": {string(a.Status.Phase), string(b.Status.Phase)},
		"host IP": {a.Status.HostIP, b.Status.HostIP}, "port name": {a.Spec.Containers[0].Ports[0].Name, b.Spec.Containers[0].Ports[0].Name},
	} {
		if !same(pair[0], pair[1]) {
			t.Errorf("%s %q held twice", what, pair[0])
		}
	}
	if same(a.Annotations[networkStatusAnnotation], b.Annotations[networkStatusAnnotation]) {
		t.Error("annotation values interned (they seldom repeat)")
	}

	mkSlice := func(name string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: fresh(name), Namespace: fresh("team-i"),
			Labels: map[string]string{fresh(discoveryv1.LabelManagedBy): fresh("endpointslice-controller.k8s.io")}},
			AddressType: discoveryv1.AddressType(fresh("IPv4")),
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.7"}, NodeName: ptr.To(fresh("node-1"))}}}
		o, err := slim(s)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*discoveryv1.EndpointSlice)
	}
	x, y := mkSlice("x"), mkSlice("y")
	if !same(x.Namespace, y.Namespace) || !same(*x.Endpoints[0].NodeName, *y.Endpoints[0].NodeName) || !same(string(x.AddressType), string(y.AddressType)) ||
		!same(x.Labels[discoveryv1.LabelManagedBy], y.Labels[discoveryv1.LabelManagedBy]) {
		t.Error("a slice's namespace, node names, address type or labels held twice")
	}
	if *x.Endpoints[0].NodeName != "node-1" || x.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
		t.Errorf("the transform changed the slice: %+v", x)
	}
}
