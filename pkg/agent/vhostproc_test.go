package agent

import (
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// TestDetachWhileRestartingLeavesBackendRunning: the agent closes (detaching
// its backends) just as the supervisor has started a crashed backend again:
// the new process keeps running for the next agent to adopt, as a backend
// that was running all along does — killing it would cut the VM's network
// on an agent restart.
func TestDetachWhileRestartingLeavesBackendRunning(t *testing.T) {
	dir := t.TempDir()
	p := &backendProc{name: "vm", argv: []string{"/bin/sleep", "30"},
		logPath: filepath.Join(dir, "vm.log"), pidPath: filepath.Join(dir, "vm.pid"),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), wake: make(chan struct{}), done: make(chan struct{})}
	respawned := make(chan int, 1)
	ours := p
	backendRespawned = func(p *backendProc) {
		if p != ours { // another test's supervisor, still running
			return
		}
		// What detachBackends does, at the worst moment.
		p.mu.Lock()
		p.stopping, p.detached = true, true
		close(p.wake)
		pid := p.pid
		p.mu.Unlock()
		respawned <- pid
	}
	t.Cleanup(func() { backendRespawned = nil })
	first := exec.Command("/bin/true") // the backend that crashes
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	go p.run(first, -1)
	var pid int
	select {
	case pid = <-respawned:
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor did not restart the crashed backend")
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	time.Sleep(300 * time.Millisecond)
	if !nsexec.Alive(pid) {
		t.Fatal("the backend restarted as the agent detached was killed: the next agent has nothing to adopt")
	}
	if got := nsexec.ReadPIDFile(p.pidPath); got != pid {
		t.Fatalf("pid file says %d, the backend is %d", got, pid)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the supervisor did not end with its detached backend")
	}
}
