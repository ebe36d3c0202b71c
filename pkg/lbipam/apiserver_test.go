package lbipam

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lanekit/lanekit/internal/k8stest"
)

const testNS = "lanekit-system"

// cuttable is an agent's connection to the API server that the test can
// cut, as a crashed agent's: nothing it would do on the way out (release
// its Leases) reaches the server.
type cuttable struct {
	rt   http.RoundTripper
	down atomic.Bool
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.down.Load() {
		return nil, errors.New("agent crashed")
	}
	return c.rt.RoundTrip(r)
}

// fakeAnnounce records the addresses an agent answers for (no root).
type fakeAnnounce struct {
	mu    sync.Mutex
	addrs []netip.Addr
}

func (f *fakeAnnounce) Set(a []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs = slices.Clone(a)
	return nil
}

func (f *fakeAnnounce) Addrs() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.addrs)
}

type announced interface {
	Announce
	Addrs() []netip.Addr
}

type testAgent struct {
	node   string
	cut    *cuttable
	cancel context.CancelFunc
	done   chan error
	ann    announced
}

func startAgent(t *testing.T, cfg *rest.Config, node string, ann announced) *testAgent {
	t.Helper()
	a := &testAgent{node: node, cut: &cuttable{}, done: make(chan error, 1), ann: ann}
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { a.cut.rt = rt; return a.cut })
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() {
		a.done <- RunAgent(ctx, AgentConfig{Client: cs, Node: node, Namespace: testNS, IPAM: true,
			IPAMLeaseDuration: 2 * time.Second, IPAMRenewDeadline: 1500 * time.Millisecond, IPAMRetryPeriod: 250 * time.Millisecond,
			Announce: ann})
	}()
	t.Cleanup(a.stop)
	return a
}

// stop ends the agent as a crash would: its connection first.
func (a *testAgent) crash() {
	a.cut.down.Store(true)
	a.stop()
}

func (a *testAgent) stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	<-a.done
	a.cancel = nil
	// A stopped agent's process answers for nothing (its sockets close).
	_ = a.ann.Set(nil)
}

func lbService(name string, ann map[string]string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: ann},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
}

// waitService polls the Service until ok says so.
func waitService(t *testing.T, c kubernetes.Interface, name string, limit time.Duration, what string, ok func(*corev1.Service) bool) *corev1.Service {
	t.Helper()
	var last *corev1.Service
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		s, err := c.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = s
		return ok(s), nil
	})
	if err != nil {
		t.Fatalf("service %s: %s not reached in %v: status %+v", name, what, limit, last.Status)
	}
	return last
}

func hasFinalizer(want bool) func(*corev1.Service) bool {
	return func(s *corev1.Service) bool { return slices.Contains(s.Finalizers, Finalizer) == want }
}

func hasIngress(ip string) func(*corev1.Service) bool {
	return func(s *corev1.Service) bool {
		in := s.Status.LoadBalancer.Ingress
		return len(in) == 1 && in[0].IP == ip && in[0].IPMode != nil && *in[0].IPMode == corev1.LoadBalancerIPModeVIP &&
			meta.IsStatusConditionTrue(s.Status.Conditions, ConditionType)
	}
}

