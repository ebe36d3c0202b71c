package lab

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/service"
)

// Quantiles from the difference of two cumulative histogram scrapes are
// the bucket bounds the observations between them fall under.
func TestHistQuantiles(t *testing.T) {
	inf := math.Inf(1)
	before := map[float64]uint64{0.25: 10, 0.5: 10, 1: 10, inf: 10}
	after := map[float64]uint64{0.25: 108, 0.5: 109, 1: 110, inf: 110} // 98 ≤ 0.25 s, 1 ≤ 0.5 s, 1 ≤ 1 s
	p50, p99, mx, n := histQuantiles(before, after)
	if n != 100 || p50 != 0.25 || p99 != 0.5 || mx != 1 {
		t.Errorf("got p50 %v p99 %v max %v n %d; want 0.25 0.5 1 100", p50, p99, mx, n)
	}
	if _, _, _, n := histQuantiles(after, after); n != 0 {
		t.Errorf("no observations: n %d", n)
	}
	ds := []time.Duration{5, 1, 3, 2, 4}
	if a, b, c := durQuantiles(ds); a != 3 || b != 5 || c != 5 {
		t.Errorf("durQuantiles: %v %v %v", a, b, c)
	}
}

// A Service's slice is what the endpointslice controller writes: its
// Service label, the trigger time, ready endpoints on the fake nodes' pod
// CIDRs; a churn generation changes only the last endpoint.
func TestScaleSlice(t *testing.T) {
	cfg := DefaultScaleConfig()
	now := time.Now()
	s0, s1 := scaleSlice(cfg, 7, 0, now), scaleSlice(cfg, 7, 1, now)
	if s0.Labels[discoveryv1.LabelServiceName] != "scale-7" || len(s0.Endpoints) != cfg.Endpoints {
		t.Fatalf("slice %+v", s0.ObjectMeta)
	}
	for e := range s0.Endpoints {
		same := s0.Endpoints[e].Addresses[0] == s1.Endpoints[e].Addresses[0]
		if same != (e < cfg.Endpoints-1) {
			t.Errorf("endpoint %d: %s -> %s", e, s0.Endpoints[e].Addresses[0], s1.Endpoints[e].Addresses[0])
		}
	}
	if got, _ := time.Parse(time.RFC3339Nano, s0.Annotations["endpoints.kubernetes.io/last-change-trigger-time"]); !got.Equal(now) {
		t.Errorf("trigger time %v, want %v", got, now)
	}
	if ScaleNodeCIDR(300).String() != "10.129.44.0/24" {
		t.Errorf("node 300's CIDR %s", ScaleNodeCIDR(300))
	}
}

