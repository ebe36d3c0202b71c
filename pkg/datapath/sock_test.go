package datapath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnsureCgroup2Refuses: cgroup2 is never mounted over a directory that
// holds something (a cgroup v1 tree, a populated directory).
func TestEnsureCgroup2Refuses(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := EnsureCgroup2(dir)
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("EnsureCgroup2 on a populated dir = %v, want a refusal", err)
	}
}
