package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/service"
)

// More Services than the agent's frontend map holds (--lb-frontends 4),
// through the real API server into the real agent: the ones that do not
// fit are not written to the datapath and are reported — the map's fill
// and unprogrammed count in ControlStats (lanekit status) and the metrics,
// a Warning Event on each of those Services; deleting Services makes room
// and the waiting ones are programmed, with a Normal Event.
func TestFullMapsFailLoudly(t *testing.T) {
	a, dp := newMemAgentWith(t, func(c *agent.Config) { c.LBFrontends = 4 })
	e := newEnv(t)
	m := metrics.New(metrics.Options{Log: slog.New(slog.DiscardHandler)})
	if err := m.Watch(a); err != nil {
		t.Fatal(err)
	}
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: a})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	ctx := context.Background()
	// The API server's own "kubernetes" Service takes one frontend; s1..s3
	// fill the map, s4 and s5 do not fit.
	for i := 1; i <= 5; i++ {
		mustCreate(t, e.c.CoreV1().Services("default").Create, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i), Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}})
		eventually(t, fmt.Sprintf("s%d in the agent", i), func() bool {
			return slices.ContainsFunc(a.Frontends(), func(f agent.FrontendInfo) bool { return f.Service.Name == fmt.Sprintf("s%d", i) })
		})
	}
	svcMap := func() agent.MapStat {
		for _, ms := range a.ControlStats().Maps {
			if ms.Map == service.MapFrontends {
				return ms
			}
		}
		t.Fatalf("no %s in ControlStats", service.MapFrontends)
		return agent.MapStat{}
	}
	if ms := svcMap(); ms.Entries != 4 || ms.Capacity != 4 || ms.UnprogrammedFrontends != 2 || ms.UnprogrammedServices != 2 {
		t.Errorf("%s: %+v, want 4/4 entries, 2 frontends of 2 Services unprogrammed", service.MapFrontends, ms)
	}
	if got := programmedServices(t, a, dp); !slices.Equal(got, []string{"kubernetes", "s1", "s2", "s3"}) {
		t.Errorf("datapath serves %v, want kubernetes s1 s2 s3", got)
	}
	if v := gaugeValue(t, m, metrics.NameMapUnprogrammed, service.MapFrontends); v != 2 {
		t.Errorf("%s{map=%s} = %v, want 2", metrics.NameMapUnprogrammed, service.MapFrontends, v)
	}
	if v := gaugeValue(t, m, metrics.NameMapEntries, service.MapFrontends); v != 4 {
		t.Errorf("%s{map=%s} = %v, want 4", metrics.NameMapEntries, service.MapFrontends, v)
	}
	eventually(t, "Warning events on s4 and s5", func() bool {
		return slices.Equal(eventsFor(t, e, ReasonNotProgrammed), []string{"s4", "s5"})
	})
	// Each names its Service by UID too (kubectl describe finds a Service's
	// events by it).
	evs, err := e.c.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Reason != ReasonNotProgrammed {
			continue
		}
		svc, err := e.c.CoreV1().Services("default").Get(ctx, ev.InvolvedObject.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ev.InvolvedObject.UID != svc.UID || svc.UID == "" {
			t.Errorf("event on %s names UID %q, the Service's is %q", ev.InvolvedObject.Name, ev.InvolvedObject.UID, svc.UID)
		}
	}

	for _, n := range []string{"s1", "s2"} {
		if err := e.c.CoreV1().Services("default").Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "s4 and s5 programmed once room returns", func() bool {
		return slices.Equal(programmedServices(t, a, dp), []string{"kubernetes", "s3", "s4", "s5"})
	})
	if ms := svcMap(); ms.Entries != 4 || ms.UnprogrammedFrontends != 0 {
		t.Errorf("%s after room returned: %+v", service.MapFrontends, ms)
	}
	eventually(t, "Normal events on s4 and s5", func() bool {
		return slices.Equal(eventsFor(t, e, ReasonProgrammed), []string{"s4", "s5"})
	})
}

// programmedServices are the Services whose ClusterIP frontend the
// datapath holds, sorted.
func programmedServices(t *testing.T, a *agent.Agent, dp interface {
	DumpServices() (*service.Update, error)
}) []string {
	t.Helper()
	u, err := dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range a.Frontends() {
		if _, ok := u.Services[service.ServiceKeyOf(f.Key)]; ok && f.Key.Addr.Is4() {
			out = append(out, f.Service.Name)
		}
	}
	slices.Sort(out)
	return out
}

// eventsFor are the names of the Services in default with an event of reason.
func eventsFor(t *testing.T, e *env, reason string) []string {
	t.Helper()
	evs, err := e.c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.Reason == reason && ev.InvolvedObject.Kind == "Service" {
			out = append(out, ev.InvolvedObject.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// gaugeValue is the gauge name{map=value}.
func gaugeValue(t *testing.T, m *metrics.Metrics, name, mapName string) float64 {
	t.Helper()
	mt := metricWith(t, m, name, "map", mapName)
	if mt == nil {
		t.Fatalf("%s{map=%q} not exported", name, mapName)
	}
	return mt.GetGauge().GetValue()
}
