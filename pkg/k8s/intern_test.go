package k8s

import (
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
			Annotations: map[string]string{fresh(k8sobj.NetworkStatusAnnotation): fresh(`[{"name":"x"}]`)}},
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
		a.Spec.NodeName != "node-1" || a.Status.Phase != corev1.PodRunning || a.Annotations[k8sobj.NetworkStatusAnnotation] != `[{"name":"x"}]` {
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
	if same(a.Annotations[k8sobj.NetworkStatusAnnotation], b.Annotations[k8sobj.NetworkStatusAnnotation]) {
		t.Error("annotation values interned (they seldom repeat)")
	}

	mkSlice := func(name string) *k8sobj.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: fresh(name), Namespace: fresh("team-i"),
			Labels: map[string]string{fresh(discoveryv1.LabelServiceName): fresh("web")}},
			AddressType: discoveryv1.AddressType(fresh("IPv4")),
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.7"},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: fresh("team-p"), Name: "web-1"}}}}
		o, err := slim(s)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*k8sobj.EndpointSlice)
	}
	x, y := mkSlice("x"), mkSlice("y")
	if !same(x.Namespace, y.Namespace) || !same(x.Endpoints[0].TargetRef.Namespace, y.Endpoints[0].TargetRef.Namespace) ||
		!same(string(x.AddressType), string(y.AddressType)) {
		t.Error("a slice's namespace, pods' namespaces or address type held twice")
	}
	if x.Endpoints[0].TargetRef.Namespace != "team-p" || x.ServiceName != "web" {
		t.Errorf("the transform changed the slice: %+v", x)
	}
}

// TestInternSharesAcrossGC: equal strings interned on either side of a
// collection are held once (the table holds its strings, not the objects
// alone); the table stays bounded under ever-new strings, and a string in
// use through them stays shared.
func TestInternSharesAcrossGC(t *testing.T) {
	a := intern(fresh("team-gc-across"))
	runtime.GC()
	runtime.GC()
	if b := intern(fresh("team-gc-across")); !same(a, b) || b != "team-gc-across" {
		t.Error("a string interned after a GC is a copy of its own")
	}
	tb := newInternTable(8, 16)
	hot := tb.intern(fresh("hot"))
	for i := range 100 {
		if v := fmt.Sprint("v-", i); tb.intern(fresh(v)) != v {
			t.Fatalf("interned %q changed", v)
		}
		if i%3 == 0 && !same(tb.intern(fresh("hot")), hot) {
			t.Fatalf("after %d new strings a string in use is held twice", i)
		}
		if n := tb.len(); n > 8 {
			t.Fatalf("the table holds %d strings, want <= 8", n)
		}
	}
	long := strings.Repeat("x", 17)
	if a, b := tb.intern(fresh(long)), tb.intern(fresh(long)); a != long || same(a, b) || tb.len() > 8 {
		t.Error("a string over the table's length bound was kept")
	}
}

func mapID(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }

// TestLabelSetsShared: objects carrying one label set (a Deployment's pods,
// the Services selecting them) share one map of it, with its content; the
// sets kept are bounded, and a forgotten set is still whole in the objects
// that hold it.
func TestLabelSetsShared(t *testing.T) {
	ls := labelSets{newShareTable[map[string]string](4)}
	a := ls.share(map[string]string{fresh("app"): fresh("web"), fresh("tier"): fresh("front")})
	b := ls.share(map[string]string{fresh("tier"): fresh("front"), fresh("app"): fresh("web")})
	c := ls.share(map[string]string{fresh("app"): fresh("web")})
	if mapID(a) != mapID(b) {
		t.Error("two equal label sets held twice")
	}
	if mapID(a) == mapID(c) || !maps.Equal(c, map[string]string{"app": "web"}) || !maps.Equal(a, map[string]string{"app": "web", "tier": "front"}) {
		t.Errorf("different sets shared or changed: %v %v", a, c)
	}
	// Sets that would read alike joined by a separator are different sets
	// (labels are the API server's to validate, not the key's to trust).
	if x, y := ls.share(map[string]string{"a:b": "c"}), ls.share(map[string]string{"a": "b:c"}); mapID(x) == mapID(y) {
		t.Errorf("%v and %v shared one map", x, y)
	}
	var held []map[string]string
	for i := range 20 {
		m := map[string]string{"app": fmt.Sprint("app-", i)}
		held = append(held, ls.share(m))
	}
	if ls.len() > 4 {
		t.Errorf("%d sets kept, want <= 4", ls.len())
	}
	for i, m := range held {
		if !maps.Equal(m, map[string]string{"app": fmt.Sprint("app-", i)}) {
			t.Errorf("set %d: %v", i, m)
		}
	}
	// Through the transform: two pods of one set share it; a slice's labels
	// (its Service's name) are its own.
	p1, _ := slim(pod("team-l", "p1", "node-1", map[string]string{fresh("app"): fresh("shared-set-test")}))
	p2, _ := slim(pod("team-l", "p2", "node-1", map[string]string{fresh("app"): fresh("shared-set-test")}))
	if mapID(p1.(*k8sobj.Pod).Labels) != mapID(p2.(*k8sobj.Pod).Labels) {
		t.Error("two pods of one label set hold two maps")
	}
}

