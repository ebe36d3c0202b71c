package agent

import (
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// VMIMigration is a KubeVirt live migration this node takes part in, as
// the Kubernetes source follows it (the VMI's status.migrationState): sent
// once per change of the typed state, for the source and the target node.
type VMIMigration struct {
	Namespace, Name string // the VMI
	VM              string // the agent's VM name for it (endpoint.VMName)
	Role            kubevirt.MigrationRole
	kubevirt.Migration
}

// VMIMigrationChanged is the seam the address move (issue 27 item 2) fills
// in: the target creates the VM endpoint with the VM's IP and MAC before
// the switch-over and claims the address once the migration completes, the
// source gives it up. None of that exists yet: the agent only logs what it
// would act on, saying so, and changes nothing in the datapath.
func (a *Agent) VMIMigrationChanged(m VMIMigration) {
	attrs := []any{"vmi", m.Namespace + "/" + m.Name, "vm", m.VM, "role", m.Role, "phase", m.Phase(),
		"migration", m.UID, "source_node", m.SourceNode, "target_node", m.TargetNode, "target_pod", m.TargetPod}
	if !m.Start.IsZero() {
		attrs = append(attrs, "start", m.Start)
	}
	if !m.End.IsZero() {
		attrs = append(attrs, "end", m.End)
	}
	if m.FailureReason != "" {
		attrs = append(attrs, "failure", m.FailureReason)
	}
	switch m.Phase() {
	case kubevirt.MigrationRunning, kubevirt.MigrationCompleted:
		a.log.Warn("VMI live migration: address move not implemented; the VM's lanekit address stays routed to the source node", attrs...)
	default:
		a.log.Info("VMI live migration", attrs...)
	}
}