// The API server's request counters are summed by verb and resource and
// compared between two scrapes; the open watches are the WATCH gauge.
func TestAPILoad(t *testing.T) {
	page := func(lists, watches float64, open int) []byte {
		return fmt.Appendf(nil, `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",resource="services",scope="cluster",verb="LIST",version="v1"} %g
apiserver_request_total{code="200",component="apiserver",resource="services",scope="namespace",verb="LIST",version="v1"} 1
apiserver_request_total{code="0",component="apiserver",resource="endpointslices",scope="cluster",verb="WATCH",version="v1"} %g
apiserver_request_total{code="201",component="apiserver",resource="pods",scope="namespace",verb="POST",version="v1"} 500
# TYPE apiserver_longrunning_requests gauge
apiserver_longrunning_requests{component="apiserver",resource="services",scope="cluster",verb="WATCH",version="v1"} %d
apiserver_longrunning_requests{component="apiserver",resource="pods",scope="cluster",verb="WATCH",version="v1"} 2
# TYPE apiserver_watch_list_duration_seconds histogram
apiserver_watch_list_duration_seconds_bucket{group="",resource="pods",scope="cluster",version="v1",le="0.05"} %d
apiserver_watch_list_duration_seconds_bucket{group="",resource="pods",scope="cluster",version="v1",le="+Inf"} %d
apiserver_watch_list_duration_seconds_sum{group="",resource="pods",scope="cluster",version="v1"} 0.01
apiserver_watch_list_duration_seconds_count{group="",resource="pods",scope="cluster",version="v1"} %d
`, lists, watches, open, open, open, open)
	}
	a, err := parseAPILoad(page(3, 10, 3))
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseAPILoad(page(5, 10, 2))
	if err != nil {
		t.Fatal(err)
	}
	if a.openWatches != 5 {
		t.Errorf("open watches %v, want 5", a.openWatches)
	}
	if got := a.callsTo(b, "LIST"); !maps.Equal(got, map[string]int{"services": 2}) {
		t.Errorf("LIST calls %v, want services 2", got)
	}
	if got := a.callsTo(b, "WATCHLIST"); len(got) != 0 {
		t.Errorf("streamed lists %v, want none (the count went down)", got)
	}
	if got := b.callsTo(a, "WATCHLIST"); !maps.Equal(got, map[string]int{"pods": 1}) {
		t.Errorf("streamed lists %v, want pods 1", got)
	}
	if got := formatCalls(a.callsTo(b, "WATCH")); got != "none" {
		t.Errorf("WATCH calls %q, want none", got)
	}
	if got := formatCalls(map[string]int{"pods": 1, "services": 2}); got != "3 (pods 1, services 2)" {
		t.Errorf("formatCalls: %q", got)
	}
}

// --service-cidr: IPv4, /12 to /16, holding the lab's fixed range; lab
// scale's room is the API server's range (network and broadcast excluded).
func TestServiceCIDRFlag(t *testing.T) {
	for cidr, ok := range map[string]bool{"": true, "10.96.0.0/16": true, "10.96.0.0/14": true, "10.96.0.0/12": true,
		"10.96.0.0/11": false, "10.97.0.0/16": false, "10.96.0.0/17": false, "10.96.1.0/14": false, "fd00::/108": false, "x": false} {
		err := Config{K8s: true, ServiceCIDR: cidr}.checkServiceCIDR()
		if (err == nil) != ok {
			t.Errorf("--service-cidr %q: err %v, want ok %t", cidr, err, ok)
		}
	}
	if err := (Config{ServiceCIDR: "10.96.0.0/14"}).checkServiceCIDR(); err == nil {
		t.Error("--service-cidr without --k8s accepted")
	}
	if got := serviceCIDRs(IPFamilyDual, "10.96.0.0/14"); got != "10.96.0.0/14,"+ServiceCIDR6 {
		t.Errorf("dual: %q", got)
	}
	if got := serviceCIDRs(IPFamilyIPv4, ""); got != ServiceCIDR {
		t.Errorf("default: %q", got)
	}
	for cidrs, want := range map[string]int{"10.96.0.0/16": 65534, "10.96.0.0/14,fd00:96::/108": 262142} {
		if got, err := serviceCapacity(cidrs); err != nil || got != want {
			t.Errorf("capacity of %s: %d, %v; want %d", cidrs, got, err, want)
		}
	}
}

