package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/lanekit/lanekit/pkg/agent"
)

// buildAgent builds this command with extra go build arguments.
func buildAgent(t *testing.T, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "lanekitd")
	cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", out, ".")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, b)
	}
	return out
}

func contains(t *testing.T, bin, s string) bool {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte(s))
}

// TestShippedAgentHasNoCrashHook: the lanekitd that make build ships
// ($LANEKIT_BIN/lanekitd, else a default build) does not contain the
// crash-injection hook's environment variable; a lanekit_testhooks build
// does (so the search would see it).
func TestShippedAgentHasNoCrashHook(t *testing.T) {
	bin := filepath.Join(os.Getenv("LANEKIT_BIN"), "lanekitd")
	if os.Getenv("LANEKIT_BIN") == "" {
		bin = buildAgent(t)
	}
	if contains(t, bin, agent.CrashEnv) {
		t.Errorf("%s contains %s: the test crash hook is compiled into the shipped agent", bin, agent.CrashEnv)
	}
	if testing.Short() {
		t.Skip("skipping the lanekit_testhooks control build in -short mode")
	}
	if hooked := buildAgent(t, "-tags", "lanekit_testhooks"); !contains(t, hooked, agent.CrashEnv) {
		t.Errorf("a lanekit_testhooks build does not contain %s: the search cannot see the hook", agent.CrashEnv)
	}
}
