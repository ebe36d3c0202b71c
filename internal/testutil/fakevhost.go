package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakeVhost stands in for lanekit-vhost where a test needs the agent's
// backend supervision, not the backend: it listens on --socket (removing a
// stale file first, as lanekit-vhost does) until SIGTERM.
const fakeVhost = `#!/usr/bin/python3
import os, signal, socket, sys
a = sys.argv[1:]
path = a[a.index("--socket") + 1]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(1)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
`

// FakeVhost writes the fake backend and returns its path; every process of
// it is killed when the test ends (backends outlive their agent by design).
// Needs /usr/bin/python3 (make deps installs it; MissingDep otherwise).
func FakeVhost(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		MissingDep(t, "the fake vhost-user backend needs /usr/bin/python3")
	}
	bin := filepath.Join(t.TempDir(), "fake-vhost")
	if err := os.WriteFile(bin, []byte(fakeVhost), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("pkill", "-KILL", "-f", bin).Run() })
	return bin
}
