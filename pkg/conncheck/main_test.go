package conncheck_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

// labLock is pkg/lab's LockPath: the lab is one per machine. As pkg/lab's
// tests do, this package holds it for its whole run when root (only root
// brings labs up).
const labLock = "/tmp/lanekit-lab.lock"

func TestMain(m *testing.M) {
	lock := testutil.LockLab(labLock, "conncheck tests")
	code := m.Run()
	runtime.KeepAlive(lock)
	os.Exit(code)
}
