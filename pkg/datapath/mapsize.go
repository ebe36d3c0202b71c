package datapath

import "github.com/cilium/ebpf"

// The service maps' default sizes: 100,000 ClusterIP Services of one port
// with 4 endpoints each fit (a NodePort Service takes a frontend per node
// address too, and its backends again for each). The maps are not
// preallocated: an entry costs memory only when written.
const (
	DefaultLBFrontends = 131072
	DefaultLBBackends  = 524288
)

// lbMaps are the service maps by what sizes them.
var (
	lbFrontendMaps = []string{"lk_lb_svc", "lk_lb_svc6", "lk_lb_revnat", "lk_lb_revnat6", "lk_lb_maglev"}
	lbBackendMaps  = []string{"lk_lb_backends", "lk_lb_backends6"}
)

// The policy and tunnel maps' default sizes (LK_POLICY_MAX_* and
// LK_TUNNEL_MAX_NODES in bpf/lib, which the loader overrides): 65,536
// endpoint addresses and identities cluster-wide, 524,288 rule entries,
// 16,384 ipBlock prefixes, 4,096 tunnel peers.
const (
	DefaultPolicyIPCache    = 65536
	DefaultPolicyCIDRs      = 16384
	DefaultPolicyIdentities = 65536
	DefaultPolicyRules      = 524288
	DefaultTunnelNodes      = 4096
)

// The maps each policy and tunnel size applies to.
var (
	policyIPCacheMaps = []string{"lk_policy_ipcache", "lk_policy_ipcache6"}
	policyCIDRMaps    = []string{"lk_policy_cidrs", "lk_policy_cidrs6"}
	policyIdentMaps   = []string{"lk_policy_isolation", "lk_tunnel_vni", "lk_tunnel_ident"}
	policyRuleMaps    = []string{"lk_policy_rules"}
	tunnelNodeMaps    = []string{"lk_tunnel_nodes", "lk_tunnel_peers"}
)

// PolicySizes are the policy and tunnel maps' sizes: IPCache endpoint
// addresses per family (lk_policy_ipcache(6)), CIDRs ipBlock prefixes per
// family (lk_policy_cidrs(6)), Identities isolated identities
// (lk_policy_isolation, and the tunnel's identity maps), Rules rule entries
// (lk_policy_rules), TunnelNodes tunnel peers (lk_tunnel_nodes, _peers).
type PolicySizes struct {
	IPCache, CIDRs, Identities, Rules, TunnelNodes int
}

// PolicySizes are the sizes c asks for, the defaults for 0.
func (c Config) PolicySizes() PolicySizes {
	or := func(n, def int) int {
		if n <= 0 {
			return def
		}
		return n
	}
	p := c.PolicyMaps
	return PolicySizes{
		IPCache: or(p.IPCache, DefaultPolicyIPCache), CIDRs: or(p.CIDRs, DefaultPolicyCIDRs),
		Identities: or(p.Identities, DefaultPolicyIdentities), Rules: or(p.Rules, DefaultPolicyRules),
		TunnelNodes: or(p.TunnelNodes, DefaultTunnelNodes),
	}
}

// LBSizes are the service maps' sizes c asks for (the defaults for 0).
func (c Config) LBSizes() (frontends, backends int) {
	frontends, backends = c.LBFrontends, c.LBBackends
	if frontends <= 0 {
		frontends = DefaultLBFrontends
	}
	if backends <= 0 {
		backends = DefaultLBBackends
	}
	return frontends, backends
}

// sizeMaps sets the service, policy and tunnel maps of spec to c's sizes:
// every program that shares the pinned maps must load them with one size,
// or it would migrate them to its own.
func sizeMaps(spec *ebpf.CollectionSpec, c Config) {
	f, b := c.LBSizes()
	p := c.PolicySizes()
	for _, g := range []struct {
		names []string
		n     int
	}{{lbFrontendMaps, f}, {lbBackendMaps, b}, {policyIPCacheMaps, p.IPCache}, {policyCIDRMaps, p.CIDRs},
		{policyIdentMaps, p.Identities}, {policyRuleMaps, p.Rules}, {tunnelNodeMaps, p.TunnelNodes}} {
		for _, name := range g.names {
			if m, ok := spec.Maps[name]; ok {
				m.MaxEntries = uint32(g.n)
			}
		}
	}
}
