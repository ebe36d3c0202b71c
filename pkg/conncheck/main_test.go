package conncheck_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// labLock is pkg/lab's LockPath: the lab is one per machine. As pkg/lab's
// tests do, this package holds it for its whole run when root (only root
// brings labs up).
const labLock = "/tmp/lanekit-lab.lock"

func TestMain(m *testing.M) {
	var lock *os.File
	if os.Geteuid() == 0 {
		f, err := os.OpenFile(labLock, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conncheck tests: open lab lock:", err)
			os.Exit(1)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			start := time.Now()
			fmt.Fprintf(os.Stderr, "conncheck tests: waiting for %s (another lab user runs)\n", labLock)
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
				fmt.Fprintln(os.Stderr, "conncheck tests: lab lock:", err)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "conncheck tests: got the lab lock after %s\n", time.Since(start).Round(time.Second))
		}
		lock = f
	}
	code := m.Run()
	runtime.KeepAlive(lock)
	os.Exit(code)
}
