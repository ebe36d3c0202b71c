package agent

// Hand-over by the source's own backend (KubeVirt live migration). The
// other nodes route a migrating VM's address to the target when the VMI's
// migrationState says completed, which virt-handler writes some 200 ms
// after the target QEMU started the device — for clients on other nodes
// that wait was most of the blackout. The source's backend sees the
// switch-over first: the source QEMU stops the vhost-user device when it
// pauses the guest for the last copy (lanekit_vhost_device_running 1 → 0),
// and starts it again only if the migration fails.
//
// So while a migration away from this node runs (VMIMigrationChanged,
// source, running, with the target node's address), the agent polls the
// source VM's backend; when the running device stops it hands the address
// over: the VM leaves the datapath and its address is routed to the target
// node (supersede, with a generation above the VM's own), kept there by the
// claims' syncs (the VM's record says where: handovers) until the cluster's
// claim (the completed migration's) replaces it or the VM goes — also
// across a restart of the agent. If the device runs again (the
// source QEMU resumed the guest: the migration failed or was cancelled) or
// the migration state says failed, the node takes the address back
// (reclaimHandover).
//
// Trust: the VMM on the source drives what its backend reports; stopping
// early moves only its own VM's address to the node KubeVirt chose as the
// migration's target (from the VMI's status, written by KubeVirt's own
// components), for as long as that migration is not over.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/kubevirt"
	"github.com/lanekit/lanekit/pkg/store"
)

// ActivatedByReclaim marks a VM that took its address back after handing
// it over (its device ran again, or the migration failed).
const ActivatedByReclaim = "reclaim"

// backendRunningMetric is 1 while the backend's device runs (lanekit-vhost
// exports it since the hand-over; older backends do not: no hand-over).
const backendRunningMetric = "lanekit_vhost_device_running"

// sourceWatch is a running hand-over watch of one VM.
type sourceWatch struct {
	migration string // the migration's UID
	target    EndpointRoute
	cancel    context.CancelFunc
}

// watchSource follows a migration where this node is the source: while it
// runs, the source VM's backend is polled for the device's stop; when it
// failed, a handed-over VM takes its address back; when it completed or
// the VM has no backend the agent runs, nothing is watched.
func (a *Agent) watchSource(m VMIMigration) {
	switch m.Phase() {
	case kubevirt.MigrationFailed:
		a.stopSourceWatch(m.VM, "")
		if err := a.reclaimHandover(m.VM, "the migration failed"); err != nil && !errors.Is(err, ErrNotFound) {
			a.log.Warn("vm hand-over: take the address back", "vm", m.VM, "err", err)
		}
		return
	case kubevirt.MigrationCompleted:
		a.stopSourceWatch(m.VM, "")
		return
	case kubevirt.MigrationRunning:
	default:
		return
	}
	if !m.TargetVia.IsValid() || !m.TargetVia.Is4() {
		return // the target node's address is not known (yet): the claims move the address
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.lookup(vmKey(m.VM))
	if err != nil || !ok || ep.VM == nil || ep.Pending || ep.VM.Backend == nil || ep.VM.Backend.MetricsSocket == "" {
		return
	}
	state := endpoint.VMActive
	if ep.VM.Migration != nil {
		state = ep.VM.Migration.State
	}
	if state == endpoint.VMIncoming || (state == endpoint.VMMoved && !ep.VM.Migration.HandedOver) {
		return
	}
	if w, ok := a.sourceWatches[m.VM]; ok && w.migration == m.UID {
		return
	}
	if w, ok := a.sourceWatches[m.VM]; ok {
		w.cancel()
	}
	var gen uint64
	if ep.VM.Migration != nil {
		gen = ep.VM.Migration.Generation
	}
	if s := m.Start.UnixNano(); !m.Start.IsZero() && s > 0 && uint64(s) > gen {
		gen = uint64(s)
	} else {
		gen++
	}
	target := EndpointRoute{Via: m.TargetVia, Generation: gen, VM: m.VM, Node: m.TargetNode}
	ctx, cancel := context.WithCancel(context.Background())
	if a.sourceWatches == nil {
		a.sourceWatches = map[string]sourceWatch{}
	}
	a.sourceWatches[m.VM] = sourceWatch{migration: m.UID, target: target, cancel: cancel}
	a.log.Info("vm hand-over: watching the source backend for the switch-over", "vm", m.VM, "migration", m.UID,
		"target_node", m.TargetNode, "target", m.TargetVia)
	go a.awaitSourceStop(ctx, m.VM, m.UID, ep.VM.Backend.MetricsSocket, ep.VM.Backend.UID, state == endpoint.VMMoved)
}

// stopSourceWatch ends VM name's hand-over watch (of migration uid; "": any).
func (a *Agent) stopSourceWatch(name, uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopSourceWatchLocked(name, uid)
}

// stopSourceWatchLocked is stopSourceWatch with mu held.
func (a *Agent) stopSourceWatchLocked(name, uid string) {
	if w, ok := a.sourceWatches[name]; ok && (uid == "" || w.migration == uid) {
		w.cancel()
		delete(a.sourceWatches, name)
	}
}

// awaitSourceStop polls the source backend: a device seen running that
// stops hands the address over; once handed over, a device running again
// takes it back. It ends with ctx, when the VM is gone, or after
// guestPollFor.
func (a *Agent) awaitSourceStop(ctx context.Context, name, uid, metricsSock string, backendUID uint32, handedOver bool) {
	defer a.stopSourceWatch(name, uid)
	deadline := time.Now().Add(guestPollFor)
	var lastRunning time.Time // the last poll that saw the device run
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(guestPollEvery):
		}
		asked := time.Now()
		p, err := readBackendProgress(metricsSock, backendUID)
		if err != nil || !p.runningKnown {
			continue
		}
		running := p.running
		var herr error
		switch {
		case running && handedOver:
			herr = a.reclaimHandover(name, "its device runs again on this node")
			handedOver = herr != nil
			lastRunning = asked // a stop after this hands over again
		case running:
			lastRunning = asked
		case !lastRunning.IsZero() && !handedOver:
			herr = a.handOver(ctx, name, uid, lastRunning, asked)
			handedOver = herr == nil
		}
		if errors.Is(herr, ErrNotFound) {
			return
		}
		if herr != nil {
			a.log.Warn("vm hand-over", "vm", name, "err", herr)
		}
	}
}

