package agent

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// benchServiceObjects returns n ClusterIP services with 4 endpoints each.
func benchServiceObjects(n int) []k8sobj.Object {
	objs := make([]k8sobj.Object, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svc := k8sobj.SlimService(&corev1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench"},
			Spec: corev1.ServiceSpec{
				ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
				Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
			},
		})
		es := &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: "bench",
				Labels: map[string]string{k8sobj.ServiceNameLabel: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080)), Protocol: ptrTo(corev1.ProtocolTCP)}},
		}
		for j := range 4 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1)}})
		}
		objs = append(objs, k8sobj.Object{Kind: k8sobj.KindService, Service: svc},
			k8sobj.Object{Kind: k8sobj.KindEndpointSlice, EndpointSlice: k8sobj.SlimEndpointSlice(es)})
	}
	return objs
}

func ptrTo[T any](v T) *T { return &v }

// BenchmarkOneChangeAt10kServices: one EndpointSlice change through the
// agent (validate, store, translate, program a agenttest.MemoryDatapath) with 10,000
// services applied; the benchmark's "agent end to end" one-change figure
// without gRPC.
func BenchmarkOneChangeAt10kServices(b *testing.B) {
	a := newCtlAgent(b, b.TempDir(), agenttest.NewMemoryDatapath())
	objs := benchServiceObjects(10000)
	for i := 0; i < len(objs); i += 2000 {
		if err := a.UpsertObjects(objs[i:min(i+2000, len(objs))]); err != nil {
			b.Fatal(err)
		}
	}
	es := objs[2*1234+1].EndpointSlice.DeepCopy()
	b.ResetTimer()
	for i := range b.N {
		es = es.DeepCopy()
		es.Endpoints[0].Conditions.Ready = k8sobj.ConditionFalse
		if i%2 == 1 {
			es.Endpoints[0].Conditions.Ready = k8sobj.ConditionTrue
		}
		if err := a.UpsertObjects([]k8sobj.Object{{Kind: k8sobj.KindEndpointSlice, EndpointSlice: es}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProgram10kServices: 10,000 services + their EndpointSlices through
// the agent in 10 calls of 1,000 services (as the benchmark's lanekit row
// sends them), into a agenttest.MemoryDatapath.
func BenchmarkProgram10kServices(b *testing.B) {
	objs := benchServiceObjects(10000)
	for range b.N {
		b.StopTimer()
		a := newCtlAgent(b, b.TempDir(), agenttest.NewMemoryDatapath())
		b.StartTimer()
		for i := 0; i < len(objs); i += 2000 {
			if err := a.UpsertObjects(objs[i:min(i+2000, len(objs))]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchPolicyObjects returns n NetworkPolicies shaped like lab bench's
// --policies set (pkg/bench.PolicySet): each selects every pod of its
// namespace and allows one /32 ipBlock on one port.
func benchPolicyObjects(n int) []k8sobj.Object {
	tcp := corev1.ProtocolTCP
	objs := make([]k8sobj.Object, 0, n)
	for i := range n {
		port := intstr.FromInt32(int32(1000 + i))
		objs = append(objs, k8sobj.Object{Kind: k8sobj.KindNetworkPolicy, NetworkPolicy: &networkingv1.NetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("pol-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("10.200.%d.%d/32", i/250, 1+i%250)}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		}})
	}
	return objs
}

// BenchmarkOnePolicyChangeAt1000Policies: one NetworkPolicy added and
// deleted again (two commits) through the agent holding 1,000 policies, as
// a watch delivers changes one at a time; the agent compiles its whole set on
// each.
func BenchmarkOnePolicyChangeAt1000Policies(b *testing.B) {
	a := newCtlAgent(b, b.TempDir(), agenttest.NewMemoryDatapath())
	addLocal(b, a, 1, "10.244.1.2", "bench", "server", map[string]string{"app": "server"})
	objs := benchPolicyObjects(1001)
	if err := a.UpsertObjects(objs[:1000]); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := a.UpsertObjects(objs[1000:]); err != nil {
			b.Fatal(err)
		}
		if err := a.DeleteObject(k8sobj.KindNetworkPolicy, "bench", "pol-1000"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOnePolicyChangeAt10kServices: a NetworkPolicy added and deleted
// again (two policy compiles) beside 10,000 Services and their slices: the
// compile's input must not cost per object of the other kinds (it sorted
// every object's key: at 100,000 Services a pod relabel held the agent for
// seconds).
func BenchmarkOnePolicyChangeAt10kServices(b *testing.B) {
	a := newCtlAgent(b, b.TempDir(), agenttest.NewMemoryDatapath())
	addLocal(b, a, 1, "10.244.1.2", "bench", "server", map[string]string{"app": "server"})
	objs := benchServiceObjects(10000)
	for i := 0; i < len(objs); i += 2000 {
		if err := a.UpsertObjects(objs[i:min(i+2000, len(objs))]); err != nil {
			b.Fatal(err)
		}
	}
	pol := benchPolicyObjects(1)
	b.ResetTimer()
	for b.Loop() {
		if err := a.UpsertObjects(pol); err != nil {
			b.Fatal(err)
		}
		if err := a.DeleteObject(k8sobj.KindNetworkPolicy, "bench", "pol-0"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReplaceCopiesNoObjectSet: a kind's full set edits the object set in
// place, as an upsert does: replacing the (empty) set of NetworkPolicies
// beside 20,000 Services and slices allocates what the kind holds, not a
// copy of every object (the initial sync's peak held one per kind).
func TestReplaceCopiesNoObjectSet(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), agenttest.NewMemoryDatapath())
	objs := benchServiceObjects(10000)
	for i := 0; i < len(objs); i += 2000 {
		if err := a.UpsertObjects(objs[i:min(i+2000, len(objs))]); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := a.ReplaceObjects(k8sobj.KindNetworkPolicy, nil); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a replace beside 20,000 objects allocated %d KB", alloc>>10)
	if alloc > 512<<10 { // a copy of the 20,000-object set is ~2 MB
		t.Errorf("replacing an empty kind beside 20,000 objects allocated %d KB, want <= 512 KB: the object set copied?", alloc>>10)
	}
	if got := len(a.Objects("")); got != 20000 {
		t.Errorf("%d objects after the replace, want 20000", got)
	}
}

// TestLargeFullSetStoredWhole: a full set past stageMin goes to the store
// through its staged replace and survives a restart whole, and the next
// full set's removals are gone after the next restart too.
func TestLargeFullSetStoredWhole(t *testing.T) {
	dir := t.TempDir()
	a := newCtlAgent(t, dir, agenttest.NewMemoryDatapath())
	var svcs []k8sobj.Object
	for _, o := range benchServiceObjects(stageMin + 100) {
		if o.Service != nil {
			svcs = append(svcs, o)
		}
	}
	if _, err := a.ReplaceObjects(k8sobj.KindService, svcs); err != nil {
		t.Fatal(err)
	}
	if err := a.st.Close(); err != nil {
		t.Fatal(err)
	}
	a = newCtlAgent(t, dir, agenttest.NewMemoryDatapath())
	if got := len(a.Objects(k8sobj.KindService)); got != len(svcs) {
		t.Fatalf("%d Services after a restart, want %d", got, len(svcs))
	}
	keep := svcs[:stageMin+10]
	if _, err := a.ReplaceObjects(k8sobj.KindService, keep); err != nil {
		t.Fatal(err)
	}
	if err := a.st.Close(); err != nil {
		t.Fatal(err)
	}
	a = newCtlAgent(t, dir, agenttest.NewMemoryDatapath())
	got := a.Objects(k8sobj.KindService)
	if len(got) != len(keep) || a.hasObject(k8sobj.KindService, "bench", svcs[len(svcs)-1].Name()) {
		t.Errorf("%d Services after the smaller set and a restart, want %d", len(got), len(keep))
	}
}
