package main

import (
	"strings"
	"testing"
)

// TestNoMemoryDatapathFlag: the in-memory datapath is a test seam reached
// through the Go API only; the daemon has no flag that selects it.
func TestNoMemoryDatapathFlag(t *testing.T) {
	err := run([]string{"--datapath", "none", "--pod-cidr", "10.9.0.0/24"})
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -datapath") {
		t.Fatalf("--datapath none = %v, want an unknown flag", err)
	}
}