// FillScale with a Store hands it the objects the client path creates
// (and whose status it sets): the same Nodes, Services, slices, pods and
// policies, only written at once.
func TestFillScaleStoreSameObjects(t *testing.T) {
	cfg := DefaultScaleConfig()
	cfg.Nodes, cfg.Services, cfg.Pods, cfg.Identities, cfg.Policies = 3, 7, 11, 4, 2
	ctx := context.Background()
	c := fake.NewClientset()
	if err := FillScale(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	created := map[string]string{}
	add := func(into map[string]string, o runtime.Object) {
		m := o.(metav1.Object)
		key := fmt.Sprintf("%T %s/%s", o, m.GetNamespace(), m.GetName())
		o = o.DeepCopyObject()
		switch v := o.(type) {
		case *corev1.Node: // times of the run
			for i := range v.Status.Conditions {
				v.Status.Conditions[i].LastHeartbeatTime, v.Status.Conditions[i].LastTransitionTime = metav1.Time{}, metav1.Time{}
			}
		case *discoveryv1.EndpointSlice:
			delete(v.Annotations, corev1.EndpointsLastChangeTriggerTime)
		}
		o.(metav1.Object).SetResourceVersion("")
		o.(metav1.Object).SetManagedFields(nil) // the fake client's
		o.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		into[key] = string(b)
	}
	nodes, _ := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	for i := range nodes.Items {
		add(created, &nodes.Items[i])
	}
	svcs, _ := c.CoreV1().Services(ScaleNamespace).List(ctx, metav1.ListOptions{})
	for i := range svcs.Items {
		add(created, &svcs.Items[i])
	}
	slices, _ := c.DiscoveryV1().EndpointSlices(ScaleNamespace).List(ctx, metav1.ListOptions{})
	for i := range slices.Items {
		add(created, &slices.Items[i])
	}
	pods, _ := c.CoreV1().Pods(ScaleNamespace).List(ctx, metav1.ListOptions{})
	for i := range pods.Items {
		add(created, &pods.Items[i])
	}
	pols, _ := c.NetworkingV1().NetworkPolicies(ScaleNamespace).List(ctx, metav1.ListOptions{})
	for i := range pols.Items {
		add(created, &pols.Items[i])
	}
	if want := cfg.Nodes + 2*cfg.Services + cfg.Pods + cfg.Policies; len(created) != want {
		t.Fatalf("the client path created %d objects, want %d", len(created), want)
	}

	stored := map[string]string{}
	cfg.Store = func(_ context.Context, objs []runtime.Object) error {
		for _, o := range objs {
			add(stored, o)
		}
		return nil
	}
	if err := FillScale(ctx, nil, cfg); err != nil {
		t.Fatal(err)
	}
	for k, v := range created {
		if stored[k] != v {
			t.Errorf("%s:\n created %s\n stored  %s", k, v, stored[k])
		}
	}
	for k := range stored {
		if _, ok := created[k]; !ok {
			t.Errorf("stored %s, not created by the client path", k)
		}
	}
}

// The staged fill (--first-packet-at) creates every Service once, through
// the client and through a bulk store alike.
func TestCreateServicesInStages(t *testing.T) {
	cfg := DefaultScaleConfig()
	cfg.Nodes, cfg.Services = 3, 7
	ctx := context.Background()
	c := fake.NewClientset()
	stored := map[string]int{}
	viaStore := cfg
	viaStore.Store = func(_ context.Context, objs []runtime.Object) error {
		for _, o := range objs {
			stored[fmt.Sprintf("%T %s", o, o.(metav1.Object).GetName())]++
		}
		return nil
	}
	for _, st := range [][2]int{{0, 2}, {2, 3}, {3, 7}} {
		if err := createServices(ctx, c, cfg, st[0], st[1]); err != nil {
			t.Fatal(err)
		}
		if err := createServices(ctx, nil, viaStore, st[0], st[1]); err != nil {
			t.Fatal(err)
		}
	}
	svcs, _ := c.CoreV1().Services(ScaleNamespace).List(ctx, metav1.ListOptions{})
	slices, _ := c.DiscoveryV1().EndpointSlices(ScaleNamespace).List(ctx, metav1.ListOptions{})
	if len(svcs.Items) != 7 || len(slices.Items) != 7 {
		t.Fatalf("client: %d Services and %d slices, want 7 each", len(svcs.Items), len(slices.Items))
	}
	for i := range 7 {
		for _, key := range []string{fmt.Sprintf("*v1.Service scale-%d", i), fmt.Sprintf("*v1.EndpointSlice scale-%d-x", i)} {
			if stored[key] != 1 {
				t.Errorf("store: %s written %d times, want once", key, stored[key])
			}
		}
	}
	if len(stored) != 14 {
		t.Errorf("store: %d objects, want 14: %v", len(stored), stored)
	}
}

func TestFirstPacketAtFlag(t *testing.T) {
	for _, tc := range []struct {
		at   []int
		ok   bool
		what string
	}{
		{nil, true, "none"},
		{[]int{100, 10000, 30000}, true, "ascending, the last the whole set"},
		{[]int{100, 10000}, true, "below the whole set"},
		{[]int{0}, false, "zero"},
		{[]int{100, 100}, false, "repeated"},
		{[]int{10000, 100}, false, "descending"},
		{[]int{30001}, false, "more than --services"},
	} {
		cfg := DefaultScaleConfig()
		cfg.Services, cfg.FirstPacketAt = 30000, tc.at
		if err := cfg.validate(); (err == nil) != tc.ok {
			t.Errorf("%s %v: validate = %v", tc.what, tc.at, err)
		}
	}
	cfg := DefaultScaleConfig()
	cfg.FirstPacketAt, cfg.FirstPacketRepeat = []int{10}, 0
	if cfg.validate() == nil {
		t.Error("--first-packet-repeat 0 accepted")
	}
}

func TestFirstPacketDescribe(t *testing.T) {
	base := ScaleFirstPacket{Services: 100, ConnectP50Us: 200, ConnectP99Us: 400, CPS: 1000, Runs: make([]bench.CPSResult, 3)}
	at := ScaleFirstPacket{Services: 100000, ConnectP50Us: 220, ConnectP99Us: 500, CPS: 900, Runs: make([]bench.CPSResult, 3), Load1: 1.5}
	want := "connect p50 220 µs, p99 500 µs, 900 conn/s (one loop; medians of 3 runs; load 1.5); 1.10 × the p50 and 0.90 × the conn/s at 100"
	if got := at.describe(base); got != want {
		t.Errorf("describe =\n %s\nwant\n %s", got, want)
	}
	if got := base.describe(base); strings.Contains(got, "×") {
		t.Errorf("the first count compared with itself: %s", got)
	}
}

// The churn probe finds a backend wherever it sits in a map of more
// entries than one batch holds, and says so when it is absent.
func TestHoldsBackend(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: uint32(binary.Size(service.BackendValue{})), MaxEntries: 3 * backendBatch})
	if err != nil {
		t.Skipf("no BPF hash map: %v", err)
	}
	defer m.Close()
	n := 2*backendBatch + 100
	for id := range n {
		v := service.BackendValue{Addr: [4]byte{10, byte(id >> 16), byte(id >> 8), byte(id)}, Port: 8080, Proto: 6}
		if err := m.Put(uint32(id), v); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []int{0, backendBatch, n - 1} {
		addr := [4]byte{10, byte(id >> 16), byte(id >> 8), byte(id)}
		if ok, err := holdsBackend(m, addr, 8080); !ok || err != nil {
			t.Errorf("backend %d (%v): found %v, %v", id, addr, ok, err)
		}
		if ok, err := holdsBackend(m, addr, 8081); ok || err != nil {
			t.Errorf("backend %d on another port: found %v, %v", id, ok, err)
		}
	}
	if ok, err := holdsBackend(m, [4]byte{10, 9, 9, 9}, 8080); ok || err != nil {
		t.Errorf("absent backend: found %v, %v", ok, err)
	}
}

// Probe ports stay below the ephemeral range and vary between runs.
func TestScaleProbePort(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := scaleProbePort()
		if p < scaleProbePortBase || p >= scaleProbePortBase+scaleProbePortSpan || p >= 32768 {
			t.Fatalf("probe port %d outside %d+%d", p, scaleProbePortBase, scaleProbePortSpan)
		}
		seen[p] = true
	}
	if len(seen) < 100 {
		t.Errorf("200 runs drew %d distinct ports", len(seen))
	}
}
