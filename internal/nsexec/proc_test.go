package nsexec

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWaitSocket(t *testing.T) {
	dir := t.TempDir()
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	sock := filepath.Join(dir, "s.sock")
	go func() {
		time.Sleep(100 * time.Millisecond)
		if l, err := net.Listen("unix", sock); err == nil {
			t.Cleanup(func() { l.Close() })
		}
	}()
	if err := WaitSocket(sock, 5*time.Second, sleeper.Process.Pid); err != nil {
		t.Fatalf("socket that appears: %v", err)
	}
	if err := WaitSocket(filepath.Join(dir, "never"), 200*time.Millisecond, sleeper.Process.Pid); err == nil || !strings.Contains(err.Error(), "not listening after") {
		t.Fatalf("socket that never appears: %v", err)
	}
	// A daemon that exits first: reported at once (a zombie is not alive).
	quitter := exec.Command("true")
	if err := quitter.Start(); err != nil {
		t.Fatal(err)
	}
	defer quitter.Wait()
	start := time.Now()
	if err := WaitSocket(filepath.Join(dir, "never"), 5*time.Second, quitter.Process.Pid); err == nil || !strings.Contains(err.Error(), "exited before listening") {
		t.Fatalf("exited daemon: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("exit noticed after %s", time.Since(start))
	}
}

func TestTerminate(t *testing.T) {
	// Ignores SIGTERM: SIGKILL after the grace period.
	stubborn := exec.Command("sh", "-c", "trap '' TERM; while :; do sleep 1; done")
	if err := stubborn.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = stubborn.Wait(); close(done) }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	Terminate(stubborn.Process.Pid, 300*time.Millisecond)
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("a process ignoring SIGTERM survived Terminate")
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("SIGKILL before the grace period ended (%s)", d)
	}
	Terminate(0, time.Second) // nothing to do
}
