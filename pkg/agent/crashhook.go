//go:build lanekit_testhooks

package agent

import (
	"os"
	"syscall"
)

// crashHook kills the process when $LANEKIT_TEST_CRASH_AT names step
// (test builds only: -tags lanekit_testhooks).
func crashHook(step string) {
	if want := os.Getenv(CrashEnv); want != "" && want == step {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
