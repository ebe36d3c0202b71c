package k8s

import (
	"context"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// TestCachesKeepOnlyWhatTheAgentReads: through a real API server, a pod and
// a node as kubelet and kubectl leave them reach the agent slim — volumes,
// images, environment, probes, container statuses, node image lists and
// kubectl's last-applied copy gone; labels, the annotations the agent reads,
// named ports, hostPorts, node and addresses kept — and the agent's object
// is the cache's own (no second copy of every object).
func TestCachesKeepOnlyWhatTheAgentReads(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-s"}})
	p := pod("team-s", "fat", "node-1", map[string]string{"app": "web"})
	p.Annotations = map[string]string{lastApplied: `{"kind":"Pod","spec":{"containers":[{"image":"busybox"}]}}`, "kubernetes.io/egress-bandwidth": "10M",
		"example.com/unread": strings.Repeat("x", 4096)}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u1"}}
	c := &p.Spec.Containers[0]
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: 8443, HostPort: 30443, Protocol: corev1.ProtocolTCP})
	c.Env = []corev1.EnvVar{{Name: "SECRETISH", Value: "x"}}
	c.Command = []string{"/bin/sh", "-c", "sleep infinity"}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}}
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
	created := mustCreate(t, e.c.CoreV1().Pods("team-s").Create, p)
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}}, HostIP: "192.168.50.1",
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "busybox", ImageID: "sha256:0123"}}}
	if _, err := e.c.CoreV1().Pods("team-s").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := mustCreate(t, e.c.CoreV1().Nodes().Create, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.2.0/24", PodCIDRs: []string{"10.244.2.0/24"}}})
	n.Status = corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.50.2"}},
		Images: []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}}}
	if _, err := e.c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	store := newObjectStore()
	src, _ := run(t, Config{NodeName: "node-1", Client: e.c, Objects: store})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	key := k8sobj.ObjectKey(k8sobj.KindPod, "team-s", "fat")
	var got *k8sobj.Pod
	eventually(t, "the pod with its status", func() bool {
		o, ok := store.get(key)
		if ok && o.Pod.Status.PodIP != "" {
			got = o.Pod
		}
		return got != nil
	})
	// The rest (volumes, images, environment, probes, tolerations,
	// conditions, container statuses) has no field in a k8sobj.Pod.
	if got.Annotations[lastApplied] != "" {
		t.Errorf("kubectl's last-applied copy kept: %v", slices.Sorted(maps.Keys(got.Annotations)))
	}
	if _, ok := got.Annotations["example.com/unread"]; ok {
		t.Errorf("an annotation the agent does not read was kept: %v", slices.Sorted(maps.Keys(got.Annotations)))
	}
	gc := got.Spec.Containers[0]
	if got.Labels["app"] != "web" || got.Annotations["kubernetes.io/egress-bandwidth"] != "10M" || got.Spec.NodeName != "node-1" ||
		len(gc.Ports) != 2 || gc.Ports[0].Name != "http" || gc.Ports[1].HostPort != 30443 ||
		got.Status.PodIP != "10.244.1.7" || got.Status.HostIP != "192.168.50.1" || got.Status.Phase != corev1.PodRunning {
		t.Errorf("pod lost what the agent reads: %+v", got)
	}
	if gvk := got.GetObjectKind().GroupVersionKind(); gvk.Kind != "Pod" || gvk.GroupVersion().String() != "v1" {
		t.Errorf("pod kind %v, want v1 Pod", gvk)
	}
	cached, ok, err := src.cached(objKey{kind: k8sobj.KindPod, namespace: "team-s", name: "fat"})
	if err != nil || !ok || cached.(*k8sobj.Pod) != got {
		t.Errorf("the agent's pod is not the cache's own object (a second copy of every object)")
	}
	var node *corev1.Node
	eventually(t, "the node with its address", func() bool {
		o, ok, _ := src.nodes.GetStore().GetByKey("node-2")
		node, _ = o.(*corev1.Node)
		return ok && len(node.Status.Addresses) > 0
	})
	if len(node.Status.Images) > 0 || node.Spec.PodCIDR != "10.244.2.0/24" || node.Status.Addresses[0].Address != "192.168.50.2" {
		t.Errorf("node: images %v (want none), pod CIDR %s, addresses %v", node.Status.Images, node.Spec.PodCIDR, node.Status.Addresses)
	}
}

// TestInitialListAppliedOnce: the objects the informers list at start reach
// the agent once, in the kinds' full sets, not again one by one afterwards
// (at 30,000 Services that was 60,000 more applies and store writes, and a
// queue grown to hold them all).
func TestInitialListAppliedOnce(t *testing.T) {
	e := newEnv(t)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-o"}})
	for _, name := range []string{"a", "b", "c", "d"} {
		mustCreate(t, e.c.CoreV1().Services("team-o").Create, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}})
	}
	store := newObjectStore()
	src, _ := run(t, Config{NodeName: "node-1", Client: e.c, Objects: store})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	if !store.has(k8sobj.ObjectKey(k8sobj.KindService, "team-o", "d")) {
		t.Fatalf("the initial sync lacks Service team-o/d: %v", store.keys())
	}
	// A change after the start: applied on its own, after anything queued
	// before it (the queue is first in, first out).
	mustCreate(t, e.c.CoreV1().Services("team-o").Create, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}})
	eventually(t, "the later Service", func() bool { return store.has(k8sobj.ObjectKey(k8sobj.KindService, "team-o", "late")) })
	store.mu.Lock()
	var got []string
	for _, k := range store.upserts {
		if strings.Contains(k, "team-o") {
			got = append(got, k)
		}
	}
	store.mu.Unlock()
	if len(got) != 1 {
		t.Errorf("objects of team-o upserted one by one after the initial sync: %v, want only the later Service: the initial list was applied twice", got)
	}
}

