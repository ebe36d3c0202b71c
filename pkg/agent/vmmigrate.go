package agent

// Live migration of VM endpoints: the address moves with the VM (issue 27).
//
// The target node's agent creates the VM endpoint with the source's
// address, MAC and labels (so the same policy identity), incoming: devices,
// steering program and fd-passing socket exist (the destination QEMU's
// backend connects, QEMU sets its rings up), but the endpoint is in no
// datapath map, no route leads to it and its host end forwards nothing
// (ipv4 conf forwarding 0: a frame the guest sends before the switch is not
// routed past policy). When the migration state says the guest runs here
// (VMMigrationChanged target/completed), ActivateVM puts it in the
// datapath and routes its /32 (and /128: a dual-stack VM's IPv6 address
// moves too, native routing) to it, replacing a route to the source.
//
// The claim carries a generation (the migration's start, ns). Every node
// learns the claims of moved addresses (SyncEndpointRoutes: what the lab
// publishes, or API objects); the highest generation of an address wins,
// and the routing mode's writer (epclaims.go) routes the winners: /32 and
// /128 routes next to the routes to the pod CIDRs (native), /32 entries
// next to the pod CIDRs in the tunnel's node map (tunnel: IPv4 only). A node whose
// local VM holds a lower claim takes it out of the datapath and routes the
// address to the winner: the source after the switch. IPAM: the target
// claims the address (outside its pod CIDR, or back in its own); a node
// whose pod CIDR holds an address that a claim elsewhere routes away keeps
// it held ("moved:<vm>") while the claim lasts, so no pod gets it.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/store"
)

// EndpointRoute is one node's claim of a moved VM address.
type EndpointRoute struct {
	Addr       netip.Addr // the VM's IPv4 or IPv6 address
	Via        netip.Addr // the claiming node's address of the same family
	Generation uint64
	VM, Node   string
}

// Activation triggers recorded in endpoint.VMMigration.ActivatedBy.
const (
	ActivatedByMigrationState = "migration-state"
)

// rtProtoLanekit marks the per-endpoint routes this agent installs.
const rtProtoLanekit = netlink.RouteProtocol(0x4c)

// movedOwner holds an address of this node's pod CIDR whose VM another
// node claims now.
func movedOwner(vm string) string { return "moved:" + vm }

func isMovedOwner(owner string) bool { return strings.HasPrefix(owner, movedOwner("")) }

func validateIncoming(req *AddVMRequest) error {
	if req.Incoming && !req.Address.IsValid() {
		return fmt.Errorf("an incoming vm needs the address it has on the source: %w", ErrInvalid)
	}
	if req.Address.IsValid() && !req.Address.Is4() {
		return fmt.Errorf("vm address %s: want the IPv4 address (the IPv6 one is Address6): %w", req.Address, ErrInvalid)
	}
	if req.Address6.IsValid() && (!req.Address6.Is6() || req.Address6.Is4In6()) {
		return fmt.Errorf("vm address6 %s: want an IPv6 address: %w", req.Address6, ErrInvalid)
	}
	if req.Address6.IsValid() && !req.Address.IsValid() {
		return fmt.Errorf("vm address6 %s without the IPv4 address: %w", req.Address6, ErrInvalid)
	}
	if req.GatewayMAC != "" {
		if hw, err := net.ParseMAC(req.GatewayMAC); err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			return fmt.Errorf("gateway mac %q is not a unicast Ethernet address: %w", req.GatewayMAC, ErrInvalid)
		}
	}
	return nil
}

func migrationOf(req AddVMRequest) *endpoint.VMMigration {
	switch {
	case req.Incoming:
		return &endpoint.VMMigration{State: endpoint.VMIncoming, Generation: req.Generation}
	case req.Generation > 0 || req.Address.IsValid():
		return &endpoint.VMMigration{State: endpoint.VMActive, Generation: req.Generation}
	}
	return nil
}

// claimsAddress reports whether ep delivers its address here: every
// endpoint but an incoming VM (not switched over yet) and a moved one
// (superseded by another node's claim). A restarted agent puts only these
// back in the datapath.
func claimsAddress(ep *endpoint.Endpoint) bool {
	if ep.VM == nil || ep.VM.Migration == nil {
		return true
	}
	return ep.VM.Migration.State != endpoint.VMIncoming && ep.VM.Migration.State != endpoint.VMMoved
}

