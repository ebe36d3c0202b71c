package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/kubevirt"
	"github.com/lanekit/lanekit/pkg/store"
)

// A target node without an incoming endpoint for the VM (its launcher's CNI
// ADD made an ordinary attachment) must say that the address does not move
// when the migration completes, not log it as handled.
func TestVMIMigrationChangedWithoutIncomingEndpoint(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var buf bytes.Buffer
	a := &Agent{log: slog.New(slog.NewTextHandler(&buf, nil)), st: st}
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
	if !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "phase=running") {
		t.Errorf("running: %s", lines[0])
	}
	if !strings.Contains(lines[1], "level=WARN") || !strings.Contains(lines[1], "its address does not move") ||
		!strings.Contains(lines[1], "phase=completed") || !strings.Contains(lines[1], "role=target") || !strings.Contains(lines[1], "vmi=default/vm1") {
		t.Errorf("completed: %s", lines[1])
	}
	if !strings.Contains(lines[2], "phase=failed") || !strings.Contains(lines[2], `failure="target pod gone"`) {
		t.Errorf("failed migration: %s", lines[2])
	}
}
