package k8s

import (
	"context"
	"net/netip"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

type env struct {
	srv *k8stest.Server
	c   kubernetes.Interface
	dc  dynamic.Interface
}

func newEnv(t *testing.T) *env {
	srv := k8stest.StartT(t)
	cfg := srv.RESTConfig()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, c: c, dc: dc}
}

// run starts a source until the test ends (or the returned stop).
func run(t *testing.T, cfg Config) (*Source, func()) {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = testLog()
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { stopNow(t, cancel, done) }) }
	t.Cleanup(stop)
	return s, stop
}

func stopNow(t *testing.T, cancel func(), done chan error) {
	{
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("source did not stop; goroutines:\n%s", b.String())
		}
	}
}

func mustCreate[T any](t *testing.T, create func(context.Context, T, metav1.CreateOptions) (T, error), obj T) T {
	t.Helper()
	out, err := create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func pod(ns, name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "busybox",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
		}}},
	}
}

func TestObjectsReachTheAgent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Before the source starts: only the initial sync (ReplaceObjects)
	// can deliver these, and the stale object must go.
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}})
	mustCreate(t, e.c.CoreV1().Pods("team-a").Create, pod("team-a", "web-1", "node-1", map[string]string{"app": "web"}))
	store := newObjectStore()
	stale := k8sobj.Object{Kind: k8sobj.KindService, Service: &k8sobj.Service{Name: "gone", Namespace: "team-a",
		Spec: k8sobj.ServiceSpec{ClusterIP: "10.96.0.99", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}}
	if err := store.UpsertObjects([]k8sobj.Object{stale}); err != nil {
		t.Fatal(err)
	}

	src, _ := run(t, Config{NodeName: "node-1", Client: e.c, Objects: store})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	for _, k := range []string{"Namespace//team-a", "Pod/team-a/web-1"} {
		if !store.has(k) {
			t.Errorf("after the initial sync the agent lacks %s; has %v", k, store.keys())
		}
	}
	if store.has(stale.Key()) {
		t.Errorf("%s was deleted while the agent was away but survives the initial sync", stale.Key())
	}
	for _, kind := range k8sobj.Kinds {
		if store.replaces[kind] != 1 {
			t.Errorf("%s: %d ReplaceObjects, want 1", kind, store.replaces[kind])
		}
	}

	// Live changes: each kind arrives and leaves.
	svc := mustCreate(t, e.c.CoreV1().Services("team-a").Create, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}},
	})
	mustCreate(t, e.c.DiscoveryV1().EndpointSlices("team-a").Create, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-abc", Namespace: "team-a", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	})
	mustCreate(t, e.c.NetworkingV1().NetworkPolicies("team-a").Create, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny", Namespace: "team-a"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	})
	for _, k := range []string{"Service/team-a/web", "EndpointSlice/team-a/web-abc", "NetworkPolicy/team-a/deny"} {
		eventually(t, "agent gets "+k, func() bool { return store.has(k) })
	}
	if o, _ := store.get("Service/team-a/web"); o.Service.Spec.ClusterIP != svc.Spec.ClusterIP || o.Service.V1().APIVersion != "v1" {
		t.Errorf("service in the agent: clusterIP %q apiVersion %q, want %q v1", o.Service.Spec.ClusterIP, o.Service.V1().APIVersion, svc.Spec.ClusterIP)
	}
	// An update reaches it too (pod status: the pod IP gives its identity).
	p, err := e.c.CoreV1().Pods("team-a").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.PodIP, p.Status.PodIPs = "10.244.1.5", []corev1.PodIP{{IP: "10.244.1.5"}}
	if _, err := e.c.CoreV1().Pods("team-a").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod IP reaches the agent", func() bool {
		o, ok := store.get("Pod/team-a/web-1")
		return ok && o.Pod.Status.PodIP == "10.244.1.5"
	})
	if err := e.c.NetworkingV1().NetworkPolicies("team-a").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.CoreV1().Services("team-a").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deletes reach the agent", func() bool {
		return !store.has("NetworkPolicy/team-a/deny") && !store.has("Service/team-a/web")
	})
}

func TestSinkFailuresAreRetried(t *testing.T) {
	e := newEnv(t)
	store := newObjectStore()
	store.fail = errTest
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: store})
	time.Sleep(500 * time.Millisecond)
	if err := src.Synced(); err == nil {
		t.Fatal("synced although the agent refused the initial sync")
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	eventually(t, "sync after the agent recovers", func() bool { return src.Synced() == nil })

	store.mu.Lock()
	store.fail = errTest
	store.mu.Unlock()
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}})
	time.Sleep(300 * time.Millisecond)
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	eventually(t, "a failed upsert is retried", func() bool { return store.has("Namespace//later") })
}

