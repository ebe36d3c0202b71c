package testutil

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// LockLab takes the global lab's lock at path for a test binary (who names it
// in messages), waiting for another holder, and returns it held: keep the
// file reachable until the process exits (runtime.KeepAlive), or the garbage
// collector's finalizer closes the descriptor mid-run and drops the lock.
// Without root (no lab) it takes nothing and returns nil. O_CLOEXEC (Go's
// default): the lab's daemons do not inherit it. It exits the process when
// the lock cannot be taken.
func LockLab(path, who string) *os.File {
	if os.Geteuid() != 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: open lab lock: %v\n", who, err)
		os.Exit(1)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		start := time.Now()
		fmt.Fprintf(os.Stderr, "%s: waiting for %s (another lab user runs)\n", who, path)
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			fmt.Fprintf(os.Stderr, "%s: lab lock: %v\n", who, err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "%s: got the lab lock after %s\n", who, time.Since(start).Round(time.Second))
	}
	return f
}
