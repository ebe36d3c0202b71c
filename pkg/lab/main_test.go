package lab

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/lanekit/lanekit/internal/socktest"
	"github.com/lanekit/lanekit/internal/testutil"
)

// LockPath serialises the users of the global lab (its namespaces, daemons
// and /run/lanekit/lab are one per machine): a run of this package's tests
// takes it the first time a test touches the lab (beforeLab: a lab command,
// its state, its namespaces; lockLab in the tests that drive the lanekit CLI)
// and holds it to the end, so two checkouts running make test, or a
// developer's `go test ./pkg/lab` beside one, wait for each other instead of
// tearing down each other's lab, while tests that only compute never wait.
// Hand-run `lanekit lab ...` commands should take it too: `flock
// /tmp/lanekit-lab.lock lanekit lab up`.
const LockPath = "/tmp/lanekit-lab.lock"

var (
	labLockOnce sync.Once
	labLock     *os.File
)

// lockLab takes the lab lock for the rest of the run (once; root only).
func lockLab() {
	labLockOnce.Do(func() { labLock = testutil.LockLab(LockPath, "lab tests") })
}

func TestMain(m *testing.M) {
	// The socket-LB test client re-executes this binary: it runs and exits
	// here, before any lock.
	socktest.MaybeClient()
	beforeLab = lockLab
	code := m.Run()
	testutil.RemoveGoBuilds()
	runtime.KeepAlive(labLock)
	os.Exit(code)
}

// CLIForTests returns this tree's lanekit CLI in a directory of t's,
// built once per test run (testutil.GoBuild: a build links for ~10 s; the
// lab tests that drive the CLI, in this package and in lab_test, share it).
func CLIForTests(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	testutil.GoBuild(t, repoRoot(t), dir, nil, []string{"./cmd/lanekit"})
	return filepath.Join(dir, "lanekit")
}

// LockForTests is lockLab for this package's external tests (lab_test).
func LockForTests() { lockLab() }