// Config.OnSynced (the agent returns the initial sync's garbage to the OS
// there) runs once, when the agent has every kind's full set: not while the
// initial sync fails, not again for the changes that follow.
func TestSyncedRunsOnceAfterTheFullSets(t *testing.T) {
	e := newEnv(t)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	store := newObjectStore()
	store.fail = errTest
	var mu sync.Mutex
	calls, fullSets := 0, 0
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: store, OnSynced: func() {
		store.mu.Lock()
		defer store.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		calls++
		fullSets = 0
		for _, kind := range k8sobj.Kinds {
			if store.replaces[kind] > 0 {
				fullSets++
			}
		}
	}})
	time.Sleep(500 * time.Millisecond)
	count := func() int { mu.Lock(); defer mu.Unlock(); return calls }
	if n := count(); n != 0 {
		t.Fatalf("OnSynced ran %d times while the initial sync fails", n)
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	eventually(t, "sync", func() bool { return src.Synced() == nil })
	eventually(t, "OnSynced runs", func() bool { return count() > 0 })
	mu.Lock()
	if fullSets != len(k8sobj.Kinds) {
		t.Errorf("OnSynced ran when the agent had %d of %d kinds' full sets", fullSets, len(k8sobj.Kinds))
	}
	mu.Unlock()

	for _, name := range []string{"b", "c"} {
		mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		mustCreate(t, e.c.CoreV1().Pods("a").Create, pod("a", "p-"+name, "", nil))
	}
	eventually(t, "changes reach the agent", func() bool { return store.has("Namespace//c") && store.has("Pod/a/p-c") })
	if n := count(); n != 1 {
		t.Errorf("OnSynced ran %d times, want once", n)
	}
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errTest = testErr("agent says no")

// The API server dies mid-run: the agent keeps everything (nothing is
// deleted because a list failed), readiness stays, and after a restart the
// watch resumes. Changes made while the agent's source is down converge
// through the next initial sync.
func TestAPIServerRestartConverges(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}})
	store := newObjectStore()
	src, stop := run(t, Config{NodeName: "n", Client: e.c, Objects: store})
	eventually(t, "sync", func() bool { return src.Synced() == nil && store.has("Namespace//b") })

	e.srv.KillAPIServer()
	time.Sleep(2 * time.Second) // the watches fail and retry meanwhile
	if !store.has("Namespace//a") || !store.has("Namespace//b") {
		t.Fatalf("objects lost while the API server is down: %v", store.keys())
	}
	if err := src.Synced(); err != nil {
		t.Errorf("readiness lost with the API server: %v", err)
	}
	if err := e.srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c"}})
	eventually(t, "watch resumes after the restart", func() bool { return store.has("Namespace//c") })

	// The agent's source is down while a pod is deleted (and one
	// created): a fresh source's initial sync converges.
	mustCreate(t, e.c.CoreV1().Pods("a").Create, pod("a", "old", "", nil))
	eventually(t, "pod seen", func() bool { return store.has("Pod/a/old") })
	stop()
	if err := e.c.CoreV1().Pods("a").Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, e.c.CoreV1().Pods("a").Create, pod("a", "new", "", nil))
	src2, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: store})
	eventually(t, "second source sync", func() bool { return src2.Synced() == nil })
	if store.has("Pod/a/old") || !store.has("Pod/a/new") {
		t.Errorf("after resync the agent has %v, want Pod/a/new and not Pod/a/old", store.keys())
	}
}

