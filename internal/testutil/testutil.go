// Package testutil holds skip helpers and namespace fixtures shared by tests.
package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// RequireRoot skips t unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, BPF, netlink)")
	}
}

// RequireBPFFS skips t unless a BPF filesystem is mounted at /sys/fs/bpf.
func RequireBPFFS(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		t.Skip("skipping: /sys/fs/bpf missing (mount -t bpf bpf /sys/fs/bpf)")
	}
}

// RequireBinary skips t unless name is on PATH.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("skipping: %s not installed (run make deps)", name)
	}
	return p
}
