package nsexec

import (
	"os"
	"strconv"
	"syscall"
)

// CloseInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own files that way, but descriptors inherited from the caller
// are not: under `flock LOCK lanekit lab up` the lock's descriptor would pass
// to every daemon (agents, API server, backends) that outlives the command,
// and the lock would stay held until they stop. Call it before starting one.
func CloseInheritedOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
