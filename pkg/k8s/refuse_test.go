package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/service"
)

// An object the agent refuses does not hold the source back: the initial
// sync is ready with it refused, a refusal in a live change is recorded the
// same way, and every later change to the kind retries the refused objects.
func TestRefusedObjectKeepsSourceReady(t *testing.T) {
	e := newEnv(t)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "good"}})
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bad"}})
	store := newObjectStore()
	store.setRefuse("Namespace//bad", true)
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: store})
	eventually(t, "ready with a refused object", func() bool { return src.Synced() == nil })
	if !store.has("Namespace//good") || store.has("Namespace//bad") {
		t.Errorf("after the initial sync the agent has %v, want good and not bad", store.keys())
	}
	if got := src.Refused(); len(got) != 1 || !strings.Contains(got["Namespace bad"], "refused by the test") {
		t.Errorf("Refused() = %v, want Namespace bad with the agent's reason", got)
	}

	// The agent would take it now: a change to another Namespace retries it.
	store.setRefuse("Namespace//bad", false)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "poke"}})
	eventually(t, "refused object retried on a change to its kind", func() bool {
		return store.has("Namespace//bad") && len(src.Refused()) == 0
	})

	// Refused in a live change (nothing else refused): recorded the same
	// way, still ready, retried on the next change.
	store.setRefuse("Namespace//late", true)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "late"}})
	eventually(t, "live refusal recorded", func() bool { _, ok := src.Refused()["Namespace late"]; return ok })
	if err := src.Synced(); err != nil || store.has("Namespace//late") {
		t.Errorf("after a live refusal: synced %v, agent has late %v", err, store.has("Namespace//late"))
	}
	store.setRefuse("Namespace//late", false)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "poke2"}})
	eventually(t, "live refusal retried", func() bool { return store.has("Namespace//late") && len(src.Refused()) == 0 })
}

// clusterIPService is a Service with a fixed cluster IP and one TCP port.
func clusterIPService(name, ip string, port int32) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP}}}}
}

// replaceCounter is the agent with a count of its ReplaceObjects calls.
type replaceCounter struct {
	*agent.Agent
	n atomic.Int64
}

func (r *replaceCounter) ReplaceObjects(kind k8sobj.Kind, objs []k8sobj.Object) ([]agent.Refusal, error) {
	r.n.Add(1)
	return r.Agent.ReplaceObjects(kind, objs)
}

// newMemAgent is a real agent (translation, store, readiness) on the memory
// datapath in its own network namespace (root).
func newMemAgent(t *testing.T) *agent.Agent {
	a, _ := newMemAgentWith(t, nil)
	return a
}

