package agent

// Activation by the target's own backend. An incoming VM endpoint (the
// target of a live migration) is activated when the migration state says
// the guest runs here — for KubeVirt the VMI's migrationState, which
// virt-handler writes some time after QEMU switched over. The target's
// backend sees the switch first, twice:
//   - device start: the target QEMU starts its vhost-user device (sends the
//     guest's features, memory table and rings) only when the VM runs there
//     — at the end of the migration, never during it; lanekit-vhost then
//     reports the acked features (lanekit_vhost_virtio_features{set="acked"});
//   - guest frames: lanekit-vhost offers VIRTIO_NET_F_GUEST_ANNOUNCE, so
//     after the switch QEMU asks the guest to announce itself and the guest's
//     announcement (gratuitous ARP, IPv6 neighbour advertisements) leaves
//     through the target's backend — 50 ms (QEMU's first announce) or more
//     after the device start.
//
// The agent polls an incoming endpoint's backend and activates the endpoint
// on the first of them.
//
// Trust: the backend (and the VMM that drives it) could claim either early;
// what it can gain is its own VM's address on this node a little sooner —
// the target launcher pod was made for this VM's migration, and the source
// gives the address up only when the claims say so.

import (
	"context"
	"errors"
	"time"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

// How an incoming endpoint's backend showed that the guest runs on this
// node: its VMM started the device (ActivatedByDeviceStart), or it moved a
// frame out of the guest (ActivatedByGuestFrames).
const (
	ActivatedByDeviceStart = "device-start"
	ActivatedByGuestFrames = "guest-frames"
)

var (
	// guestPollEvery is how often an incoming endpoint's backend is asked.
	guestPollEvery = 10 * time.Millisecond
	// guestPollFor bounds the watch; the migration state still activates.
	guestPollFor = 30 * time.Minute
)

// backendTxMetric counts the frames a backend moved out of the guest;
// backendFeaturesMetric has one sample per virtio feature bit offered and
// acked.
const (
	backendTxMetric       = "lanekit_vhost_tx_packets"
	backendFeaturesMetric = "lanekit_vhost_virtio_features"
)

// watchGuestIfIncoming starts awaitGuest for ep when it is an incoming VM
// endpoint whose backend the agent runs (it serves metrics).
func (a *Agent) watchGuestIfIncoming(ep *endpoint.Endpoint) {
	if ep.VM == nil || ep.VM.Backend == nil || ep.VM.Backend.MetricsSocket == "" || ep.VM.Migration == nil ||
		ep.VM.Migration.State != endpoint.VMIncoming {
		return
	}
	go a.awaitGuest(ep.VM.Name, ep.VM.Backend.MetricsSocket, ep.VM.Backend.UID)
}

// awaitGuest polls the backend of incoming VM name until its device started
// or it moved a frame out of the guest, then activates the endpoint; it
// returns when the endpoint is no longer incoming (activated otherwise,
// removed) or after guestPollFor.
func (a *Agent) awaitGuest(name, metricsSock string, uid uint32) {
	deadline := time.Now().Add(guestPollFor)
	for time.Now().Before(deadline) {
		time.Sleep(guestPollEvery)
		if !a.vmIncoming(name) {
			return
		}
		p, err := readBackendProgress(metricsSock, uid)
		if err != nil || p.by() == "" {
			continue
		}
		if _, err := a.ActivateVM(name, p.by()); err != nil && !errors.Is(err, ErrNotFound) {
			a.log.Warn("activate vm on its backend's start", "vm", name, "by", p.by(), "err", err)
		}
		return
	}
}

// vmIncoming says whether VM name exists and is incoming.
func (a *Agent) vmIncoming(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.lookup(vmKey(name))
	return err == nil && ok && ep.VM != nil && ep.VM.Migration != nil && ep.VM.Migration.State == endpoint.VMIncoming
}

// backendProgress is what a VM's backend reports: the virtio feature bits
// the frontend acked (none until it starts the device), the frames it moved
// out of the guest, over all queues, and whether the device runs
// (runningKnown false: the backend does not export it; vmhandover.go).
type backendProgress struct {
	ackedBits             int
	txPackets             uint64
	running, runningKnown bool
}

// by is the activation the progress allows ("": none yet).
func (p backendProgress) by() string {
	switch {
	case p.ackedBits > 0:
		return ActivatedByDeviceStart
	case p.txPackets > 0:
		return ActivatedByGuestFrames
	}
	return ""
}

// readBackendProgress scrapes the backend at sock (run as uid), as an
// incoming endpoint's watch and a migration source's hand-over watch do.
func readBackendProgress(sock string, uid uint32) (backendProgress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fams, err := ScrapeBackend(ctx, sock, uid)
	if err != nil {
		return backendProgress{}, err
	}
	var p backendProgress
	for _, name := range []string{backendTxMetric, backendTxMetric + "_total"} {
		for _, m := range fams[name].GetMetric() {
			if v := m.GetCounter().GetValue() + m.GetUntyped().GetValue(); v > 0 {
				p.txPackets += uint64(v)
			}
		}
	}
	for _, m := range fams[backendRunningMetric].GetMetric() {
		p.runningKnown = true
		p.running = p.running || m.GetGauge().GetValue()+m.GetUntyped().GetValue() > 0
	}
	for _, m := range fams[backendFeaturesMetric].GetMetric() {
		if m.GetGauge().GetValue()+m.GetUntyped().GetValue() <= 0 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "set" && l.GetValue() == "acked" {
				p.ackedBits++
			}
		}
	}
	return p, nil
}
