package nsexec

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Alive reports whether pid is a live process (not a zombie).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state is the field after the ")" that closes the command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// ReadPIDFile reads a pid file: 0 when missing or malformed.
func ReadPIDFile(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// LogTail returns the last n lines of a log joined by " | ", for error
// messages; "(no log)" when it cannot be read.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Terminate sends pid SIGTERM, waits up to grace for it to end, then sends
// SIGKILL and waits up to 2 s more. A pid that does not run is left alone.
func Terminate(pid int, grace time.Duration) {
	if !Alive(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !Alive(pid) {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(2 * time.Second); Alive(pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitSocket waits up to timeout for path to be a unix socket while pid
// runs (a daemon that listens once it is ready).
func WaitSocket(path string, timeout time.Duration, pid int) error {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		if !Alive(pid) {
			return fmt.Errorf("pid %d exited before listening on %s", pid, path)
		}
	}
	return fmt.Errorf("%s is not listening after %s", path, timeout)
}
