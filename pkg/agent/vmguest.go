package agent

// Activation by the guest's own frames. An incoming VM endpoint (the target
// of a live migration) is activated when the migration state says the guest
// runs here — for KubeVirt the VMI's migrationState, which virt-handler
// writes some time after QEMU switched over. The target's backend sees the
// switch first: lanekit-vhost offers VIRTIO_NET_F_GUEST_ANNOUNCE, so after
// the switch QEMU asks the guest to announce itself and the guest's
// announcement (gratuitous ARP, IPv6 neighbour advertisements) leaves
// through the target's backend. The agent polls an incoming endpoint's
// backend and activates the endpoint on the first frame out of the guest.
//
// Trust: the backend (and the VMM that drives it) could claim a frame early;
// what it can gain is its own VM's address on this node a little sooner —
// the target launcher pod was made for this VM's migration, and the source
// gives the address up only when the claims say so.

import (
	"context"
	"errors"
	"time"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

// ActivatedByGuestFrames: the incoming endpoint's backend moved a frame out
// of the guest, so the guest runs on this node.
const ActivatedByGuestFrames = "guest-frames"

var (
	// guestPollEvery is how often an incoming endpoint's backend is asked.
	guestPollEvery = 10 * time.Millisecond
	// guestPollFor bounds the watch; the migration state still activates.
	guestPollFor = 30 * time.Minute
)

// backendTxMetric counts the frames a backend moved out of the guest.
const backendTxMetric = "lanekit_vhost_tx_packets"

// watchGuestIfIncoming starts awaitGuest for ep when it is an incoming VM
// endpoint whose backend the agent runs (it serves metrics).
func (a *Agent) watchGuestIfIncoming(ep *endpoint.Endpoint) {
	if ep.VM == nil || ep.VM.Backend == nil || ep.VM.Backend.MetricsSocket == "" || ep.VM.Migration == nil ||
		ep.VM.Migration.State != endpoint.VMIncoming {
		return
	}
	go a.awaitGuest(ep.VM.Name, ep.VM.Backend.MetricsSocket, ep.VM.Backend.UID)
}

// awaitGuest polls the backend of incoming VM name until it has moved a frame
// out of the guest, then activates the endpoint; it returns when the
// endpoint is no longer incoming (activated otherwise, removed) or after
// guestPollFor.
func (a *Agent) awaitGuest(name, metricsSock string, uid uint32) {
	deadline := time.Now().Add(guestPollFor)
	for time.Now().Before(deadline) {
		time.Sleep(guestPollEvery)
		if !a.vmIncoming(name) {
			return
		}
		n, err := backendTxPackets(metricsSock, uid)
		if err != nil || n == 0 {
			continue
		}
		if _, err := a.ActivateVM(name, ActivatedByGuestFrames); err != nil && !errors.Is(err, ErrNotFound) {
			a.log.Warn("activate vm on the guest's first frame", "vm", name, "err", err)
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

// backendTxPackets reads the frames the backend at sock (run as uid) moved
// out of the guest, over all queues.
func backendTxPackets(sock string, uid uint32) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fams, err := ScrapeBackend(ctx, sock, uid)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, name := range []string{backendTxMetric, backendTxMetric + "_total"} {
		for _, m := range fams[name].GetMetric() {
			v := m.GetCounter().GetValue() + m.GetUntyped().GetValue()
			if v > 0 {
				n += uint64(v)
			}
		}
	}
	return n, nil
}