// TestInternObjectSharesWithTheInformers: objects read back from the
// agent's store at a restart (InternObject, agent.Config.RestoreObject)
// share their namespace, label sets and interned strings with the
// informers' objects, which they are held beside until each kind's full
// set replaces them, and say what they said.
func TestInternObjectSharesWithTheInformers(t *testing.T) {
	labels := map[string]string{"app.kubernetes.io/name": "web", "pod-template-hash": "7c9d"}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "team-r", Labels: maps.Clone(labels)},
		Spec:   corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}}}}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Namespace: "team-r",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "team-r", Name: "web-1"}}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-r", Labels: maps.Clone(labels)},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.5", ClusterIPs: []string{"10.96.0.5"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
	informed := map[k8sobj.Kind]any{}
	for kind, o := range map[k8sobj.Kind]any{k8sobj.KindPod: p.DeepCopy(), k8sobj.KindEndpointSlice: es.DeepCopy(), k8sobj.KindService: svc.DeepCopy()} {
		s, err := slim(o)
		if err != nil {
			t.Fatal(err)
		}
		informed[kind] = s
	}
	// A restart's restore runs long after the informers decoded what the
	// store holds: collections between them must not lose the strings.
	runtime.GC()
	runtime.GC()
	// As the store has them: JSON, decoded apart.
	restore := func(kind k8sobj.Kind) (k8sobj.Object, k8sobj.Object) {
		t.Helper()
		o, err := toObject(kind, informed[kind])
		if err != nil {
			t.Fatal(err)
		}
		raw, err := k8sobj.EncodeJSON(o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := k8sobj.DecodeJSON(raw)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := k8sobj.DecodeJSON(raw)
		InternObject(&got)
		return got, want
	}
	pod, want := restore(k8sobj.KindPod)
	if !reflect.DeepEqual(pod, want) {
		t.Errorf("interning changed the pod:\n%+v\nwant\n%+v", pod.Pod, want.Pod)
	}
	ip := informed[k8sobj.KindPod].(*k8sobj.Pod)
	if reflect.ValueOf(pod.Pod.Labels).UnsafePointer() != reflect.ValueOf(ip.Labels).UnsafePointer() {
		t.Error("the restored pod's label set is a map of its own, not the informers' pod's")
	}
	if !same(pod.Pod.Namespace, ip.Namespace) || !same(pod.Pod.Spec.NodeName, ip.Spec.NodeName) || !same(string(pod.Pod.Status.Phase), string(ip.Status.Phase)) {
		t.Error("the restored pod's namespace, node or phase is a copy of its own")
	}
	slice, want := restore(k8sobj.KindEndpointSlice)
	if !reflect.DeepEqual(slice, want) {
		t.Errorf("interning changed the slice:\n%+v\nwant\n%+v", slice.EndpointSlice, want.EndpointSlice)
	}
	restored, want := restore(k8sobj.KindService)
	if !reflect.DeepEqual(restored, want) {
		t.Errorf("interning changed the Service:\n%+v\nwant\n%+v", restored.Service, want.Service)
	}
	isvc := informed[k8sobj.KindService].(*k8sobj.Service)
	if mapID(restored.Service.Labels) != mapID(isvc.Labels) || reflect.ValueOf(restored.Service.Spec.Ports).Pointer() != reflect.ValueOf(isvc.Spec.Ports).Pointer() ||
		!same(restored.Service.Namespace, isvc.Namespace) {
		t.Error("the restored Service's labels, port list or namespace are its own, not the informers' Service's")
	}
	is := informed[k8sobj.KindEndpointSlice].(*k8sobj.EndpointSlice)
	if !same(slice.EndpointSlice.Namespace, is.Namespace) || !same(slice.EndpointSlice.Endpoints[0].TargetRef.Namespace, is.Endpoints[0].TargetRef.Namespace) {
		t.Error("the restored slice's namespace or pods' namespaces are copies of their own")
	}
}

// TestServiceSpecPartsShared: Services decoded apart with equal port
// lists, IP families and policies share one of each after the transform,
// with their values; the first ClusterIP is the ClusterIP's string; port
// lists differing in any field are not shared.
func TestServiceSpecPartsShared(t *testing.T) {
	// portsKey must see every field of a port: a field added by a
	// k8s.io/api bump would let two different lists share one.
	if n := reflect.TypeFor[corev1.ServicePort]().NumField(); n != 6 {
		t.Fatalf("corev1.ServicePort has %d fields, portsKey knows 6", n)
	}
	mk := func(name string, edit func(*corev1.ServicePort)) *k8sobj.Service {
		p := corev1.ServicePort{Name: fresh("http"), Protocol: corev1.Protocol(fresh("TCP")), Port: 80, TargetPort: intstr.FromInt32(8080)}
		if edit != nil {
			edit(&p)
		}
		single, local := corev1.IPFamilyPolicy(fresh("SingleStack")), corev1.ServiceInternalTrafficPolicy(fresh("Local"))
		ip := "10.96." + name
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fresh(name), Namespace: fresh("team-s")},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{p}, ClusterIP: fresh(ip), ClusterIPs: []string{fresh(ip)},
				IPFamilies: []corev1.IPFamily{corev1.IPFamily(fresh("IPv4"))}, IPFamilyPolicy: &single, InternalTrafficPolicy: &local}}
		o, err := slim(s)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*k8sobj.Service)
	}
	sliceID := func(v any) uintptr { return reflect.ValueOf(v).Pointer() }
	a, b := mk("0.1", nil), mk("0.2", nil)
	want := []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}
	if !reflect.DeepEqual(a.Spec.Ports, want) || !reflect.DeepEqual(b.Spec.Ports, want) || *a.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack ||
		*a.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal || !slices.Equal(a.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) ||
		!slices.Equal(a.Spec.ClusterIPs, []string{"10.96.0.1"}) || b.Spec.ClusterIP != "10.96.0.2" {
		t.Fatalf("the transform changed the Service's spec: %+v", a.Spec)
	}
	if sliceID(a.Spec.Ports) != sliceID(b.Spec.Ports) || sliceID(a.Spec.IPFamilies) != sliceID(b.Spec.IPFamilies) ||
		a.Spec.IPFamilyPolicy != b.Spec.IPFamilyPolicy || a.Spec.InternalTrafficPolicy != b.Spec.InternalTrafficPolicy {
		t.Error("two Services' equal port lists, IP families or policies held twice")
	}
	if !same(a.Spec.ClusterIP, a.Spec.ClusterIPs[0]) {
		t.Error("the first ClusterIP is a copy of the ClusterIP")
	}
	for what, edit := range map[string]func(*corev1.ServicePort){
		"name":         func(p *corev1.ServicePort) { p.Name = "web" },
		"protocol":     func(p *corev1.ServicePort) { p.Protocol = corev1.ProtocolUDP },
		"appProtocol":  func(p *corev1.ServicePort) { p.AppProtocol = ptr.To("") },
		"port":         func(p *corev1.ServicePort) { p.Port = 81 },
		"target int":   func(p *corev1.ServicePort) { p.TargetPort = intstr.FromInt32(8081) },
		"target named": func(p *corev1.ServicePort) { p.TargetPort = intstr.FromString("8080") },
		"nodePort":     func(p *corev1.ServicePort) { p.NodePort = 30080 },
	} {
		c := mk("0.3", edit)
		if sliceID(c.Spec.Ports) == sliceID(a.Spec.Ports) {
			t.Errorf("a port list with another %s shares the list: %+v", what, c.Spec.Ports)
		}
		wantC := slices.Clone(want)
		edit(&wantC[0])
		if !reflect.DeepEqual(c.Spec.Ports, wantC) {
			t.Errorf("%s: ports %+v, want %+v", what, c.Spec.Ports, wantC)
		}
	}
}
