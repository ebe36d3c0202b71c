package service

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// Endpoints as a service proxy reads them from EndpointSlices: which slices
// are a Service's, the backends of a port with their states, the topology
// hints that narrow them per node, and the count of ready local endpoints the
// health check reports.

// ownSlice says whether an EndpointSlice is one of the Service's that a proxy
// programs: labelled with its name in its namespace, and not labelled headless.
func ownSlice(svc *k8sobj.Service, es *k8sobj.EndpointSlice) bool {
	return es.Namespace == svc.Namespace && es.ServiceName == svc.Name && !es.Headless
}

// LocalEndpoints counts the Service's distinct endpoint addresses on this
// node that are ready (what kube-proxy's healthCheckNodePort reports): of
// every slice of the Service, for any port.
func LocalEndpoints(svc *k8sobj.Service, eps []*k8sobj.EndpointSlice, opts Options) int {
	seen := map[netip.Addr]bool{}
	for _, es := range eps {
		if !ownSlice(svc, es) {
			continue
		}
		for _, ep := range es.Endpoints {
			if endpointState(ep.Conditions) != BackendActive {
				continue
			}
			for _, s := range ep.Addresses {
				if a, err := netip.ParseAddr(s); err == nil && opts.IsLocal(a) {
					seen[a] = true
				}
			}
		}
	}
	return len(seen)
}

// topoHints are an endpoint's EndpointSlice hints: the nodes and zones it
// is meant for.
type topoHints struct{ nodes, zones []string }

// resolveBackends collects the backends of the service port named portName,
// with each endpoint address's topology hints: for each slice, the slice port
// with that name and protocol gives the target port number for the slice's
// endpoints (that is how Kubernetes resolves named target ports, which may
// differ per pod).
func resolveBackends(portName string, proto Proto, eps []*k8sobj.EndpointSlice) ([]Backend, map[netip.Addr]topoHints) {
	seen := map[netip.AddrPort]int{}
	hints := map[netip.Addr]topoHints{}
	var out []Backend
	for _, es := range eps {
		var port int32
		for _, p := range es.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == portName && protoOf(p.Protocol) == proto && p.Port != nil {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			st := endpointState(ep.Conditions)
			var h topoHints
			if ep.Hints != nil {
				for _, n := range ep.Hints.ForNodes {
					h.nodes = append(h.nodes, n.Name)
				}
				for _, z := range ep.Hints.ForZones {
					h.zones = append(h.zones, z.Name)
				}
			}
			for _, a := range ep.Addresses {
				ap := netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port))
				hints[ap.Addr()] = h
				if i, dup := seen[ap]; dup {
					// The same endpoint in two slices (during a slice
					// handover): the better state wins.
					out[i].State = min(out[i].State, st)
					continue
				}
				seen[ap] = len(out)
				out = append(out, Backend{Addr: ap.Addr(), Port: ap.Port(), State: st})
			}
		}
	}
	slices.SortFunc(out, func(a, b Backend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out, hints
}

// topologyFilter keeps the backends the EndpointSlice hints give this node,
// as kube-proxy does for cluster-wide traffic (trafficDistribution
// PreferSameNode / PreferSameZone / PreferClose, topology-aware hints): when
// every ready endpoint has node hints and one is for this node, those for
// this node; else, when every ready endpoint has zone hints and one is for
// this node's zone, those for its zone; else all of them.
func topologyFilter(backends []Backend, hints map[netip.Addr]topoHints, opts Options) []Backend {
	allNode, allZone, forNode, forZone := true, true, false, false
	for _, b := range backends {
		if b.State != BackendActive {
			continue
		}
		h := hints[b.Addr]
		if len(h.nodes) == 0 {
			allNode = false
		} else if opts.NodeName != "" && slices.Contains(h.nodes, opts.NodeName) {
			forNode = true
		}
		if len(h.zones) == 0 {
			allZone = false
		} else if opts.Zone != "" && slices.Contains(h.zones, opts.Zone) {
			forZone = true
		}
	}
	var keep func(topoHints) bool
	switch {
	case allNode && forNode:
		keep = func(h topoHints) bool { return slices.Contains(h.nodes, opts.NodeName) }
	case allZone && forZone:
		keep = func(h topoHints) bool { return slices.Contains(h.zones, opts.Zone) }
	default:
		return backends
	}
	return slices.DeleteFunc(slices.Clone(backends), func(b Backend) bool { return !keep(hints[b.Addr]) })
}

// endpointState maps EndpointSlice conditions to a BackendState. Per the API,
// a nil ready or serving means ready/serving; nil terminating means false.
// Ready wins over terminating: the EndpointSlice controller keeps a
// terminating endpoint ready only for a Service with publishNotReadyAddresses,
// which asks for exactly that (kube-proxy counts it ready too).
func endpointState(c k8sobj.EndpointConditions) BackendState {
	ready := !c.Ready.Is(false)
	serving := ready
	if c.Serving.IsSet() {
		serving = c.Serving.Is(true)
	}
	terminating := c.Terminating.Is(true)
	switch {
	case ready:
		return BackendActive
	case serving && terminating:
		return BackendTerminating
	}
	return BackendNotReady
}
