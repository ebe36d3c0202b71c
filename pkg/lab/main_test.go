package lab

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/socktest"
)

// LockPath serialises the users of the global lab (its namespaces, daemons
// and /run/lanekit/lab are one per machine): every run of this package's
// tests holds it from start to end, so two checkouts running make test, or a
// developer's `go test ./pkg/lab` beside one, wait for each other instead of
// tearing down each other's lab. Hand-run `lanekit lab ...` commands should
// take it too: `flock /tmp/lanekit-lab.lock lanekit lab up`.
const LockPath = "/tmp/lanekit-lab.lock"

func TestMain(m *testing.M) {
	// The socket-LB test client re-executes this binary: it runs and exits
	// here, before the lock its parent holds.
	socktest.MaybeClient()
	var lock *os.File
	if os.Geteuid() == 0 {
		// O_CLOEXEC (Go's default): the lab's daemons do not inherit it.
		f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab tests: open lab lock:", err)
			os.Exit(1)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			start := time.Now()
			fmt.Fprintf(os.Stderr, "lab tests: waiting for %s (another lab user runs)\n", LockPath)
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
				fmt.Fprintln(os.Stderr, "lab tests: lab lock:", err)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "lab tests: got the lab lock after %s\n", time.Since(start).Round(time.Second))
		}
		// Held until the process exits: f stays reachable (KeepAlive
		// below), else the garbage collector's finalizer closes the
		// descriptor mid-run and drops the lock under the tests.
		lock = f
	}
	code := m.Run()
	runtime.KeepAlive(lock)
	os.Exit(code)
}
