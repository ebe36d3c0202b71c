package lab

import (
	"os"
	"os/exec"
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
	if cliDir != "" {
		os.RemoveAll(cliDir)
	}
	runtime.KeepAlive(labLock)
	os.Exit(code)
}

var (
	cliOnce sync.Once
	cliDir  string
	cliPath string
	cliErr  error
)

// CLIForTests returns this tree's lanekit CLI, built once per test run (a
// build links for ~10 s; the lab tests that drive the CLI, in this package
// and in lab_test, share it) into a directory TestMain removes.
func CLIForTests(t testing.TB) string {
	t.Helper()
	cliOnce.Do(func() {
		root, err := os.Getwd()
		if err != nil {
			cliErr = err
			return
		}
		for ; ; root = filepath.Dir(root) {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			if root == filepath.Dir(root) {
				cliErr = os.ErrNotExist
				return
			}
		}
		if cliDir, cliErr = os.MkdirTemp("", "lanekit-lab-cli-"); cliErr != nil {
			return
		}
		path := filepath.Join(cliDir, "lanekit")
		build := exec.Command("go", "build", "-o", path, "./cmd/lanekit")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			cliErr = &buildError{err: err, out: out}
			return
		}
		cliPath = path
	})
	if cliErr != nil {
		t.Fatalf("build lanekit: %v", cliErr)
	}
	return cliPath
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

// LockForTests is lockLab for this package's external tests (lab_test).
func LockForTests() { lockLab() }
