package agent

import (
	"net/netip"

	"github.com/lanekit/lanekit/pkg/endpoint"
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
	// TargetVia is the target node's IPv4 InternalIP (invalid: unknown),
	// where the source hands the address over at the switch-over.
	TargetVia netip.Addr
}

// VMIMigrationChanged applies a VMI's migration state on this node: the
// target activates the VM's incoming endpoint once the migration completed
// (the guest runs here) and removes it when it failed (vmmigrate.go). A
// target without an incoming endpoint (a launcher pod whose CNI ADD made
// an ordinary VM attachment) is only logged: its VM keeps the address the
// ADD gave it. The source acts on the target's claim of the address
// (SyncEndpointRoutes), not on the state.
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
	if m.Role == kubevirt.RoleSource {
		a.watchSource(m)
	}
	if m.Role == kubevirt.RoleTarget && (m.Phase() == kubevirt.MigrationCompleted || m.Phase() == kubevirt.MigrationFailed) {
		if a.hasIncomingVM(m.VM) {
			if _, err := a.VMMigrationEvent(m.VM, string(m.Role), string(m.Phase())); err != nil {
				a.log.Error("VMI live migration", append(attrs, "err", err)...)
			}
			return
		}
		if m.Phase() == kubevirt.MigrationCompleted {
			a.log.Warn("VMI live migration: no incoming endpoint for the VM on this node; its address does not move", attrs...)
			return
		}
	}
	a.log.Info("VMI live migration", attrs...)
}

// hasIncomingVM reports whether VM name has an incoming endpoint here.
func (a *Agent) hasIncomingVM(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.lookup(vmKey(name))
	return err == nil && ok && ep.VM != nil && ep.VM.Migration != nil && ep.VM.Migration.State == endpoint.VMIncoming
}
