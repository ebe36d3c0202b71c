package agent

import (
	"context"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/service"
)

// slowRestore is a datapath whose dump of the service maps (the restore's
// re-adoption step) waits until released: a restore that takes as long as
// one of 30,000 stored Services.
type slowRestore struct {
	*fakeDatapath
	release chan struct{}
	once    sync.Once
}

func (s *slowRestore) DumpServices() (*service.Update, error) {
	<-s.release
	return s.fakeDatapath.DumpServices()
}

func (s *slowRestore) done() { s.once.Do(func() { close(s.release) }) }

// TestSocketServesWhileControlPlaneRestores: after a restart the agent's
// socket answers Status — not ready, saying the control plane is being
// restored — while the stored Services and policies are restored, and the
// agent gets ready when the restore is done. Before, New restored them
// first and the socket answered nothing for as long (over 20 s at 30,000
// Services: the scale lab's restart timed out).
func TestSocketServesWhileControlPlaneRestores(t *testing.T) {
	fx := newFixture(t)
	dp := &slowRestore{fakeDatapath: newFake(), release: make(chan struct{})}
	t.Cleanup(dp.done)
	started := make(chan *Agent, 1)
	go func() { started <- fx.start(t, dp) }()
	var a *Agent
	select {
	case a = <-started:
	case <-time.After(10 * time.Second):
		dp.done()
		<-started
		t.Fatal("New waited for the control plane's restore: the socket cannot serve until it is done")
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(ctx) }()
	defer func() {
		cancel()
		dp.done()
		if err := <-runErr; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	sock := a.cfg.Socket
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no socket while the control plane restores")
		}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := apiv1.NewAgentClient(conn)
	status := func() *apiv1.StatusResponse {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		defer scancel()
		st, err := c.Status(sctx, &apiv1.StatusRequest{})
		if err != nil {
			t.Fatalf("status while the control plane restores: %v", err)
		}
		return st
	}
	if st := status(); st.Ready || !strings.Contains(st.Reason, "restoring") {
		t.Fatalf("status while restoring: ready %v %q, want not ready, restoring", st.Ready, st.Reason)
	}
	dp.done()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := status()
		if st.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after the restore: %q", st.Reason)
		}
	}
}

// TestControlStatsAnswerWhileBusy: while the control plane is held (a
// kind's full set of 30,000 Services holds it for seconds) ControlStats —
// Status, the metrics — answers with its last counts instead of waiting.
func TestControlStatsAnswerWhileBusy(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), newFake())
	if err := a.UpsertObjects(benchServiceObjects(3)); err != nil {
		t.Fatal(err)
	}
	if s := a.ControlStats(); s.Frontends != 3 {
		t.Fatalf("frontends %d, want 3", s.Frontends)
	}
	a.ctl.mu.Lock()
	got := make(chan ControlStats, 1)
	go func() { got <- a.ControlStats() }()
	select {
	case s := <-got:
		a.ctl.mu.Unlock()
		if s.Frontends != 3 {
			t.Errorf("frontends while busy %d, want the last count 3", s.Frontends)
		}
	case <-time.After(5 * time.Second):
		a.ctl.mu.Unlock()
		<-got
		t.Fatal("ControlStats waited for the busy control plane")
	}
}

// keepsUpdates is a datapath that notes (weakly) the service updates it is
// given.
type keepsUpdates struct {
	*fakeDatapath
	last weak.Pointer[service.Update]
}

func (k *keepsUpdates) ApplyServices(u *service.Update) error {
	k.last = weak.Make(u)
	return k.fakeDatapath.ApplyServices(u)
}

// TestAppliedUpdateNotRetained: once the datapath took a service update
// (the first full set at 30,000 Services: every Maglev table and backend)
// the agent lets go of it; its retry queue's array kept the last one alive.
func TestAppliedUpdateNotRetained(t *testing.T) {
	dp := &keepsUpdates{fakeDatapath: newFake()}
	a := newCtlAgent(t, t.TempDir(), dp)
	if err := a.UpsertObjects(benchServiceObjects(50)); err != nil {
		t.Fatal(err)
	}
	if dp.last.Value() == nil {
		t.Fatal("no service update applied")
	}
	runtime.GC()
	if dp.last.Value() != nil {
		t.Error("the applied service update is still reachable after a GC: the agent retains it")
	}
	runtime.KeepAlive(a) // the agent lives on: what it holds must not hold the update
}
