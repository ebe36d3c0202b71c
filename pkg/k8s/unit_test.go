package k8s

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

func TestDesiredRoutes(t *testing.T) {
	node := func(name string, cidrs []string, addrs ...corev1.NodeAddress) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
		if len(cidrs) > 0 {
			n.Spec.PodCIDR = cidrs[0]
		}
		n.Status.Addresses = addrs
		return n
	}
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	external := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
	}
	nodes := []*corev1.Node{
		node("self", []string{"10.244.1.0/24"}, internal("10.0.0.1")),
		node("dual", []string{"fd00::/64", "10.244.3.0/24"}, internal("fd00::3"), internal("10.0.0.3")),
		node("b", []string{"10.244.2.0/24"}, external("1.2.3.4"), internal("10.0.0.2")),
		node("nocidr", nil, internal("10.0.0.4")),
		node("noip", []string{"10.244.5.0/24"}, external("1.2.3.5")),
		node("overlap", []string{"10.244.1.0/25"}, internal("10.0.0.6")),
		node("bad", []string{"nonsense"}, internal("10.0.0.7")),
	}
	got := desiredRoutes("self", netip.MustParsePrefix("10.244.1.0/24"), nodes)
	want := []Route{
		{Node: "b", Dst: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("10.0.0.2")},
		{Node: "dual", Dst: netip.MustParsePrefix("10.244.3.0/24"), Via: netip.MustParseAddr("10.0.0.3")},
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes %v, want %v", got, want)
	}
	// A dual-stack self routes the other nodes' IPv6 pod CIDRs too (an
	// IPv4-only self, above, does not: it has no IPv6 underlay).
	nodes[0] = node("self", []string{"10.244.1.0/24", "fd00:1::/64"}, internal("10.0.0.1"), internal("fd00::1"))
	nodes = append(nodes, node("v6noip", []string{"10.244.8.0/24", "fd00:8::/64"}, internal("10.0.0.8")))
	got = desiredRoutes("self", netip.MustParsePrefix("10.244.1.0/24"), nodes)
	want = append(want, Route{Node: "v6noip", Dst: netip.MustParsePrefix("10.244.8.0/24"), Via: netip.MustParseAddr("10.0.0.8")},
		Route{Node: "dual", Dst: netip.MustParsePrefix("fd00::/64"), Via: netip.MustParseAddr("fd00::3")})
	if !slices.Equal(got, want) {
		t.Errorf("dual-stack routes %v, want %v", got, want)
	}
}

func TestToObjectValidates(t *testing.T) {
	ok := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
	o, err := toObject(k8sobj.KindPod, ok)
	if err != nil || o.Pod == nil || o.Pod.Name != "p" || o.Pod.GetObjectKind().GroupVersionKind().Kind != "Pod" {
		t.Fatalf("toObject: %+v, %v (want the agent's slim pod)", o, err)
	}
	if sp := slimPod(ok); func() *k8sobj.Pod { o, _ := toObject(k8sobj.KindPod, sp); return o.Pod }() != sp {
		t.Error("toObject copied the transform's pod (a second copy of every pod)")
	}
	bad := ok.DeepCopy()
	bad.Status.PodIP = "not-an-ip"
	if _, err := toObject(k8sobj.KindPod, bad); err == nil || !strings.Contains(err.Error(), "status.podIP") {
		t.Errorf("invalid pod: %v, want an error naming status.podIP", err)
	}
	if _, err := toObject(k8sobj.KindService, ok); err == nil {
		t.Error("a Pod accepted as a Service")
	}
}

func TestVMName(t *testing.T) {
	if got := VMName("default", "vm1"); got != "default.vm1" {
		t.Errorf("VMName = %q", got)
	}
	long := VMName(strings.Repeat("n", 40), strings.Repeat("v", 40))
	if err := endpoint.ValidateVMName(long); err != nil || long == VMName(strings.Repeat("n", 40), strings.Repeat("v", 41)) {
		t.Errorf("long VMName %q: %v (want valid and distinct)", long, err)
	}
}

// TestInformersIndexOnlyWhatIsLookedUp: the caches keep the indexes the
// source looks objects up by (pods by address, slices by pod), not the
// factory's namespace index, which held an entry per object and is read by
// nothing here.
func TestInformersIndexOnlyWhatIsLookedUp(t *testing.T) {
	s, err := New(Config{NodeName: "n", Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	infs := map[string]cache.SharedIndexInformer{"Node": s.nodes}
	for k, inf := range s.kinds {
		infs[string(k)] = inf
	}
	for k, inf := range infs {
		if _, ok := inf.GetIndexer().GetIndexers()[cache.NamespaceIndex]; ok {
			t.Errorf("%s informer keeps a namespace index", k)
		}
	}
	if _, ok := s.pods.GetIndexer().GetIndexers()[podAddrIndex]; !ok {
		t.Error("pods are not indexed by address")
	}
	if _, ok := s.kinds[k8sobj.KindEndpointSlice].GetIndexer().GetIndexers()[sliceByPodIndex]; !ok {
		t.Error("slices are not indexed by pod")
	}
}
