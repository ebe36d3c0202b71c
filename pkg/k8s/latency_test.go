package k8s

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/metrics"
)

type latencies struct {
	mu      sync.Mutex
	network map[string][]time.Duration
	policy  map[string][]time.Duration
}

func (l *latencies) ObserveNetworkProgramming(f string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.network[f] = append(l.network[f], d)
}

func (l *latencies) ObservePolicyProgramming(tr string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.policy[tr] = append(l.policy[tr], d)
}

// The trigger time of each change, as kube-proxy takes it: the
// annotation; a new slice without it: its Service's creation; nothing for
// changes from before the tracker started, an unparsable annotation, or a
// pod update the policy does not read; a deleted object's pending changes
// are not observed; a kind's full set observes all of them.
func TestLatencyTrigger(t *testing.T) {
	start := time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC)
	obs := &latencies{network: map[string][]time.Duration{}, policy: map[string][]time.Duration{}}
	lt := newLatencyTracker(obs, start)
	services := cache.NewStore(cache.MetaNamespaceKeyFunc)
	svcCreated := start.Add(2 * time.Second)
	_ = services.Add(&k8sobj.Service{Name: "web", Namespace: "a", CreationTimestamp: metav1.NewTime(svcCreated)})
	// As the informers' transform hands them to the handler.
	slice := func(ann string, at discoveryv1.AddressType) *k8sobj.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "a",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: at}
		if ann != "" {
			s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: ann}
		}
		o, err := slim(s)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*k8sobj.EndpointSlice)
	}
	now := start.Add(time.Minute)
	trig := start.Add(1500 * time.Millisecond)
	for _, tc := range []struct {
		name     string
		kind     k8sobj.Kind
		old, cur any
		ok       bool
		at       time.Time
		label    string
	}{
		{"annotation", k8sobj.KindEndpointSlice, slice("", ""), slice(trig.Format(time.RFC3339Nano), discoveryv1.AddressTypeIPv4), true, trig, "IPv4"},
		{"annotation IPv6", k8sobj.KindEndpointSlice, nil, slice(trig.Format(time.RFC3339Nano), discoveryv1.AddressTypeIPv6), true, trig, "IPv6"},
		{"before start", k8sobj.KindEndpointSlice, nil, slice(start.Add(-time.Second).Format(time.RFC3339Nano), discoveryv1.AddressTypeIPv4), false, time.Time{}, ""},
		{"bad annotation", k8sobj.KindEndpointSlice, nil, slice("yesterday", discoveryv1.AddressTypeIPv4), false, time.Time{}, ""},
		{"new slice: service creation", k8sobj.KindEndpointSlice, nil, slice("", discoveryv1.AddressTypeIPv4), true, svcCreated, "IPv4"},
		{"updated slice, no annotation", k8sobj.KindEndpointSlice, slice("", ""), slice("", discoveryv1.AddressTypeIPv4), false, time.Time{}, ""},
		{"policy", k8sobj.KindNetworkPolicy, nil, &networkingv1.NetworkPolicy{}, true, now, "NetworkPolicy"},
		{"pod relabelled", k8sobj.KindPod, &k8sobj.Pod{}, &k8sobj.Pod{Labels: map[string]string{"a": "b"}}, true, now, "Pod"},
		{"pod status churn", k8sobj.KindPod, &k8sobj.Pod{}, &k8sobj.Pod{Status: k8sobj.PodStatus{Phase: corev1.PodRunning}}, false, time.Time{}, ""},
	} {
		got, ok := lt.changeTrigger(tc.kind, tc.old, tc.cur, now, services)
		if ok != tc.ok || (ok && (!got.at.Equal(tc.at) || got.label != tc.label)) {
			t.Errorf("%s: got %v %q %v, want %v %q %v", tc.name, got.at, got.label, ok, tc.at, tc.label, tc.ok)
		}
	}

	k1 := objKey{kind: k8sobj.KindEndpointSlice, namespace: "a", name: "web-1"}
	k2 := objKey{kind: k8sobj.KindEndpointSlice, namespace: "a", name: "web-2"}
	gone := objKey{kind: k8sobj.KindEndpointSlice, namespace: "a", name: "gone"}
	lt.add(k1, trigger{at: now.Add(-3 * time.Second), label: "IPv4"})
	lt.add(k1, trigger{at: now.Add(-time.Second), label: "IPv4"})
	lt.add(k2, trigger{at: now.Add(-2 * time.Second), label: "IPv6"})
	lt.add(gone, trigger{at: now.Add(-time.Second), label: "IPv4"})
	lt.drop(gone)
	lt.add(objKey{kind: k8sobj.KindPod, name: "p"}, trigger{at: now.Add(-time.Second), label: "Pod"})
	lt.applied(k1, now)
	if got := obs.network["IPv4"]; len(got) != 2 || got[0] != 3*time.Second || got[1] != time.Second {
		t.Errorf("web-1 applied: IPv4 latencies %v, want [3s 1s]", got)
	}
	lt.applied(objKey{kind: k8sobj.KindEndpointSlice, all: true}, now)
	if got := obs.network["IPv6"]; len(got) != 1 || got[0] != 2*time.Second {
		t.Errorf("full set applied: IPv6 latencies %v, want [2s]", got)
	}
	if len(obs.network["IPv4"]) != 2 || len(obs.policy) != 0 {
		t.Errorf("a deleted slice or another kind observed: %v %v", obs.network, obs.policy)
	}
}

