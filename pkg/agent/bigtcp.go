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
