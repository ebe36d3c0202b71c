package agent

// Where a moved VM address lives: one writer per routing mode applies the
// winning claims SyncEndpointRoutes computed (vmmigrate.go).
//
//   - native routing: a kernel /32 (IPv6: /128) route via the owner node's
//     address of the claim's family, next to the routes to the pod CIDRs
//     (protocol rtProtoLanekit);
//   - tunnel routing: a /32 entry in the node map (lk_tunnel_nodes, next to
//     the pod CIDRs: the LPM lookup prefers it) with the owner's underlay
//     address, so tunnel_route encapsulates pod and VM traffic for the
//     address to the owner (with the sender's identity in the VNI, as for
//     any remote pod), plus a /32 route into the tunnel device for the
//     node's own traffic (to_tunnel keys it from the same entry). IPv4
//     only: SyncEndpointRoutes refuses IPv6 claims in tunnel mode.
//
// The writer keeps a.epRoutes (the claims routed away from this node);
// everything here runs with a.mu held, outside a.host.Do.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
)

type claimWriter interface {
	// put routes r.Addr to r's node now (a superseded local VM, an
	// incoming VM's address that was routed away before).
	put(r EndpointRoute) error
	// drop forgets the claim of addr: a local endpoint delivers it now
	// (its own /32 route replaced the claim's).
	drop(addr netip.Addr) error
	// sync makes want the full set of claims routed away from this node.
	sync(want map[netip.Addr]EndpointRoute) []error
}

func (a *Agent) claims() claimWriter {
	if a.epRoutes == nil {
		a.epRoutes = map[netip.Addr]EndpointRoute{}
	}
	if a.cfg.RoutingMode == RoutingTunnel {
		return tunnelClaims{a}
	}
	return nativeClaims{a}
}

// nativeClaims: kernel /32 and /128 routes via the owner.
type nativeClaims struct{ a *Agent }

func (w nativeClaims) put(r EndpointRoute) error {
	if err := w.a.host.Do(func() error { return netlink.RouteReplace(viaRoute(r)) }); err != nil {
		return fmt.Errorf("route %s via %s: %w", host32(r.Addr), r.Via, err)
	}
	w.a.epRoutes[r.Addr] = r
	return nil
}

func (w nativeClaims) drop(addr netip.Addr) error {
	delete(w.a.epRoutes, addr)
	return nil
}

func (w nativeClaims) sync(want map[netip.Addr]EndpointRoute) []error {
	a := w.a
	var errs []error
	err := a.host.Do(func() error {
		for addr, r := range want {
			if cur, ok := a.epRoutes[addr]; ok && cur.Via == r.Via {
				continue
			}
			if err := netlink.RouteReplace(viaRoute(r)); err != nil {
				errs = append(errs, fmt.Errorf("route %s via %s: %w", host32(addr), r.Via, err))
				continue
			}
			a.epRoutes[addr] = r
		}
		// The kernel's list, not only a.epRoutes: a restarted agent removes
		// what its predecessor installed.
		var have []netlink.Route
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: rtProtoLanekit}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return fmt.Errorf("list endpoint routes: %w", err)
			}
			have = append(have, rs...)
		}
		for _, h := range have {
			if h.Dst == nil || h.Gw == nil { // routes into the tunnel device (same protocol) are not ours
				continue
			}
			addr, ok := netip.AddrFromSlice(h.Dst.IP)
			addr = addr.Unmap()
			if ones, _ := h.Dst.Mask.Size(); !ok || ones != addr.BitLen() {
				continue
			}
			if _, ok := want[addr]; ok {
				continue
			}
			if err := netlink.RouteDel(&h); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("remove route %s via %s: %w", host32(addr), h.Gw, err))
				continue
			}
			delete(a.epRoutes, addr)
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	for addr := range a.epRoutes {
		if _, ok := want[addr]; !ok {
			delete(a.epRoutes, addr)
		}
	}
	return errs
}

// tunnelClaims: /32 entries in the node map and routes into the tunnel
// device, written together with the node CIDRs (writeTunnelNodesLocked).
type tunnelClaims struct{ a *Agent }

func (w tunnelClaims) put(r EndpointRoute) error {
	a := w.a
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	if a.tunnelClaims == nil { // no node map to load them from (a datapath without a tunnel)
		a.tunnelClaims = map[netip.Addr]netip.Addr{}
	}
	a.tunnelClaims[r.Addr] = r.Via
	if err := a.writeTunnelNodesLocked(); err != nil {
		return fmt.Errorf("node map entry %s/32 via %s: %w", r.Addr, r.Via, err)
	}
	a.epRoutes[r.Addr] = r
	return nil
}

func (w tunnelClaims) drop(addr netip.Addr) error {
	a := w.a
	delete(a.epRoutes, addr)
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	if _, ok := a.tunnelClaims[addr]; !ok {
		return nil
	}
	delete(a.tunnelClaims, addr)
	if err := a.writeTunnelNodesLocked(); err != nil {
		return fmt.Errorf("remove node map entry %s/32: %w", addr, err)
	}
	return nil
}

func (w tunnelClaims) sync(want map[netip.Addr]EndpointRoute) []error {
	a := w.a
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	prev := a.tunnelClaims
	a.tunnelClaims = make(map[netip.Addr]netip.Addr, len(want))
	for addr, r := range want {
		a.tunnelClaims[addr] = r.Via
	}
	if err := a.writeTunnelNodesLocked(); err != nil {
		a.tunnelClaims = prev
		return []error{fmt.Errorf("node map claims: %w", err)}
	}
	clear(a.epRoutes)
	for addr, r := range want {
		a.epRoutes[addr] = r
	}
	return nil
}

// loadTunnelClaimsLocked takes the claim entries a predecessor left in the
// pinned node map as this agent's (once, at start; tunnelMu held): a
// restarted agent keeps routing moved addresses away until its first
// sync of the claims says otherwise, as native routing keeps its kernel
// routes.
func (a *Agent) loadTunnelClaimsLocked(td tunnelDatapath) error {
	if a.tunnelClaims != nil {
		return nil
	}
	var nodes []datapath.TunnelNode
	if err := a.host.Do(func() error {
		var err error
		nodes, err = td.TunnelNodes()
		return err
	}); err != nil {
		return fmt.Errorf("node map claims: %w", err)
	}
	a.tunnelClaims = map[netip.Addr]netip.Addr{}
	for _, n := range nodes {
		if n.Claim && n.PodCIDR.IsSingleIP() {
			a.tunnelClaims[n.PodCIDR.Addr()] = n.Underlay
		}
	}
	return nil
}

// tunnelClaimNodes are the node map entries of the claims (tunnelMu held).
func (a *Agent) tunnelClaimNodes() []datapath.TunnelNode {
	out := make([]datapath.TunnelNode, 0, len(a.tunnelClaims))
	for addr, via := range a.tunnelClaims {
		out = append(out, datapath.TunnelNode{PodCIDR: netip.PrefixFrom(addr, addr.BitLen()), Underlay: via, Claim: true})
	}
	return out
}