// A pod is kept as the agent's own k8sobj.Pod: its containers without
// ports are not kept (the agent reads nothing else of a container), those
// with ports keep their name and ports, and the struct is a third of a
// corev1.Pod's 1,240 bytes.
func TestSlimPodKeepsContainersWithPorts(t *testing.T) {
	p := pod("team-s", "p", "node-1", nil) // one container with a named port
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "x"}}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "y"})
	o, err := slim(p)
	if err != nil {
		t.Fatal(err)
	}
	sp := o.(*k8sobj.Pod)
	if len(sp.Spec.InitContainers) != 0 || len(sp.Spec.Containers) != 1 || sp.Spec.Containers[0].Name != "c" || len(sp.Spec.Containers[0].Ports) != 1 {
		t.Errorf("slim pod: init %+v, containers %+v; want only c with its port", sp.Spec.InitContainers, sp.Spec.Containers)
	}
	var before, after runtime.MemStats
	pods := make([]any, 2000)
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range pods {
		if pods[i], err = slim(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(len(pods))
	t.Logf("a slim pod without ports: %d B", per)
	if per > 600 { // a k8sobj.Pod is 448 B; a corev1.Pod 1,280, an empty container kept adds ~500
		t.Errorf("a slim pod without ports holds %d B, want <= 600: a corev1.Pod or an empty container kept?", per)
	}
	runtime.KeepAlive(pods)
}

// A Service becomes the agent's k8sobj.Service: without its spec.selector
// (the endpointslice controller's input, not the agent's: a map per
// Service, as selectors are nearly always sets of their own) or the rest of
// what the agent does not read, with what it reads.
func TestSlimServiceDropsSelector(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-s", Labels: map[string]string{"app": "web"},
		UID: "u-1", Annotations: map[string]string{"team": "s", corev1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}
	o, err := slim(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*k8sobj.Service)
	if v1 := got.V1(); v1.Spec.Selector != nil || len(v1.Annotations) != 1 {
		t.Errorf("the selector or an unread annotation was kept: %v %v", v1.Spec.Selector, v1.Annotations)
	}
	if got.Labels["app"] != "web" || got.Spec.ClusterIP != "10.96.0.10" || len(got.Spec.Ports) != 1 || got.Spec.Ports[0].TargetPort.StrVal != "http" ||
		got.UID != "u-1" || got.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey] != "10.0.0.0/8" ||
		got.GetObjectKind().GroupVersionKind().Kind != "Service" {
		t.Errorf("the Service lost what the agent reads: %+v", got)
	}
}

// TestCachedSliceKeepsWhatTheAgentReads: through a real API server, a slice
// as the endpointslice controller writes it reaches the agent as the
// k8sobj.EndpointSlice of what the API server serves — its Service, headless
// mark, trigger time, address type, ports, and each endpoint's addresses,
// conditions, hints and pod; no label or annotation map — and the agent's
// object is the cache's own.
func TestCachedSliceKeepsWhatTheAgentReads(t *testing.T) {
	e := newEnv(t)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-s"}})
	trig := "2026-11-30T07:00:00.123456789Z"
	created := mustCreate(t, e.c.DiscoveryV1().EndpointSlices("team-s").Create, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "team-s",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app.kubernetes.io/name": "web", corev1.IsHeadlessService: ""},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trig, lastApplied: "{}"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)},
			NodeName:   ptr.To("node-1"), Zone: ptr.To("z1"), Hostname: ptr.To("web-0"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "team-s", Name: "web-0", UID: "pod-uid"},
			Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	})
	store := newObjectStore()
	src, _ := run(t, Config{NodeName: "node-1", Client: e.c, Objects: store})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	o, ok := store.get(k8sobj.ObjectKey(k8sobj.KindEndpointSlice, "team-s", "web-abc"))
	if !ok {
		t.Fatal("the slice did not reach the agent")
	}
	got, want := o.EndpointSlice, k8sobj.SlimEndpointSlice(created)
	want.CreationTimestamp = got.CreationTimestamp // a decoded time is local
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cached slice:\n got %+v\nwant %+v", got, want)
	}
	if got.ServiceName != "web" || !got.Headless || got.TriggerTime != trig || got.Endpoints[0].TargetRef.Name != "web-0" ||
		got.Endpoints[0].Conditions.Serving != k8sobj.ConditionTrue || got.Endpoints[0].Hints == nil || len(got.Ports) != 1 {
		t.Errorf("the slice lost what the agent reads: %+v", got)
	}
	if got.InvalidLabels != nil {
		t.Errorf("the slice keeps its labels: %v", got.InvalidLabels)
	}
	cached, ok, err := src.cached(objKey{kind: k8sobj.KindEndpointSlice, namespace: "team-s", name: "web-abc"})
	if err != nil || !ok || cached.(*k8sobj.EndpointSlice) != got {
		t.Errorf("the agent's slice is not the cache's own object (a second copy of every object)")
	}
}