// poolOf is the node's address pool of addr's family (nil: none).
func (a *Agent) poolOf(addr netip.Addr) *ipam.IPAM {
	if addr.Is4() {
		return a.ipam
	}
	return a.ipam6
}

// claimAddrTx claims addr (either family) for the VM endpoint key: an
// address this node holds for the VM as moved elsewhere comes back to it.
func (a *Agent) claimAddrTx(tx *store.Tx, key, vm string, addr netip.Addr) error {
	pool := a.poolOf(addr)
	if pool == nil {
		return fmt.Errorf("address %s: this node has no pod CIDR of its family: %w", addr, ErrInvalid)
	}
	err := pool.ClaimTx(tx, key, addr, func(holder string) bool { return holder == movedOwner(vm) })
	if errors.Is(err, ipam.ErrTaken) {
		return fmt.Errorf("%w: %w", err, ErrConflict)
	}
	return err
}

// host32 is ip's host prefix: /32, or /128 for IPv6.
func host32(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}

func localRoute(ep *endpoint.Endpoint) *netlink.Route {
	return &netlink.Route{LinkIndex: ep.HostIfIndex, Dst: host32(ep.IP), Scope: netlink.SCOPE_LINK}
}

// localRoute6 is the host end's /128 route to ep's IPv6 address (as
// netdev's setupHostIPv6 installs it).
func localRoute6(ep *endpoint.Endpoint) *netlink.Route {
	return &netlink.Route{LinkIndex: ep.HostIfIndex, Dst: host32(ep.IP6)}
}