// Against the real agent: an EndpointSlice written after the source
// started, with the controller's trigger-time annotation, is counted in
// kube-proxy's histogram once the agent programmed its backend; a
// NetworkPolicy and a pod relabelled are counted in the policy one.
func TestNetworkProgrammingLatencyFromAPIServer(t *testing.T) {
	a := newMemAgent(t)
	e := newEnv(t)
	m := metrics.New(metrics.Options{Log: slog.New(slog.DiscardHandler)})
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: a, Latency: m})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	ctx := context.Background()
	mustCreate(t, e.c.CoreV1().Services("default").Create, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}})
	pp, pn := int32(8080), "p"
	trig := time.Now()
	mustCreate(t, e.c.DiscoveryV1().EndpointSlices("default").Create, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trig.Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &pp}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.80.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}})
	eventually(t, "backend programmed", func() bool {
		for _, f := range a.Frontends() {
			if f.Service.Name == "web" && f.FrontendID != 0 && len(f.Backends) == 1 {
				return true
			}
		}
		return false
	})
	eventually(t, "the histogram counts the change", func() bool {
		h := histogram(t, m, metrics.NameNetworkProgramming, "ip_family", "IPv4")
		return h != nil && h.GetSampleCount() == 1
	})
	h := histogram(t, m, metrics.NameNetworkProgramming, "ip_family", "IPv4")
	if s := h.GetSampleSum(); s <= 0 || s > time.Since(trig).Seconds() {
		t.Errorf("latency %v s: want within (0, %v]", s, time.Since(trig).Seconds())
	}
	if len(h.GetBucket()) != 80 || h.GetBucket()[0].GetUpperBound() != 0.25 || h.GetBucket()[79].GetUpperBound() != 300 {
		t.Errorf("buckets are not kube-proxy's: %d, first %v", len(h.GetBucket()), h.GetBucket()[0].GetUpperBound())
	}

	mustCreate(t, e.c.NetworkingV1().NetworkPolicies("default").Create, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny", Namespace: "default"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	p := mustCreate(t, e.c.CoreV1().Pods("default").Create, pod("default", "web-a", "n", map[string]string{"app": "web"}))
	p.Labels["app"] = "db"
	if _, err := e.c.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "policy changes counted", func() bool {
		np := histogram(t, m, metrics.NamePolicyProgramming, "trigger", "NetworkPolicy")
		pd := histogram(t, m, metrics.NamePolicyProgramming, "trigger", "Pod")
		return np != nil && np.GetSampleCount() == 1 && pd != nil && pd.GetSampleCount() >= 1
	})
}

// histogram is the histogram name{label=value} (nil: not exported).
func histogram(t *testing.T, m *metrics.Metrics, name, label, value string) *dto.Histogram {
	t.Helper()
	if mt := metricWith(t, m, name, label, value); mt != nil {
		return mt.GetHistogram()
	}
	return nil
}

// metricWith is the series of metric name with label=value in m's registry
// (nil: not exported).
func metricWith(t *testing.T, m *metrics.Metrics, name, label, value string) *dto.Metric {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return mt
				}
			}
		}
	}
	return nil
}
