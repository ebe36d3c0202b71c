package agent

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// BIGTCPInfo is what Status says about BIG TCP (issue 42): the GSO/GRO
// sizes pod devices and the uplink get per family (0: 64 KiB), and why.
type BIGTCPInfo struct {
	Sizes  netdev.BIGTCP
	Detail string
}

// setupBIGTCP decides BIG TCP (Config.BIGTCP, lanekitd --big-tcp) from the
// uplink's driver and the kernel (netdev.ProbeBIGTCP) and gives the uplink
// the sizes: its GRO builds the large packets a pod receives, its TSO cuts
// what a pod sends. Pod devices get them as they are created. Off in tunnel
// mode: a VXLAN packet carries at most 64 KiB.
func (a *Agent) setupBIGTCP() error {
	switch {
	case !a.cfg.BIGTCP:
		a.bigTCP.Detail = "off (lanekitd --big-tcp=false)"
		return nil
	case a.cfg.RoutingMode == RoutingTunnel:
		a.bigTCP.Detail = "off: tunnel mode (a VXLAN packet carries at most 64 KiB)"
		return nil
	}
	probe := a.cfg.Uplink
	if probe == "" {
		probe = "lo" // no uplink: pods of this node only; the kernel's support
	}
	b, detail, err := a.host.ProbeBIGTCP(probe)
	if err != nil {
		return fmt.Errorf("big tcp: probe %s: %w", probe, err)
	}
	a.bigTCP = BIGTCPInfo{Sizes: b, Detail: detail}
	if !b.On() || a.cfg.Uplink == "" {
		return nil
	}
	if err := a.host.SetBIGTCP(a.cfg.Uplink, b); err != nil {
		return err
	}
	a.log.Info("BIG TCP on", "ipv4_max_size", b.IPv4, "ipv6_max_size", b.IPv6, "probe", detail)
	return nil
}

// vmRxBIGTCP is the GSO size of a VM device's host end: with the VM
// receiving through the kernel (--rx-gso kernel) an IPv4 BIG TCP packet from
// a pod crosses it whole and lanekit-vhost hands it to the guest as GSO
// packets of at most 64 KiB; at 64 KiB the host end's transmit would cut
// every such packet into MSS-sized frames in software, each one received and
// delivered on its own (measured: 0.94 against 1.35 Gbit/s to a TCG guest).
// IPv6 too: lanekit-vhost removes the jumbo hop-by-hop header the kernel
// gives such packets. Through AF_XDP (XDP on the device) the host end cuts
// every packet anyway.
func (a *Agent) vmRxBIGTCP(rxKernel bool) netdev.BIGTCP {
	if !rxKernel {
		return netdev.BIGTCP{}
	}
	return netdev.BIGTCP{IPv4: min(a.bigTCP.Sizes.IPv4, netdev.BIGTCPSize), IPv6: min(a.bigTCP.Sizes.IPv6, netdev.BIGTCPSize)}
}
