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

// TestKubeFlags: the pod CIDR comes from --pod-cidr or from the Node named by
// --node-name; --kubeconfig alone names no node.
func TestKubeFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--pod-cidr is required (or --node-name"},
		{[]string{"--kubeconfig", "/nonexistent"}, "--kubeconfig needs --node-name"},
		{[]string{"--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubernetes client config"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lanekitd %v = %v, want %q", tc.args, err, tc.want)
		}
	}
}
