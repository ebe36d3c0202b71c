package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// Until the address move exists the agent must say so for every running or
// completed migration, not log it as if it were handled.
func TestVMIMigrationChangedSaysAddressMoveIsMissing(t *testing.T) {
	var buf bytes.Buffer
	a := &Agent{log: slog.New(slog.NewTextHandler(&buf, nil))}
	m := VMIMigration{Namespace: "default", Name: "vm1", VM: "default.vm1", Role: kubevirt.RoleTarget,
		Migration: kubevirt.Migration{UID: "mig-1", SourceNode: "node-a", TargetNode: "node-b", TargetPod: "p"}}
	a.VMIMigrationChanged(m)
	m.Completed = true
	a.VMIMigrationChanged(m)
	m.Completed, m.Failed, m.FailureReason = false, true, "target pod gone"
	a.VMIMigrationChanged(m)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("log:\n%s", buf.String())
	}
	for i, want := range []string{"phase=running", "phase=completed"} {
		if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], "address move not implemented") ||
			!strings.Contains(lines[i], want) || !strings.Contains(lines[i], "role=target") || !strings.Contains(lines[i], "vmi=default/vm1") {
			t.Errorf("line %d: %s", i, lines[i])
		}
	}
	if !strings.Contains(lines[2], "phase=failed") || !strings.Contains(lines[2], `failure="target pod gone"`) {
		t.Errorf("failed migration: %s", lines[2])
	}
}
