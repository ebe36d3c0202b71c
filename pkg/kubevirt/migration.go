package kubevirt

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// migrationStateJSON is the part of a VMI's status.migrationState
// (kubevirt.io/api core/v1 VirtualMachineInstanceMigrationState) lanekit
// reads; JSON names as in the API.
type migrationStateJSON struct {
	MigrationUID   string       `json:"migrationUid"`
	SourceNode     string       `json:"sourceNode"`
	SourcePod      string       `json:"sourcePod"`
	TargetNode     string       `json:"targetNode"`
	TargetPod      string       `json:"targetPod"`
	StartTimestamp *metav1.Time `json:"startTimestamp"`
	EndTimestamp   *metav1.Time `json:"endTimestamp"`
	Completed      bool         `json:"completed"`
	Failed         bool         `json:"failed"`
	AbortRequested bool         `json:"abortRequested"`
	FailureReason  string       `json:"failureReason"`
}

// Migration is a VMI's live migration as virt-controller and virt-handler
// report it in status.migrationState: the typed state the binding sidecar
// and the agent act on.
type Migration struct {
	UID                   string // the VirtualMachineInstanceMigration's UID
	SourceNode, SourcePod string
	TargetNode, TargetPod string
	Start, End            time.Time // zero when not reported yet
	Completed, Failed     bool
	AbortRequested        bool
	FailureReason         string
}

// MigrationPhase is where a migration stands, from lanekit's point of view.
type MigrationPhase string

const (
	// MigrationScheduling: requested, no target node or pod chosen yet.
	MigrationScheduling MigrationPhase = "scheduling"
	// MigrationRunning: a target pod exists on a target node; the guest
	// still runs on the source (or is switching over).
	MigrationRunning MigrationPhase = "running"
	// MigrationCompleted: the guest runs on the target node.
	MigrationCompleted MigrationPhase = "completed"
	// MigrationFailed: the guest stays on (or is back on) the source node.
	MigrationFailed MigrationPhase = "failed"
)

// Phase is the migration's phase.
func (m *Migration) Phase() MigrationPhase {
	switch {
	case m.Failed:
		return MigrationFailed
	case m.Completed:
		return MigrationCompleted
	case m.TargetNode == "" || m.TargetPod == "":
		return MigrationScheduling
	}
	return MigrationRunning
}

// InProgress is true until the migration completed or failed.
func (m *Migration) InProgress() bool {
	p := m.Phase()
	return p == MigrationScheduling || p == MigrationRunning
}

// MigrationRole is a node's part in a migration.
type MigrationRole string

const (
	RoleNone   MigrationRole = ""
	RoleSource MigrationRole = "source"
	RoleTarget MigrationRole = "target"
)

// Role is node's part in the migration.
func (m *Migration) Role(node string) MigrationRole {
	switch {
	case node == "":
		return RoleNone
	case node == m.TargetNode:
		return RoleTarget
	case node == m.SourceNode:
		return RoleSource
	}
	return RoleNone
}

func (m *Migration) String() string {
	s := fmt.Sprintf("migration %s %s→%s (%s)", m.UID, m.SourceNode, m.TargetNode, m.Phase())
	if m.FailureReason != "" {
		s += ": " + m.FailureReason
	}
	return s
}

// Migration returns the VMI's migration (nil when it has never been
// migrated). A state that contradicts itself is an error, not a guess.
func (v *VMI) Migration() (*Migration, error) {
	j := v.Status.MigrationState
	if j == nil {
		return nil, nil
	}
	m := &Migration{
		UID: j.MigrationUID, SourceNode: j.SourceNode, SourcePod: j.SourcePod, TargetNode: j.TargetNode, TargetPod: j.TargetPod,
		Completed: j.Completed, Failed: j.Failed, AbortRequested: j.AbortRequested, FailureReason: j.FailureReason,
	}
	if j.StartTimestamp != nil {
		m.Start = j.StartTimestamp.Time
	}
	if j.EndTimestamp != nil {
		m.End = j.EndTimestamp.Time
	}
	name := v.Metadata.Namespace + "/" + v.Metadata.Name
	if m.Completed && m.Failed {
		return nil, fmt.Errorf("vmi %s: migrationState %s is both completed and failed", name, m.UID)
	}
	if m.TargetNode != "" && m.TargetNode == m.SourceNode {
		return nil, fmt.Errorf("vmi %s: migrationState %s has source and target node %q", name, m.UID, m.TargetNode)
	}
	if !m.Start.IsZero() && !m.End.IsZero() && m.End.Before(m.Start) {
		return nil, fmt.Errorf("vmi %s: migrationState %s ends (%s) before it starts (%s)", name, m.UID,
			m.End.UTC().Format(time.RFC3339), m.Start.UTC().Format(time.RFC3339))
	}
	return m, nil
}

// GuestMAC is the MAC the running guest reports for a VMI interface
// (status.interfaces[].mac), "" when the VMI has not reported one.
func (v *VMI) GuestMAC(iface string) string {
	for _, i := range v.Status.Interfaces {
		if i.Name == iface {
			return i.MAC
		}
	}
	return ""
}