// newMemAgentWith is newMemAgent with its config changed by edit (nil:
// none), and its memory datapath.
func newMemAgentWith(t *testing.T, edit func(*agent.Config)) (*agent.Agent, *agenttest.MemoryDatapath) {
	testutil.RequireRoot(t)
	node := netnstest.New(t, "k8sref")
	dp := agenttest.NewMemoryDatapath()
	cfg := agent.Config{
		StateDir: t.TempDir(), PodCIDR: netip.MustParsePrefix("10.79.0.0/24"), MTU: 1500, HostNetns: node.Path(),
		NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.99.1")},
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) {
			return dp, nil
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := agent.New(cfg, testLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, dp
}

// frontendOwner is the service that holds ip:port/TCP in the agent's
// programmed tables ("" if none).
func frontendOwner(a *agent.Agent, ip string, port uint16) string {
	for _, f := range a.Frontends() {
		if f.Key.Addr.String() == ip && f.Key.Port == port && f.Key.Scope == service.ScopeClusterIP && f.FrontendID != 0 {
			return f.Service.Name
		}
	}
	return ""
}

func refusedMetric(t *testing.T, m *metrics.Metrics, kind string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != metrics.NameObjectsRefused {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return mt.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{kind=%q} not exported", metrics.NameObjectsRefused, kind)
	return 0
}

// Two Services claim one cluster IP and port (the API server's allocator
// was bypassed, as after an etcd restore: its repair loop reports
// ClusterIPAlreadyAllocated but both Services exist). Against the real agent:
// the older Service keeps the frontend whichever arrived first, the newer
// one is refused and counted, the valid one and the node stay ready, a
// restarted source decides the same, and once the older one is deleted the
// refused one applies.
func TestClashingServicesRefusedOnTheirOwn(t *testing.T) {
	a := newMemAgent(t)
	e := newEnv(t)
	ctx := context.Background()
	m := metrics.New(metrics.Options{Log: slog.New(slog.DiscardHandler)})
	if err := m.Watch(a); err != nil {
		t.Fatal(err)
	}
	const vip = "10.96.0.50"
	// The older Service's name sorts last: age decides, not the name.
	mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService("zz-older", vip, 81))
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has seconds
	if err := e.c.NetworkingV1().IPAddresses().Delete(ctx, vip, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService("aa-newer", vip, 80))
	mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService("valid", "10.96.0.51", 80))

	sink := &replaceCounter{Agent: a}
	src, stop := run(t, Config{NodeName: "n", Client: e.c, Objects: sink})
	a.AddReadyCheck("k8s", func() error { return src.Synced() })
	eventually(t, "initial sync", func() bool { return src.Synced() == nil && frontendOwner(a, "10.96.0.51", 80) == "valid" })
	if got := frontendOwner(a, vip, 80); got != "aa-newer" || len(a.Refused()) != 0 {
		t.Fatalf("before the clash %s:80 belongs to %q, refused %v", vip, got, a.Refused())
	}

	// The older Service moves onto the newer one's port: it takes the
	// frontend (as a restart would decide), the newer one is refused.
	older, err := e.c.CoreV1().Services("default").Get(ctx, "zz-older", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	older.Spec.Ports[0].Port = 80
	if _, err := e.c.CoreV1().Services("default").Update(ctx, older, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		eventually(t, what+": the older service holds the frontend, the newer one is refused", func() bool {
			// The source notes the agent's refusals when ReplaceObjects
			// returns, just after the agent does.
			_, noted := src.Refused()["Service default/aa-newer"]
			return frontendOwner(a, vip, 80) == "zz-older" && len(a.Refused()) == 1 && noted
		})
		r := a.Refused()[0]
		if r.Object.Key() != "Service/default/aa-newer" || !strings.Contains(r.Err.Error(), "default/zz-older") {
			t.Errorf("%s: refused %s: %v (want aa-newer, naming zz-older)", what, r.Object, r.Err)
		}
		if _, ok := src.Refused()["Service default/aa-newer"]; !ok {
			t.Errorf("%s: the source's refusals %v lack aa-newer", what, src.Refused())
		}
		if got := refusedMetric(t, m, "Service"); got != 1 {
			t.Errorf("%s: %s{kind=Service} = %v, want 1", what, metrics.NameObjectsRefused, got)
		}
		st, err := a.Status()
		if err != nil || !st.Ready || src.Synced() != nil {
			t.Errorf("%s: agent ready %v (%s, %v), source %v", what, st.Ready, st.NotReadyReason, err, src.Synced())
		}
		if frontendOwner(a, "10.96.0.51", 80) != "valid" {
			t.Errorf("%s: the valid service lost its frontend", what)
		}
	}
	check("live update")

	// A change to an unrelated Service applies on its own: only a change to
	// the refused Service or to the one holding its frontend makes the
	// agent decide over the full set again (a second at 10,000 Services).
	replaces := sink.n.Load()
	mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService("other", "10.96.0.52", 80))
	eventually(t, "unrelated service applies", func() bool { return frontendOwner(a, "10.96.0.52", 80) == "other" })
	time.Sleep(resyncDelay + 500*time.Millisecond)
	if n := sink.n.Load() - replaces; n != 0 {
		t.Errorf("an unrelated Service change made %d full-set replaces, want 0", n)
	}

	// A restarted source (same agent) decides the same way.
	stop()
	src, _ = run(t, Config{NodeName: "n", Client: e.c, Objects: a})
	eventually(t, "second source sync", func() bool { return src.Synced() == nil })
	check("restarted source")

	// The older one goes: the refused one applies.
	if err := e.c.CoreV1().Services("default").Delete(ctx, "zz-older", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the refused service applies once the clash is gone", func() bool {
		return frontendOwner(a, vip, 80) == "aa-newer" && len(a.Refused()) == 0 && len(src.Refused()) == 0
	})
	if got := refusedMetric(t, m, "Service"); got != 0 {
		t.Errorf("%s{kind=Service} = %v after the clash went, want 0", metrics.NameObjectsRefused, got)
	}
	var names []string
	for _, o := range a.Objects(k8sobj.KindService) {
		names = append(names, o.Name())
	}
	if !slices.Equal(names, []string{"aa-newer", "kubernetes", "other", "valid"}) {
		t.Errorf("services in the agent: %v", names)
	}
}

