package k8s

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/policy"
	"github.com/lanekit/lanekit/pkg/service"
)

// Event reasons on a Service the agent's maps have no room for, and on it
// again once it is programmed.
const (
	ReasonNotProgrammed = "ServiceNotProgrammed"
	ReasonProgrammed    = "ServiceProgrammed"
)

// UnprogrammedSource is an ObjectSink that reports the Service frontends
// its full maps could not take (*agent.Agent is one).
type UnprogrammedSource interface {
	Unprogrammed() []service.Unprogrammed
}

// capacityCheck is how often the source looks for Services whose
// programming state changed, besides after each Service or EndpointSlice
// change.
const capacityCheck = 5 * time.Second

// capacityWatcher turns the agent's unprogrammed frontends into Events on
// their Services: a Warning naming the full map when a Service first
// misses a frontend, a Normal event once all its frontends are programmed.
type capacityWatcher struct {
	s        *Source
	src      UnprogrammedSource
	events   record.EventBroadcaster
	recorder record.EventRecorder
	kick     chan struct{}
	// missing: the Services reported, with the message of their Warning.
	missing map[service.ServiceID]string
	// pol: the NetworkPolicies the policy maps could not take (nil: the
	// sink does not say); polMissing: those reported (policycapacity.go).
	pol        PolicyUnprogrammedSource
	polMissing map[policy.PolicyRef]string
}

func newCapacityWatcher(s *Source, src UnprogrammedSource) *capacityWatcher {
	b := record.NewBroadcaster()
	w := &capacityWatcher{s: s, src: src, kick: make(chan struct{}, 1), missing: map[service.ServiceID]string{}, events: b,
		recorder:   b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lanekitd", Host: s.cfg.NodeName}),
		polMissing: map[policy.PolicyRef]string{}}
	w.pol, _ = src.(PolicyUnprogrammedSource)
	return w
}

func (w *capacityWatcher) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *capacityWatcher) run(ctx context.Context) {
	w.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.s.cfg.Client.CoreV1().Events("")})
	defer w.events.Shutdown()
	t := time.NewTicker(capacityCheck)
	defer t.Stop()
	for {
		w.check()
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
	}
}

// check reports the Services and NetworkPolicies whose state changed since
// the last check.
func (w *capacityWatcher) check() {
	w.checkPolicies()
	type miss struct {
		maps   map[string]bool
		fronts []string
		stale  bool
	}
	now := map[service.ServiceID]*miss{}
	for _, u := range w.src.Unprogrammed() {
		m := now[u.Service]
		if m == nil {
			m = &miss{maps: map[string]bool{}}
			now[u.Service] = m
		}
		m.maps[u.Map] = true
		m.fronts = append(m.fronts, fmt.Sprintf("%s:%d/%s", u.Key.Addr, u.Key.Port, u.Key.Proto))
		m.stale = m.stale || u.Stale
	}
	for _, id := range slices.SortedFunc(maps.Keys(now), compareServiceIDs) {
		m := now[id]
		what := "not programmed"
		if m.stale {
			what = "not programmed (or with an earlier backend set)"
		}
		msg := fmt.Sprintf("node %s: map %s full: %d frontends %s: %s; raise lanekitd --lb-frontends/--lb-backends or remove Services",
			w.s.cfg.NodeName, strings.Join(slices.Sorted(maps.Keys(m.maps)), ", "), len(m.fronts), what, strings.Join(m.fronts, ", "))
		if w.missing[id] == msg {
			continue
		}
		w.missing[id] = msg
		w.s.log.Warn("service not programmed: map full", "service", id, "maps", slices.Sorted(maps.Keys(m.maps)), "frontends", len(m.fronts))
		w.event(id, corev1.EventTypeWarning, ReasonNotProgrammed, msg)
	}
	for _, id := range slices.SortedFunc(maps.Keys(w.missing), compareServiceIDs) {
		if _, still := now[id]; still {
			continue
		}
		delete(w.missing, id)
		w.s.log.Info("service programmed: its map has room again", "service", id)
		w.event(id, corev1.EventTypeNormal, ReasonProgrammed, fmt.Sprintf("node %s: all frontends programmed", w.s.cfg.NodeName))
	}
}

// event records an event on the Service id, if it still exists.
func (w *capacityWatcher) event(id service.ServiceID, typ, reason, msg string) {
	o, ok, err := w.s.kinds[k8sobj.KindService].GetStore().GetByKey(id.Namespace + "/" + id.Name)
	if err != nil || !ok {
		return
	}
	if svc, ok := o.(*k8sobj.Service); ok {
		w.recorder.Event(svc, typ, reason, msg)
	}
}

func compareServiceIDs(a, b service.ServiceID) int { return strings.Compare(a.String(), b.String()) }
