package agent

import (
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
	if err := a.ipam.ReleaseTx(tx, owner); err != nil {
		return err
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
