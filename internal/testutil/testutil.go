// Package testutil holds skip helpers and namespace fixtures shared by tests.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// EnvStrict is set by `make test`: what `make deps` provides (tools, a
// mounted bpffs, the built binaries, the Kubernetes test binaries) must be
// there, so a test missing one fails instead of skipping. Outside make test a
// missing prerequisite is a skip that says how to get it.
const EnvStrict = "LANEKIT_TEST_STRICT"

// Strict reports whether EnvStrict is set.
func Strict() bool { return os.Getenv(EnvStrict) != "" }

// MissingDep ends t for a prerequisite that make deps or make build
// provides: it fails under make test (EnvStrict) and skips otherwise.
func MissingDep(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatalf("%s: make deps/make build provide it and make test requires it (%s is set)", msg, EnvStrict)
	}
	t.Skipf("skipping: %s (run make deps, make build)", msg)
}

// RequireRoot skips t unless the test runs as root. make test refuses to
// start as non-root unless asked for the unprivileged subset.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, BPF, netlink)")
	}
}

// RequireBPFFS skips t unless a BPF filesystem is mounted at /sys/fs/bpf
// (make deps mounts it: a failure under make test).
func RequireBPFFS(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		MissingDep(t, "no bpffs at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf)")
	}
}

// RequireBinary returns name's path on PATH; a missing one is MissingDep.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		MissingDep(t, "%s not installed", name)
	}
	return p
}

// RequireTools checks every tool with RequireBinary.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		RequireBinary(t, tool)
	}
}