// The datapath refuses one frontend of the first full set (as the kernel
// refused a Maglev array at 30,000 Services): the source is ready and hands
// the set over once (it had handed it over again and again, rewriting every
// object, never ready), every other Service is programmed, and the refused
// one is programmed by the agent's own retry once the datapath takes it.
func TestDatapathRefusalKeepsInitialSync(t *testing.T) {
	a, dp := newMemAgentWith(t, nil)
	e := newEnv(t)
	for i := 1; i <= 4; i++ {
		mustCreate(t, e.c.CoreV1().Services("default").Create, clusterIPService(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.9.%d", i), 80))
	}
	refused := service.ServiceKey{Addr: [4]byte{10, 96, 9, 3}, Port: 80, Proto: uint8(service.TCP), Scope: uint8(service.ScopeClusterIP)}
	dp.RefuseService(refused, true)
	r := &replaceCounter{Agent: a}
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: r})
	eventually(t, "ready with s3 refused by the datapath", func() bool { return src.Synced() == nil })
	n := r.n.Load()
	time.Sleep(3 * time.Second) // a failed initial sync is retried after 1 s, then 2 s
	if got := r.n.Load(); got != n {
		t.Errorf("the source handed the agent a full set %d more times", got-n)
	}
	if got := programmedServices(t, a, dp); !slices.Equal(got, []string{"kubernetes", "s1", "s2", "s4"}) {
		t.Errorf("datapath serves %v, want kubernetes s1 s2 s4", got)
	}
	if st := a.ControlStats(); st.PendingSvc != 1 {
		t.Errorf("%d service update parts queued, want 1 (s3's)", st.PendingSvc)
	}
	dp.RefuseService(refused, false)
	a.MaintainOnce()
	if got := programmedServices(t, a, dp); !slices.Equal(got, []string{"kubernetes", "s1", "s2", "s3", "s4"}) {
		t.Errorf("after the retry the datapath serves %v, want every Service", got)
	}
}

// A kind's full set handed over again (a change that may settle a
// refusal) that the agent takes with part of it not programmed
// (agent.ErrDatapathPending) is not handed over again: the agent retries
// that part itself.
func TestPendingFullSetNotRepeated(t *testing.T) {
	e := newEnv(t)
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bad"}})
	store := newObjectStore()
	store.setRefuse("Namespace//bad", true)
	src, _ := run(t, Config{NodeName: "n", Client: e.c, Objects: store})
	eventually(t, "initial sync", func() bool { return src.Synced() == nil })
	store.mu.Lock()
	store.pending = fmt.Errorf("replace: %w", agent.ErrDatapathPending)
	before := store.replaces[k8sobj.KindNamespace]
	store.mu.Unlock()
	// A change to the kind hands the agent its full set (bad may settle).
	mustCreate(t, e.c.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "poke"}})
	replaces := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.replaces[k8sobj.KindNamespace] - before
	}
	eventually(t, "the full set handed over", func() bool { return replaces() >= 1 })
	time.Sleep(2 * time.Second) // retries back off from 200 ms
	if n := replaces(); n != 1 {
		t.Errorf("the full set was handed over %d times, want once", n)
	}
}
