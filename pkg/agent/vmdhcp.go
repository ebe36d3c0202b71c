package agent

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

// dpEndpoint is what the datapath needs for ep: for a VM, also what its
// DHCP server offers beside the lease (bpf/lib/dhcp.h): the device's MTU
// and, with ClusterDNS, the name servers and the search list a
// ClusterFirst pod of its namespace gets from kubelet
// (<ns>.svc.<domain>, svc.<domain>, <domain>): what KubeVirt's own DHCP
// copies from the launcher pod's resolv.conf.
func (a *Agent) dpEndpoint(ep *endpoint.Endpoint) (datapath.Endpoint, error) {
	dp, err := ep.Datapath()
	if err != nil || ep.VM == nil {
		return dp, err
	}
	dp.DHCP.MTU = ep.MTU
	if len(a.cfg.ClusterDNS) > 0 {
		dp.DHCP.DNS = a.cfg.ClusterDNS
		if d := a.cfg.ClusterDomain; d != "" {
			// The namespace comes with the CNI call: a name that makes no
			// domain (too long with a long cluster domain) is left out,
			// not a failed ADD.
			ns, _, _ := argsView(ep)
			for _, s := range []string{ns + ".svc." + d, "svc." + d, d} {
				if datapath.ValidDomain(s) {
					dp.DHCP.Search = append(dp.DHCP.Search, s)
				}
			}
		}
	}
	return dp, nil
}

// checkClusterDNS refuses name servers and a cluster domain a VM's DHCP
// cannot offer (IPv6 or unspecified servers, a domain that is no DNS name).
func checkClusterDNS(cfg Config) error {
	if len(cfg.ClusterDNS) == 0 {
		return nil
	}
	o := datapath.DHCPOptions{DNS: cfg.ClusterDNS}
	if cfg.ClusterDomain != "" {
		o.Search = []string{cfg.ClusterDomain}
	}
	if _, err := o.Render(); err != nil {
		return fmt.Errorf("--cluster-dns %v / --cluster-domain %q: %w", cfg.ClusterDNS, cfg.ClusterDomain, err)
	}
	return nil
}
