package agent

import (
	"errors"
	"fmt"
	"net/netip"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/store"
)

// IPv6 for pods and VMs (issue 25): with Config.PodCIDR6 every pod and VM
// endpoint gets an address of each family (a VM's guest configures its
// IPv6 address from the VM's API form, the endpoint's second IP config).
// NetworkPolicy covers both families (an endpoint's IPv6
// address has its identity: netpolicy.go; the node's IPv6 addresses are the
// host identity: hostaddrs.go).

// checkPodCIDRs: a node has an IPv4 pod CIDR, an IPv6 one or both (an
// IPv6-only node has only PodCIDR6).
func checkPodCIDRs(cfg Config) error {
	if !cfg.PodCIDR.IsValid() && !cfg.PodCIDR6.IsValid() {
		return errors.New("pod CIDR is required")
	}
	if cfg.PodCIDR.IsValid() && !cfg.PodCIDR.Addr().Is4() {
		return fmt.Errorf("pod CIDR %s is not an IPv4 prefix (an IPv6 one is PodCIDR6)", cfg.PodCIDR)
	}
	return nil
}

// openIPv4 opens the IPv4 pool when the node has an IPv4 pod CIDR.
func (a *Agent) openIPv4() error {
	if !a.cfg.PodCIDR.IsValid() {
		return nil // IPv6-only
	}
	var err error
	a.ipam, err = ipam.New(a.st, a.cfg.PodCIDR)
	return err
}

// pool is the node's first pod address pool: IPv4, or IPv6 on an IPv6-only
// node (status, the CNI config's subnet check).
func (a *Agent) pool() *ipam.IPAM {
	if a.ipam != nil {
		return a.ipam
	}
	return a.ipam6
}

// allocIPv4Tx returns owner's IPv4 address (allocating it), or the invalid
// address on an IPv6-only node.
func (a *Agent) allocIPv4Tx(tx *store.Tx, owner string) (netip.Addr, error) {
	if a.ipam == nil {
		return netip.Addr{}, nil
	}
	return a.ipam.AllocateTx(tx, owner)
}

// openIPv6 opens the IPv6 pool and turns IPv6 forwarding on when the node
// has an IPv6 pod CIDR.
func (a *Agent) openIPv6() error {
	p := a.cfg.PodCIDR6
	if !p.IsValid() {
		return nil
	}
	if !p.Addr().Is6() || p.Addr().Is4In6() {
		return fmt.Errorf("IPv6 pod CIDR %s is not an IPv6 prefix", p)
	}
	var err error
	if a.ipam6, err = ipam.New(a.st, p); err != nil {
		return err
	}
	return a.host.EnableForwarding6()
}

// allocIPv6Tx returns owner's IPv6 address (allocating it), or the invalid
// address when the node has no IPv6 pod CIDR.
func (a *Agent) allocIPv6Tx(tx *store.Tx, owner string) (netip.Addr, error) {
	if a.ipam6 == nil {
		return netip.Addr{}, nil
	}
	return a.ipam6.AllocateTx(tx, owner)
}

// releaseAddrsTx frees owner's addresses of every family.
func (a *Agent) releaseAddrsTx(tx *store.Tx, owner string) error {
	if a.ipam != nil {
		if err := a.ipam.ReleaseTx(tx, owner); err != nil {
			return err
		}
	}
	if a.ipam6 != nil {
		return a.ipam6.ReleaseTx(tx, owner)
	}
	return nil
}

// addIPv6ToProto adds ep's IPv6 address, its gateway and default route to
// its API form (and so to the CNI result).
func addIPv6ToProto(ep *endpoint.Endpoint, out *apiv1.Endpoint) {
	if !ep.IP6.IsValid() {
		return
	}
	gw := endpoint.GatewayIP6.String()
	out.Ips = append(out.Ips, &apiv1.IPConfig{Address: ep.IP6.String() + "/128", Gateway: gw, Interface: 1})
	out.Routes = append(out.Routes, &apiv1.Route{Dst: "::/0", Gateway: gw})
}
