package bench

import (
	"context"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestMain lets this test binary stand in for `lanekit lab cpu-spin`: the
// spinners run it as `chrt ... taskset ... <self> lab cpu-spin --for D`.
func TestMain(m *testing.M) {
	if os.Getenv("LANEKIT_TEST_SPIN_HELPER") == "1" {
		d, err := time.ParseDuration(os.Args[len(os.Args)-1])
		if err == nil {
			err = Spin(d)
		}
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSpinners(t *testing.T) {
	testutil.RequireTools(t, "chrt", "taskset")
	t.Setenv("LANEKIT_TEST_SPIN_HELPER", "1")
	sp, err := startSpinners(context.Background(), os.Args[0], 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sp.stop()
		}
	})
	if len(sp.procs) != runtime.NumCPU() {
		t.Fatalf("%d spinners for %d CPUs", len(sp.procs), runtime.NumCPU())
	}
	for cpu, p := range sp.procs {
		pid := p.cmd.Process.Pid
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			t.Fatalf("spinner %d: %v", cpu, err)
		}
		if attr.Policy != unix.SCHED_IDLE {
			t.Errorf("spinner %d runs with policy %d, want SCHED_IDLE", cpu, attr.Policy)
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			t.Fatalf("spinner %d: %v", cpu, err)
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			t.Errorf("spinner %d may run on %d CPUs, want only CPU %d", cpu, set.Count(), cpu)
		}
	}
	sp.stop()
	stopped = true
	for cpu, p := range sp.procs {
		if err := syscall.Kill(p.cmd.Process.Pid, 0); err == nil {
			t.Errorf("spinner %d still running after stop", cpu)
		}
	}
}

// A spinner at the normal policy is refused (it would compete with the
// measured tools).
func TestSpinRefusesNormalPolicy(t *testing.T) {
	if err := Spin(time.Millisecond); err == nil {
		t.Error("Spin at SCHED_OTHER: no error")
	}
}