func TestNodeRoutes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	node := func(name, cidr, ip string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
		if cidr != "" {
			n.Spec.PodCIDRs = []string{cidr}
		}
		if ip != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
		}
		return n
	}
	createNode := func(n *corev1.Node) {
		t.Helper()
		st := n.Status
		out := mustCreate(t, e.c.CoreV1().Nodes().Create, n)
		out.Status = st
		if _, err := e.c.CoreV1().Nodes().UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createNode(node("n1", "10.244.1.0/24", "10.77.0.1"))
	createNode(node("n2", "10.244.2.0/24", "10.77.0.2"))
	createNode(node("n3", "", "10.77.0.3")) // no CIDR yet
	rs := &routeStore{}
	run(t, Config{NodeName: "n1", Client: e.c, Routes: rs})
	want := []Route{{Node: "n2", Dst: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("10.77.0.2")}}
	eventually(t, "route to n2", func() bool { return slices.Equal(rs.get(), want) })

	n3, err := e.c.CoreV1().Nodes().Get(ctx, "n3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n3.Spec.PodCIDR, n3.Spec.PodCIDRs = "10.244.3.0/24", []string{"10.244.3.0/24"}
	if _, err := e.c.CoreV1().Nodes().Update(ctx, n3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = append(want, Route{Node: "n3", Dst: netip.MustParsePrefix("10.244.3.0/24"), Via: netip.MustParseAddr("10.77.0.3")})
	eventually(t, "route to n3 once it has a CIDR", func() bool { return slices.Equal(rs.get(), want) })
	if err := e.c.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "route to n2 gone with the node", func() bool { return slices.Equal(rs.get(), want[1:]) })

	got, err := WaitPodCIDR(ctx, e.c, "n1", testLog())
	if err != nil || got != "10.244.1.0/24" {
		t.Errorf("WaitPodCIDR(n1) = %q, %v", got, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if _, err := WaitPodCIDR(wctx, e.c, "nope", testLog()); err == nil {
		t.Error("WaitPodCIDR of an unregistered node returned")
	}
}

// TestVMIResolver: a VM attachment's ADD learns its VMI from the launcher
// pod (KubeVirt's domain annotation and created-by label): queues from the
// vCPUs with multiqueue, the lanekit interface's MAC, the VMI's labels. A
// pod that is not a launcher is no VMI; a launcher whose VMI cannot be read
// (not yet there, or recreated) is an error, never a guess.
func TestVMIResolver(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	vms := &vmStore{}
	run(t, Config{NodeName: "node-1", Client: e.c, Dynamic: e.dc, VMs: vms})
	if err := k8stest.InstallKubeVirtCRD(ctx, e.srv.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": "default", "labels": map[string]any{"app": "db"}},
		"spec": map[string]any{"domain": map[string]any{
			"cpu": map[string]any{"cores": int64(4)},
			"devices": map[string]any{
				"networkInterfaceMultiqueue": true,
				"interfaces": []any{
					map[string]any{"name": "default", "masquerade": map[string]any{}},
					map[string]any{"name": "fast", "binding": map[string]any{"name": "lanekit"}, "macAddress": "02:00:00:aa:00:01"},
				}},
		}},
	}}
	created, err := e.dc.Resource(VMIResource).Namespace("default").Create(ctx, vmi, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lp := pod("default", "virt-launcher-vm1-abcde", "node-1", map[string]string{"kubevirt.io": "virt-launcher", labelCreatedBy: string(created.GetUID())})
	lp.Annotations = map[string]string{annotationDomain: "vm1"}
	launcher := mustCreate(t, e.c.CoreV1().Pods("default").Create, lp)
	other := mustCreate(t, e.c.CoreV1().Pods("default").Create, pod("default", "web", "node-1", map[string]string{"app": "web"}))

	got, ok, err := vms.resolve("default", launcher.Name, string(launcher.UID))
	if err != nil || !ok {
		t.Fatalf("resolve launcher: %v %v", ok, err)
	}
	if got.Namespace != "default" || got.Name != "vm1" || got.Queues != 4 || got.MAC != "02:00:00:aa:00:01" || got.Labels["app"] != "db" {
		t.Errorf("resolved %+v: want default/vm1, 4 queues (multiqueue, 4 vCPUs), the interface MAC and the VMI's labels", got)
	}
	if _, ok, err := vms.resolve("default", other.Name, string(other.UID)); ok || err != nil {
		t.Errorf("resolve a pod that is not a launcher: ok %v err %v, want neither", ok, err)
	}
	if _, _, err := vms.resolve("default", launcher.Name, "0000-other-uid"); err == nil {
		t.Error("resolve with another pod UID than the pod's: no error")
	}
	// The VMI recreated under the same name: not the launcher's VMI.
	if err := e.dc.Resource(VMIResource).Namespace("default").Delete(ctx, "vm1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := vms.resolve("default", launcher.Name, string(launcher.UID)); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("resolve with the VMI gone: %v, want not found", err)
	}
	vmi.SetResourceVersion("")
	if _, err := e.dc.Resource(VMIResource).Namespace("default").Create(ctx, vmi, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := vms.resolve("default", launcher.Name, string(launcher.UID)); err == nil || !strings.Contains(err.Error(), "recreated") {
		t.Errorf("resolve with a recreated VMI: %v, want the UID mismatch", err)
	}
}