// Two agents against a real API server: one leader assigns pool addresses
// (requested, conflicting, released), the other takes over when it
// crashes and keeps every assignment; the L2 announcer of each Service is
// one live node, and moves within 5 s when that node's agent crashes (the
// crashed agent is both the IPAM leader and the first Service's announcer).
func TestAgentsWithAPIServer(t *testing.T) {
	s := k8stest.StartT(t)
	cfg := s.RESTConfig()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(testNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolsConfigMap},
		Data: map[string]string{PoolsKey: "pools: [{name: wire, addresses: ['192.0.2.1-192.0.2.3']}]"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var u *underlay
	var anns [2]announced
	if os.Geteuid() == 0 {
		u = newUnderlay(t, "a")
		for i, p := range u.nodes {
			r, err := OpenResponder(p, "uplink", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			anns[i] = r
		}
	} else {
		t.Log("not root: L2 announcements checked on the announcers' address sets, not on the wire")
		anns = [2]announced{&fakeAnnounce{}, &fakeAnnounce{}}
	}
	agents := map[string]*testAgent{}
	for i, n := range []string{"node-a", "node-b"} {
		agents[n] = startAgent(t, cfg, n, anns[i])
	}

	holder := func() string {
		l, err := c.CoordinationV1().Leases(testNS).Get(ctx, "lanekit-lb-ipam", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	var leader string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		leader = holder()
		return agents[leader] != nil, nil
	}); err != nil {
		t.Fatalf("no agent holds the IPAM Lease (holder %q)", leader)
	}
	// The first Service is one the IPAM leader also announces, so that
	// crashing that agent moves both jobs.
	web := ""
	for i := 0; web == ""; i++ {
		if n := fmt.Sprintf("web%d", i); Elect("default/"+n, []string{"node-a", "node-b"}) == leader {
			web = n
		}
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, lbService(web, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, web, 20*time.Second, "ingress 192.0.2.1 (VIP)", hasIngress("192.0.2.1"))
	waitService(t, c, web, 10*time.Second, "the cleanup finalizer", hasFinalizer(true))

	// A request for a held address: a conflict, as a condition and an event.
	if _, err := c.CoreV1().Services("default").Create(ctx, lbService("copy", map[string]string{AnnotationIPs: "192.0.2.1"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "copy", 10*time.Second, "AddressInUse", func(s *corev1.Service) bool {
		cd := meta.FindStatusCondition(s.Status.Conditions, ConditionType)
		return cd != nil && cd.Status == metav1.ConditionFalse && cd.Reason == ReasonConflict && len(s.Status.LoadBalancer.Ingress) == 0
	})
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		ev, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=copy,reason=" + ReasonConflict})
		return err == nil && len(ev.Items) > 0, nil
	})
	if err != nil {
		t.Fatal("no AddressInUse event for Service copy")
	}
	// Another controller's Service (its loadBalancerClass, its own cleanup
	// finalizer) is left alone.
	foreign := lbService("foreign", nil)
	foreign.Spec.LoadBalancerClass = new("example.com/other-lb")
	foreign.Finalizers = []string{Finalizer}
	if _, err := c.CoreV1().Services("default").Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A requested free address.
	if _, err := c.CoreV1().Services("default").Create(ctx, lbService("pinned", map[string]string{AnnotationIPs: "192.0.2.3"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "pinned", 10*time.Second, "ingress 192.0.2.3", hasIngress("192.0.2.3"))

	// L2: the elected node answers for web's address, the other does not.
	ip := netip.MustParseAddr("192.0.2.1")
	elected := leader
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}[elected]
	waitAnnounced(t, agents[elected].ann, ip, true)
	if slices.Contains(agents[other].ann.Addrs(), ip) {
		t.Fatalf("%s answers for %s too", other, ip)
	}
	macOf := map[string]int{"node-a": 0, "node-b": 1}
	if u != nil {
		u.flush(t, ip)
		u.waitNeighbour(t, ip, u.macs[macOf[elected]], true, 10*time.Second)
	}

	// The IPAM leader, web's announcer, crashes.
	time.Sleep(1100 * time.Millisecond) // past the client's neighbour locktime
	crashed := time.Now()
	agents[elected].crash()
	if u != nil {
		took := u.waitNeighbour(t, ip, u.macs[macOf[other]], false, 5*time.Second)
		t.Logf("the client's neighbour entry for %s moved to %s %v after %s crashed", ip, other, took, elected)
	}
	waitAnnounced(t, agents[other].ann, ip, true)
	if d := time.Since(crashed); d > 5*time.Second {
		t.Fatalf("takeover took %v, want <= 5s", d)
	}
	survivor := agents[other]
	// The new leader keeps every assignment (rebuilt from status) and
	// assigns the one free address to a new Service.
	if _, err := c.CoreV1().Services("default").Create(ctx, lbService("late", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "late", 20*time.Second, "ingress 192.0.2.2", hasIngress("192.0.2.2"))
	if h := holder(); h != survivor.node {
		t.Fatalf("IPAM lease held by %q, want %s", h, survivor.node)
	}
	waitService(t, c, web, time.Second, "still 192.0.2.1", hasIngress("192.0.2.1"))
	waitService(t, c, "pinned", time.Second, "still 192.0.2.3", hasIngress("192.0.2.3"))

	// web stops being a LoadBalancer: its address is released (status
	// cleared) and the conflicting request now gets it.
	ws, err := c.CoreV1().Services("default").Get(ctx, web, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ws.Spec.Type = corev1.ServiceTypeClusterIP
	for i := range ws.Spec.Ports {
		ws.Spec.Ports[i].NodePort = 0
	}
	ws.Spec.ExternalTrafficPolicy = ""
	ws.Spec.AllocateLoadBalancerNodePorts = nil
	if _, err := c.CoreV1().Services("default").Update(ctx, ws, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, web, 10*time.Second, "released", func(s *corev1.Service) bool {
		return len(s.Status.LoadBalancer.Ingress) == 0 && !Assigned(s) && !hasFinalizer(true)(s)
	})
	waitService(t, c, "copy", 10*time.Second, "ingress 192.0.2.1", hasIngress("192.0.2.1"))

	// The pool is full: the next Service is told so.
	if _, err := c.CoreV1().Services("default").Create(ctx, lbService("extra", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "extra", 10*time.Second, "PoolExhausted", func(s *corev1.Service) bool {
		cd := meta.FindStatusCondition(s.Status.Conditions, ConditionType)
		return cd != nil && cd.Status == metav1.ConditionFalse && cd.Reason == ReasonExhausted
	})
	// A broken pools document is an event on the ConfigMap and releases
	// nothing, even once a Service is deleted (nothing is reassigned).
	cm, err := c.CoreV1().ConfigMaps(testNS).Get(ctx, DefaultPoolsConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[PoolsKey] = "pools: [{name: wire, addresses: ['192.0.2.1/24']}]" // host bits
	if _, err := c.CoreV1().ConfigMaps(testNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		ev, err := c.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + DefaultPoolsConfigMap + ",reason=InvalidPools"})
		return err == nil && len(ev.Items) > 0, nil
	})
	if err != nil {
		t.Fatal("no InvalidPools event on the pools ConfigMap")
	}
	waitService(t, c, "late", time.Second, "the cleanup finalizer", hasFinalizer(true))
	if err := c.CoreV1().Services("default").Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its finalizer goes even under a broken pools document: it is gone.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Services("default").Get(ctx, "late", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal("deleted Service late is still there: its finalizer was not removed")
	}
	for name, ip := range map[string]string{"copy": "192.0.2.1", "pinned": "192.0.2.3"} {
		waitService(t, c, name, time.Second, "kept "+ip+" under a broken pools document", hasIngress(ip))
	}
	waitService(t, c, "foreign", time.Second, "untouched (another loadBalancerClass)", func(s *corev1.Service) bool {
		return len(s.Status.LoadBalancer.Ingress) == 0 && len(s.Status.Conditions) == 0
	})
	// Deleted, another controller's Service keeps that controller's
	// finalizer: lanekit removes it only from its own.
	if err := c.CoreV1().Services("default").Delete(ctx, "foreign", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	waitService(t, c, "foreign", time.Second, "still held by its own controller's finalizer", hasFinalizer(true))
	waitService(t, c, "extra", time.Second, "still unassigned", func(s *corev1.Service) bool { return len(s.Status.LoadBalancer.Ingress) == 0 })
	// Nor does a deleted pools ConfigMap (an empty pool list would).
	if err := c.CoreV1().ConfigMaps(testNS).Delete(ctx, DefaultPoolsConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	waitService(t, c, "copy", time.Second, "kept 192.0.2.1 without a pools ConfigMap", hasIngress("192.0.2.1"))
}

func waitAnnounced(t *testing.T, a announced, ip netip.Addr, want bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return slices.Contains(a.Addrs(), ip) == want, nil
	})
	if err != nil {
		t.Fatalf("announcer: %s announced=%v not reached (has %v)", ip, want, a.Addrs())
	}
}
