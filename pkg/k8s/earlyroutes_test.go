package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func earlyNode(name, cidr, ip string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

// orderedSink records each sync's routes in order; gate, when set, holds
// the first sync until it is closed.
type orderedSink struct {
	mu    sync.Mutex
	syncs [][]Route
	gate  chan struct{}
}

func (o *orderedSink) SyncRoutes(r []Route) error {
	o.mu.Lock()
	first := len(o.syncs) == 0
	o.syncs = append(o.syncs, append([]Route(nil), r...))
	o.mu.Unlock()
	if first && o.gate != nil {
		<-o.gate
	}
	return nil
}

func (o *orderedSink) all() [][]Route {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([][]Route(nil), o.syncs...)
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// The early sync installs a route to every other Node from one LIST,
// before any source exists; the source's sync through it comes after the
// early one has ended, never before (a stale LIST cannot overwrite it).
func TestEarlyRoutes(t *testing.T) {
	c := fake.NewSimpleClientset(
		earlyNode("n1", "10.244.1.0/24", "10.77.0.1"),
		earlyNode("n2", "10.244.2.0/24", "10.77.0.2"),
		earlyNode("n3", "10.244.3.0/24", "10.77.0.3"))
	sink := &orderedSink{gate: make(chan struct{})}
	e := StartEarlyRoutes(context.Background(), c, "n1", sink, 10*time.Second, quietLog)

	sourceDone := make(chan struct{})
	later := []Route{{Node: "n2", Dst: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("10.77.0.2")}}
	go func() {
		defer close(sourceDone)
		if err := e.SyncRoutes(later); err != nil {
			t.Error(err)
		}
	}()
	// The early sync is held in the sink: the source's must wait.
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.all()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no early sync")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-sourceDone:
		t.Fatal("the source's sync ran while the early one was still syncing")
	case <-time.After(100 * time.Millisecond):
	}
	close(sink.gate)
	<-sourceDone
	got := sink.all()
	if len(got) != 2 {
		t.Fatalf("%d syncs, want 2 (early, then the source's)", len(got))
	}
	if want := "[{n2 10.244.2.0/24 10.77.0.2} {n3 10.244.3.0/24 10.77.0.3}]"; fmt.Sprint(got[0]) != want {
		t.Errorf("early routes %v, want %s (every other Node, not n1 itself)", got[0], want)
	}
	if fmt.Sprint(got[1]) != fmt.Sprint(later) {
		t.Errorf("second sync %v, want the source's %v", got[1], later)
	}
}

// A failed LIST installs nothing and lets the source's syncs through.
func TestEarlyRoutesListFails(t *testing.T) {
	c := fake.NewSimpleClientset()
	c.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("api server down")
	})
	sink := &orderedSink{}
	e := StartEarlyRoutes(context.Background(), c, "n1", sink, 10*time.Second, quietLog)
	if err := e.SyncRoutes(nil); err != nil {
		t.Fatal(err)
	}
	if got := sink.all(); len(got) != 1 || len(got[0]) != 0 {
		t.Fatalf("syncs %v, want only the source's (empty) one", got)
	}
}
