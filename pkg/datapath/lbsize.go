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

// sizeLB sets the service maps of spec to c's sizes: every program that
// shares the pinned maps must load them with one size, or it would migrate
// them to its own.
func sizeLB(spec *ebpf.CollectionSpec, c Config) {
	f, b := c.LBSizes()
	for _, g := range []struct {
		names []string
		n     int
	}{{lbFrontendMaps, f}, {lbBackendMaps, b}} {
		for _, name := range g.names {
			if m, ok := spec.Maps[name]; ok {
				m.MaxEntries = uint32(g.n)
			}
		}
	}
}
