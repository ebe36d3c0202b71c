package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
)

// The node's own addresses in the policy ipcache (the host identity):
// Kubernetes does not let a pod's policy block its node, so a pod under an
// egress default-deny must still answer kubelet's probes, which come from
// whichever address the node's stack picks as source (the uplink's, another
// device's, a secondary one). The agent therefore writes every IPv4 address
// of every interface of the node netns, and keeps the set current:
//
//   - a netlink address subscription (RTNLGRP_IPV4_IFADDR) in the node netns
//     triggers a resync on every change, so a new address is covered before
//     kubelet's next probe, without polling latency;
//   - each resync lists all addresses (not the event's one), so lost, reordered
//     or coalesced events cannot leave the set wrong, and a burst of events
//     costs one map update;
//   - MaintainOnce resyncs too, a backstop for a subscription that failed
//     (socket overrun, ENOBUFS) until it is re-established.
//
// The same set says which hostIPs a pod's hostPort may name (service.Options
// HostAddrs): a resync that changes it translates the hostPorts again.

// hostAddrSetter is a datapath that keeps the node's own addresses for
// policy (*datapath.Loader's SetPolicyHostAddrs).
type hostAddrSetter interface {
	SetPolicyHostAddrs(addrs []netip.Addr) error
}

// hostAddrResubscribe is how long the watcher waits before subscribing again
// after its subscription failed or ended.
const hostAddrResubscribe = time.Second

// listHostAddrs returns every IPv4 and IPv6 address of every interface of
// the node netns, sorted and without duplicates.
func (a *Agent) listHostAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	err := a.host.Do(func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list node addresses: %w", err)
		}
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), err
}

// SyncHostAddrs gives the node's current addresses to the service
// translation (hostPorts' hostIPs) and writes them into the datapath's policy
// ipcache as the host identity (replacing the previous set), when the
// datapath has policy. Each happens only when the set changed since its last
// successful sync.
func (a *Agent) SyncHostAddrs() error {
	a.hostAddrMu.Lock()
	defer a.hostAddrMu.Unlock()
	addrs, err := a.listHostAddrs()
	if err != nil {
		return err
	}
	a.syncServiceHostAddrs(addrs)
	hs, ok := a.dp.(hostAddrSetter)
	if !ok {
		return nil
	}
	if a.hostAddrsSynced && slices.Equal(addrs, a.hostAddrs) {
		return nil
	}
	if err := a.host.Do(func() error { return hs.SetPolicyHostAddrs(addrs) }); err != nil {
		a.hostAddrsSynced = false
		return err
	}
	a.hostAddrs, a.hostAddrsSynced = addrs, true
	a.log.Info("node addresses in the policy ipcache", "addrs", addrs)
	return nil
}

// watchHostAddrs resyncs the node's addresses on every address change in
// the node netns until ctx ends, subscribing again when the subscription
// fails.
func (a *Agent) watchHostAddrs(ctx context.Context) {
	for ctx.Err() == nil {
		a.watchHostAddrsOnce(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(hostAddrResubscribe):
		}
	}
}

// watchHostAddrsOnce runs one subscription until it ends or ctx does.
func (a *Agent) watchHostAddrsOnce(ctx context.Context) {
	ch := make(chan netlink.AddrUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	err := a.host.Do(func() error {
		// The socket is created in the calling thread's netns: the node's.
		return netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{
			ErrorCallback: func(err error) { a.log.Warn("node address subscription", "err", err) },
		})
	})
	if err != nil {
		a.log.Warn("subscribe to node address changes", "err", err)
		return
	}
	// Subscribed first, then listed: no change falls in between.
	if err := a.SyncHostAddrs(); err != nil {
		a.log.Warn("sync node addresses", "err", err)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			for drained := false; !drained; { // a burst: one resync
				select {
				case _, ok = <-ch:
					if !ok {
						drained = true
					}
				default:
					drained = true
				}
			}
			if err := a.SyncHostAddrs(); err != nil {
				a.log.Warn("sync node addresses", "err", err)
			}
			if !ok {
				return
			}
		}
	}
}
