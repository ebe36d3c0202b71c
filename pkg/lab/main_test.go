package lab

import (
	"os"
	"runtime"
	"testing"

	"github.com/lanekit/lanekit/internal/socktest"
	"github.com/lanekit/lanekit/internal/testutil"
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
	lock := testutil.LockLab(LockPath, "lab tests")
	code := m.Run()
	runtime.KeepAlive(lock)
	os.Exit(code)
}