// addrsOf are ep's valid addresses: IPv4 and, dual-stack, IPv6.
func addrsOf(ep *endpoint.Endpoint) []netip.Addr {
	out := make([]netip.Addr, 0, 2)
	for _, a := range []netip.Addr{ep.IP, ep.IP6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

func viaRoute(r EndpointRoute) *netlink.Route {
	return &netlink.Route{Dst: host32(r.Addr), Gw: r.Via.AsSlice(), Protocol: rtProtoLanekit}
}

// setForwarding sets IPv4 forwarding of the host end dev (host netns).
func setForwarding(dev string, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	p := filepath.Join("/proc/sys/net/ipv4/conf", dev, "forwarding")
	if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
		return fmt.Errorf("ipv4 forwarding of %s: %w", dev, err)
	}
	return nil
}

// prepareIncoming makes a new VM endpoint inactive: the host end takes the
// gateway MAC the guest knows, its /32 route goes (a route to the source,
// if this agent had one, comes back), and it forwards nothing.
func (a *Agent) prepareIncoming(ep *endpoint.Endpoint, gatewayMAC string) error {
	err := a.host.Do(func() error {
		if gatewayMAC != "" {
			hw, _ := net.ParseMAC(gatewayMAC) // validated
			l, err := netlink.LinkByIndex(ep.HostIfIndex)
			if err != nil {
				return fmt.Errorf("host end %s: %w", ep.HostIfName, err)
			}
			if err := netlink.LinkSetHardwareAddr(l, hw); err != nil {
				return fmt.Errorf("host end %s mac %s: %w", ep.HostIfName, hw, err)
			}
			ep.HostMAC = hw.String()
		}
		if err := netlink.RouteDel(localRoute(ep)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("remove route %s/32 to incoming %s: %w", ep.IP, ep.HostIfName, err)
		}
		if ep.IP6.IsValid() {
			if err := netlink.RouteDel(localRoute6(ep)); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("remove route %s/128 to incoming %s: %w", ep.IP6, ep.HostIfName, err)
			}
		}
		return setForwarding(ep.HostIfName, false)
	})
	if err != nil {
		return err
	}
	for _, addr := range addrsOf(ep) {
		if r, ok := a.epRoutes[addr]; ok {
			if err := a.claims().put(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// ActivateVM makes the incoming VM endpoint name the node's claim of its
// address: datapath entry, /32 route to its host end (replacing any route
// to another node), forwarding on. Activating an active endpoint is a
// no-op; by says what reported the guest running here.
func (a *Agent) ActivateVM(name, by string) (_ *VMInfo, err error) {
	changed := false
	defer func() {
		if changed {
			a.endpointsChanged()
		}
	}()
	if err := endpoint.ValidateVMName(name); err != nil {
		return nil, fmt.Errorf("activate vm: %w: %w", err, ErrInvalid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := vmKey(name)
	ep, ok, err := a.lookup(key)
	if err != nil {
		return nil, fmt.Errorf("activate vm %s: %w", name, err)
	}
	if !ok || ep.VM == nil || ep.Pending {
		return nil, fmt.Errorf("activate vm %s: no such vm: %w", name, ErrNotFound)
	}
	m := ep.VM.Migration
	if m == nil || m.State == endpoint.VMActive {
		vi := a.vmInfo(ep)
		return &vi, nil
	}
	if m.State != endpoint.VMIncoming {
		return nil, fmt.Errorf("activate vm %s: it is %s: %w", name, m.State, ErrConflict)
	}
	dpEp, err := a.dpEndpoint(&ep)
	if err != nil {
		return nil, fmt.Errorf("activate vm %s: %w", name, err)
	}
	if err := a.deliverLocally(dpEp, &ep); err != nil {
		return nil, fmt.Errorf("activate vm %s: %w", name, err)
	}
	changed = true
	if err := a.delIncomingDrops(&ep); err != nil {
		// Only what the uplink brings for it is dropped until a restart.
		a.log.Warn("activate vm: its incoming drop rule stays", "vm", name, "err", err)
	}
	for _, addr := range addrsOf(&ep) {
		if err := a.claims().drop(addr); err != nil {
			// The datapath delivers locally before it looks at the node map;
			// the next sync of the claims retries.
			a.log.Warn("activate vm: the claim routed away stays", "vm", name, "ip", addr, "err", err)
		}
	}
	m.State, m.Activated, m.ActivatedBy = endpoint.VMActive, time.Now().UTC(), by
	if err := a.st.Update(func(tx *store.Tx) error { return tx.Put(store.Endpoints, []byte(key), ep) }); err != nil {
		return nil, fmt.Errorf("activate vm %s: %w", name, err)
	}
	a.log.Info("vm activated: the node claims its address", "vm", name, "id", ep.ID, "ip", ep.IP, "ip6", ep.IP6,
		"generation", m.Generation, "by", by)
	vi := a.vmInfo(ep)
	return &vi, nil
}

// deliverLocally makes VM ep this node's claim of its addresses in the
// host netns: datapath entry, /32 (and /128) route to its host end
// (replacing any route to another node), forwarding on.
func (a *Agent) deliverLocally(dpEp datapath.Endpoint, ep *endpoint.Endpoint) error {
	return a.host.Do(func() error {
		if err := a.dp.UpsertEndpoint(dpEp); err != nil {
			return fmt.Errorf("program datapath: %w", err)
		}
		if err := netlink.RouteReplace(localRoute(ep)); err != nil {
			return fmt.Errorf("route %s/32 to %s: %w", ep.IP, ep.HostIfName, err)
		}
		if ep.IP6.IsValid() {
			if err := netlink.RouteReplace(localRoute6(ep)); err != nil {
				return fmt.Errorf("route %s/128 to %s: %w", ep.IP6, ep.HostIfName, err)
			}
		}
		return setForwarding(ep.HostIfName, true)
	})
}

// VMMigrationEvent applies a migration state reported for VM name on this
// node: a target activates its incoming endpoint when the migration
// completed and removes it when it failed. The source acts on the target's
// claim (SyncEndpointRoutes), not on the state: it keeps delivering until
// the cluster routes the address away. Unknown names are ErrNotFound.
func (a *Agent) VMMigrationEvent(name, role, phase string) (*VMInfo, error) {
	switch role {
	case "source", "target":
	default:
		return nil, fmt.Errorf("vm %s migration: role %q: want source or target: %w", name, role, ErrInvalid)
	}
	switch phase {
	case "running", "completed", "failed":
	default:
		return nil, fmt.Errorf("vm %s migration: phase %q: want running, completed or failed: %w", name, phase, ErrInvalid)
	}
	if role == "target" && phase == "completed" {
		return a.ActivateVM(name, ActivatedByMigrationState)
	}
	if role == "target" && phase == "failed" {
		a.mu.Lock()
		ep, ok, err := a.lookup(vmKey(name))
		a.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if ok && ep.VM != nil && ep.VM.Migration != nil && ep.VM.Migration.State == endpoint.VMIncoming {
			if _, err := a.DelVM(name); err != nil {
				return nil, err
			}
			a.log.Info("vm migration failed: incoming endpoint removed", "vm", name)
			return nil, nil
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok, err := a.lookup(vmKey(name))
	if err != nil {
		return nil, err
	}
	if !ok || ep.VM == nil {
		return nil, fmt.Errorf("vm %s migration: no such vm: %w", name, ErrNotFound)
	}
	a.log.Info("vm migration", "vm", name, "role", role, "phase", phase)
	vi := a.vmInfo(ep)
	return &vi, nil
}

// SyncEndpointRoutes takes every node's claims of moved VM addresses (the
// full set) and returns the local VMs it superseded now. Per address the
// highest generation wins: a local active VM with a lower claim leaves the
// datapath and its address is routed to the winner; any other winning
// claim of another node is routed to it by the routing mode's writer (a
// /32 route, or a node map entry in tunnel mode). What was routed before
// and is no longer claimed goes, and so do holds of moved addresses.
func (a *Agent) SyncEndpointRoutes(routes []EndpointRoute) (installed int, superseded []string, err error) {
	defer func() {
		if len(superseded) > 0 {
			a.endpointsChanged()
		}
	}()
	best := map[netip.Addr]EndpointRoute{}
	for _, r := range routes {
		if !r.Addr.IsValid() || !r.Via.IsValid() || r.Addr.Is4() != r.Via.Is4() || r.Addr.Is4In6() || r.Via.Is4In6() {
			return 0, nil, fmt.Errorf("endpoint route %s via %s: want two addresses of one family: %w", r.Addr, r.Via, ErrInvalid)
		}
		if r.Addr.Is6() && a.cfg.RoutingMode == RoutingTunnel {
			return 0, nil, fmt.Errorf("endpoint route %s via %s: tunnel routing moves IPv4 addresses only: %w", r.Addr, r.Via, ErrInvalid)
		}
		if err := endpoint.ValidateVMName(r.VM); err != nil {
			return 0, nil, fmt.Errorf("endpoint route %s: %w: %w", r.Addr, err, ErrInvalid)
		}
		if b, ok := best[r.Addr]; !ok || r.Generation > b.Generation {
			best[r.Addr] = r
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	eps, err := a.endpoints()
	if err != nil {
		return 0, nil, err
	}
	// Addresses this node handed over to their migration's target
	// (vmhandover.go) stay routed there until a higher claim replaces them.
	for _, h := range handovers(eps) {
		if b, ok := best[h.Addr]; !ok || h.Generation > b.Generation {
			best[h.Addr] = h
		}
	}
	byIP := map[netip.Addr]endpoint.Endpoint{}
	for _, ep := range eps {
		if ep.Pending {
			continue
		}
		// A dual-stack VM's two entries share its VM part: once the claim
		// of one address superseded it (state moved), the other's is routed.
		for _, addr := range addrsOf(&ep) {
			byIP[addr] = ep
		}
	}
	want := map[netip.Addr]EndpointRoute{}
	var errs []error
	for addr, r := range best {
		ep, local := byIP[addr]
		switch {
		case local && ep.VM == nil:
			errs = append(errs, fmt.Errorf("claim of %s by %s (vm %s) collides with local endpoint %d", addr, r.Node, r.VM, ep.ID))
			continue
		case local && (ep.VM.Migration == nil || ep.VM.Migration.State == endpoint.VMActive):
			var gen uint64
			if ep.VM.Migration != nil {
				gen = ep.VM.Migration.Generation
			}
			if gen >= r.Generation {
				continue // ours wins: the local route stays
			}
			if _, err := a.supersede(&ep, r, false); err != nil {
				errs = append(errs, err)
				continue
			}
			superseded = append(superseded, ep.VM.Name)
		}
		want[addr] = r
	}
	errs = append(errs, a.claims().sync(want)...)
	if err := a.syncMovedHolds(want); err != nil {
		errs = append(errs, err)
	}
	if len(superseded) > 0 || len(errs) > 0 {
		a.log.Info("endpoint routes synced", "claims", len(best), "routes", len(a.epRoutes), "superseded", superseded,
			"errors", len(errs))
	}
	return len(a.epRoutes), superseded, errors.Join(errs...)
}

// supersede takes the local VM ep out of the datapath after another node's
// higher claim r: its /32 now leads to r.Via, its addresses (when of this
// node's pod CIDRs) stay held as moved, the record says where it went
// (mu held). DelVM removes the rest when the source's pod goes. The claim
// of a dual-stack VM's other address is routed by the sync after it.
// handedOver records that this node moved it itself (vmhandover.go);
// switched is when the datapath stopped delivering it here.
func (a *Agent) supersede(ep *endpoint.Endpoint, r EndpointRoute, handedOver bool) (switched time.Time, err error) {
	dpEp, err := a.dpEndpoint(ep)
	if err != nil {
		return switched, fmt.Errorf("supersede vm %s: %w", ep.VM.Name, err)
	}
	// The claim's route (or node map entry) first: the datapath delivers
	// locally until the endpoint leaves it.
	if err := a.claims().put(r); err != nil {
		return switched, fmt.Errorf("supersede vm %s: %w", ep.VM.Name, err)
	}
	err = a.host.Do(func() error {
		if err := a.dp.DeleteEndpoint(dpEp); err != nil {
			return fmt.Errorf("datapath: %w", err)
		}
		switched = time.Now()
		return setForwarding(ep.HostIfName, false)
	})
	if err != nil {
		return switched, fmt.Errorf("supersede vm %s: %w", ep.VM.Name, err)
	}
	key := ep.StoreKey()
	if ep.VM.Migration == nil {
		ep.VM.Migration = &endpoint.VMMigration{}
	}
	m := ep.VM.Migration
	m.State, m.MovedTo, m.HandedOver, m.HandOverGeneration, m.MovedToNode = endpoint.VMMoved, r.Via.String(), handedOver, 0, ""
	if handedOver {
		m.HandOverGeneration, m.MovedToNode = r.Generation, r.Node
	}
	err = a.st.Update(func(tx *store.Tx) error {
		for _, addr := range addrsOf(ep) {
			pool := a.poolOf(addr)
			switch {
			case pool == nil:
			case pool.Contains(addr):
				if err := pool.ClaimTx(tx, movedOwner(ep.VM.Name), addr, func(h string) bool { return h == key }); err != nil {
					return err
				}
			default:
				if err := pool.ReleaseTx(tx, key); err != nil {
					return err
				}
			}
		}
		return tx.Put(store.Endpoints, []byte(key), *ep)
	})
	if err != nil {
		return switched, fmt.Errorf("supersede vm %s: %w", ep.VM.Name, err)
	}
	if !handedOver {
		a.log.Info("vm moved: another node claims its address", "vm", ep.VM.Name, "id", ep.ID, "ip", ep.IP,
			"to", r.Via, "node", r.Node, "generation", r.Generation)
	}
	return switched, nil
}

// syncMovedHolds holds each address of this node's pod CIDR that a claim
// elsewhere routes away and no local endpoint holds, and releases holds no
// claim needs any more (mu held).
func (a *Agent) syncMovedHolds(want map[netip.Addr]EndpointRoute) error {
	return a.st.Update(func(tx *store.Tx) error {
		for addr, r := range want {
			pool := a.poolOf(addr)
			if pool == nil || !pool.Contains(addr) {
				continue
			}
			holder, held, err := pool.HolderTx(tx, addr)
			if err != nil {
				return err
			}
			if held && holder != movedOwner(r.VM) {
				continue // a local endpoint (the incoming VM, or the moved one) holds it
			}
			if err := pool.ClaimTx(tx, movedOwner(r.VM), addr, nil); err != nil {
				return err
			}
		}
		for _, pool := range []*ipam.IPAM{a.ipam, a.ipam6} {
			if pool == nil {
				continue
			}
			allocs, err := pool.AllocationsTx(tx)
			if err != nil {
				return err
			}
			for _, al := range allocs {
				if !isMovedOwner(al.Owner) {
					continue
				}
				if r, ok := want[al.IP]; ok && movedOwner(r.VM) == al.Owner {
					continue
				}
				if err := pool.ReleaseTx(tx, al.Owner); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
