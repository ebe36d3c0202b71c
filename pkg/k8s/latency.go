package k8s

import (
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// LatencyObserver records how long changes took to reach the datapath
// (pkg/metrics' histograms).
type LatencyObserver interface {
	// ObserveNetworkProgramming is kube-proxy's network programming
	// latency: from an EndpointSlice change's trigger time to the agent's
	// maps holding the new backend set; family is IPv4 or IPv6.
	ObserveNetworkProgramming(family string, d time.Duration)
	// ObservePolicyProgramming is from the watch event of a policy input
	// (trigger: NetworkPolicy, Pod, Namespace) reaching the agent to the
	// policy maps written.
	ObservePolicyProgramming(trigger string, d time.Duration)
}

// trigger is one change waiting to be programmed: when it happened and the
// label its histogram takes.
type trigger struct {
	at    time.Time
	label string
}

// latencyTracker keeps the trigger times of the changes queued for the
// agent, like kube-proxy's EndpointsChangeTracker: only changes after the
// tracker started count (the initial sync is not a change), and a deleted
// object's triggers are dropped (kube-proxy records no latency for them).
type latencyTracker struct {
	obs   LatencyObserver
	start time.Time
	mu    sync.Mutex
	// pending: the trigger times of each queued object's changes since it
	// was last applied.
	pending map[objKey][]trigger
}

func newLatencyTracker(obs LatencyObserver, now time.Time) *latencyTracker {
	return &latencyTracker{obs: obs, start: now, pending: map[objKey][]trigger{}}
}

// changeTrigger is the trigger time and label of a change of kind from old
// to cur (old nil: an add); ok is false when the change has no trigger time
// to measure from. now is when the watch event reached the agent; services
// finds a Service by namespace/name for a slice without the annotation.
func (lt *latencyTracker) changeTrigger(kind k8sobj.Kind, old, cur any, now time.Time, services cache.Store) (trigger, bool) {
	switch kind {
	case k8sobj.KindEndpointSlice:
		s, ok := cur.(*k8sobj.EndpointSlice)
		if !ok {
			return trigger{}, false
		}
		t, ok := sliceTriggerTime(s, old == nil, services)
		if !ok || !t.After(lt.start) {
			return trigger{}, false
		}
		return trigger{at: t, label: sliceFamily(s)}, true
	case k8sobj.KindNetworkPolicy, k8sobj.KindNamespace:
		return trigger{at: now, label: string(kind)}, now.After(lt.start)
	case k8sobj.KindPod:
		if old != nil && !podPolicyChanged(old, cur) {
			return trigger{}, false // status churn: nothing the policy reads
		}
		return trigger{at: now, label: string(kind)}, now.After(lt.start)
	}
	return trigger{}, false
}

// sliceTriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
// annotation the endpointslice controller stamps (the time of the pod or
// Service change it reacts to); without it, a new slice's Service's
// creation (what the controller stamps for a new Service).
func sliceTriggerTime(s *k8sobj.EndpointSlice, added bool, services cache.Store) (time.Time, bool) {
	if v := s.TriggerTime; v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		return t, err == nil
	}
	if !added || services == nil {
		return time.Time{}, false
	}
	name := s.ServiceName
	o, ok, err := services.GetByKey(s.Namespace + "/" + name)
	if name == "" || !ok || err != nil {
		return time.Time{}, false
	}
	svc, ok := o.(*k8sobj.Service)
	if !ok {
		return time.Time{}, false
	}
	return svc.CreationTimestamp.Time, true
}

// sliceFamily is kube-proxy's ip_family label of a slice's backends.
func sliceFamily(s *k8sobj.EndpointSlice) string {
	if s.AddressType == discoveryv1.AddressTypeIPv6 {
		return string(corev1.IPv6Protocol)
	}
	return string(corev1.IPv4Protocol)
}

// podPolicyChanged reports whether a pod update changes what the policy
// compiles from it: labels, addresses or node.
func podPolicyChanged(old, cur any) bool {
	o, ok1 := old.(*k8sobj.Pod)
	c, ok2 := cur.(*k8sobj.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(o.Labels, c.Labels) || o.Spec.NodeName != c.Spec.NodeName ||
		!slices.Equal(o.Status.PodIPs, c.Status.PodIPs) || o.Namespace != c.Namespace
}

// add records a change of k to measure when k is next applied.
func (lt *latencyTracker) add(k objKey, t trigger) {
	lt.mu.Lock()
	lt.pending[k] = append(lt.pending[k], t)
	lt.mu.Unlock()
}

// drop forgets k's changes (it was deleted).
func (lt *latencyTracker) drop(k objKey) {
	lt.mu.Lock()
	delete(lt.pending, k)
	lt.mu.Unlock()
}

// applied observes the changes of k (with k.all: of every object of its
// kind) now that the agent holds them.
func (lt *latencyTracker) applied(k objKey, now time.Time) {
	lt.mu.Lock()
	kind := k.kind
	done := lt.pending[k]
	delete(lt.pending, k)
	if k.all {
		for pk, ts := range lt.pending {
			if pk.kind == kind {
				done = append(done, ts...)
				delete(lt.pending, pk)
			}
		}
	}
	lt.mu.Unlock()
	for _, t := range done {
		d := max(now.Sub(t.at), 0)
		if kind == k8sobj.KindEndpointSlice {
			lt.obs.ObserveNetworkProgramming(t.label, d)
		} else {
			lt.obs.ObservePolicyProgramming(t.label, d)
		}
	}
}

// objectKey is k for an informer object.
func objectKey(kind k8sobj.Kind, m metav1.Object) objKey {
	return objKey{kind: kind, namespace: m.GetNamespace(), name: m.GetName()}
}