// handOver routes VM name's address to the target of its running
// migration (the watch's): the VM leaves the datapath as when a claim
// elsewhere supersedes it, marked handed over.
// lastRunning and stopSeen are the polls around the stop (for the log).
func (a *Agent) handOver(ctx context.Context, name, uid string, lastRunning, stopSeen time.Time) (err error) {
	changed := false
	defer func() {
		if changed {
			a.endpointsChanged()
		}
	}()
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.sourceWatches[name]
	if !ok || w.migration != uid || ctx.Err() != nil {
		return nil // the migration ended meanwhile
	}
	ep, ok, err := a.lookup(vmKey(name))
	if err != nil {
		return err
	}
	if !ok || ep.VM == nil || ep.Pending {
		return fmt.Errorf("hand over vm %s: %w", name, ErrNotFound)
	}
	if m := ep.VM.Migration; m != nil && m.State != endpoint.VMActive {
		return nil // moved or incoming already
	}
	if !ep.IP.Is4() {
		return fmt.Errorf("hand over vm %s: no IPv4 address: %w", name, ErrInvalid)
	}
	// The IPv6 address of a dual-stack VM stays until the cluster's
	// claims (IPv4) move the VM: its datapath entry goes with this.
	r := w.target
	r.Addr = ep.IP
	switched, err := a.supersede(&ep, r, true)
	if !switched.IsZero() {
		changed = true
	}
	if err != nil {
		return err
	}
	a.log.Info("vm handed over: its backend's device stopped, the address goes to the migration's target", "vm", name,
		"ip", ep.IP, "target_node", w.target.Node, "via", w.target.Via, "generation", w.target.Generation,
		"last_running", lastRunning.UTC(), "stop_seen", stopSeen.UTC(), "switched", switched.UTC(), "took", time.Since(stopSeen))
	return nil
}

// handovers are the claims of the VMs among eps that this node handed
// over (moved, handedOver): each VM's IPv4 address routed to the node its
// record names, at the hand-over's generation.
func handovers(eps []endpoint.Endpoint) []EndpointRoute {
	var out []EndpointRoute
	for _, ep := range eps {
		if ep.Pending || ep.VM == nil || ep.VM.Migration == nil || !ep.IP.IsValid() || !ep.IP.Is4() {
			continue
		}
		m := ep.VM.Migration
		via, err := netip.ParseAddr(m.MovedTo)
		if m.State != endpoint.VMMoved || !m.HandedOver || err != nil || !via.Is4() {
			continue
		}
		out = append(out, EndpointRoute{Addr: ep.IP, Via: via, Generation: m.HandOverGeneration, VM: ep.VM.Name, Node: m.MovedToNode})
	}
	return out
}

// reclaimHandover takes VM name's handed-over address back: datapath
// entry, /32 route to its host end, forwarding, its addresses claimed
// again. A VM not handed over is left alone (ErrNotFound when unknown).
func (a *Agent) reclaimHandover(name, why string) error {
	changed := false
	defer func() {
		if changed {
			a.endpointsChanged()
		}
	}()
	a.mu.Lock()
	defer a.mu.Unlock()
	key := vmKey(name)
	ep, ok, err := a.lookup(key)
	if err != nil {
		return err
	}
	if !ok || ep.VM == nil || ep.Pending {
		return fmt.Errorf("reclaim vm %s: %w", name, ErrNotFound)
	}
	m := ep.VM.Migration
	if m == nil || m.State != endpoint.VMMoved || !m.HandedOver {
		return nil
	}
	dpEp, err := a.dpEndpoint(&ep)
	if err != nil {
		return fmt.Errorf("reclaim vm %s: %w", name, err)
	}
	for _, addr := range addrsOf(&ep) {
		if err := a.claims().drop(addr); err != nil {
			return fmt.Errorf("reclaim vm %s: %w", name, err)
		}
	}
	if err := a.deliverLocally(dpEp, &ep); err != nil {
		return fmt.Errorf("reclaim vm %s: %w", name, err)
	}
	changed = true
	storeKey := ep.StoreKey()
	m.State, m.MovedTo, m.HandedOver, m.HandOverGeneration, m.MovedToNode = endpoint.VMActive, "", false, 0, ""
	m.Activated, m.ActivatedBy = time.Now().UTC(), ActivatedByReclaim
	err = a.st.Update(func(tx *store.Tx) error {
		for _, addr := range addrsOf(&ep) {
			if err := a.claimAddrTx(tx, storeKey, name, addr); err != nil {
				return err
			}
		}
		return tx.Put(store.Endpoints, []byte(storeKey), ep)
	})
	if err != nil {
		return fmt.Errorf("reclaim vm %s: %w", name, err)
	}
	a.log.Info("vm reclaimed: the node takes its handed-over address back", "vm", name, "ip", ep.IP, "why", why)
	return nil
}
