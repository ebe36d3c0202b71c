package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev"
	"github.com/lanekit/lanekit/pkg/policy"
)

// Routing modes (Config.RoutingMode, --routing-mode).
const (
	// RoutingNative: pod traffic leaves by the node's FIB; the network (or
	// the agents' routes from Node objects) routes every pod CIDR.
	RoutingNative = "native"
	// RoutingTunnel: pod traffic for other nodes goes through a VXLAN tunnel
	// the datapath drives (bpf/lib/tunnel.h); nothing routes pod CIDRs.
	RoutingTunnel = "tunnel"
)

// TunnelDevice is the node's collect_md VXLAN device in tunnel mode.
const TunnelDevice = "lk_vxlan"

// DefaultTunnelPort is the VXLAN UDP port (Linux's and Cilium's 8472, not
// IANA's 4789, which other overlays on the node may hold).
const DefaultTunnelPort = 8472

// TunnelOverhead is what VXLAN over IPv4 adds to a packet: outer IPv4 (20),
// UDP (8), VXLAN (8), inner Ethernet (14). Pods get the uplink MTU minus it.
const TunnelOverhead = 50

// Encryption choices (Config.Encryption, --encryption). Only "none" runs:
// lanekit implements no encryption yet, and this kernel has neither ESP nor
// WireGuard (probed: EncryptionFeatures).
const (
	EncryptionNone      = "none"
	EncryptionIPsec     = "ipsec"
	EncryptionWireGuard = "wireguard"
)

// EncryptionFeatures are the kernel facilities node-to-node encryption
// would need, probed in the node's namespace by trying them.
type EncryptionFeatures struct {
	IPsec     netdev.Feature // an ESP state with AES-GCM (rfc4106) in the xfrm layer
	WireGuard netdev.Feature // a wireguard link
}

// probeEncryption tries an ESP xfrm state and a wireguard link in a
// throwaway network namespace (the facilities are the kernel's, not a
// namespace's: nothing of the node's is touched).
func probeEncryption() EncryptionFeatures {
	var f EncryptionFeatures
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		d := "probe namespace: " + err.Error()
		return EncryptionFeatures{IPsec: netdev.Feature{Detail: d, Unknown: true}, WireGuard: netdev.Feature{Detail: d, Unknown: true}}
	}
	defer orig.Close()
	scratch, err := netns.New()
	if err != nil {
		d := "probe namespace: " + err.Error()
		return EncryptionFeatures{IPsec: netdev.Feature{Detail: d, Unknown: true}, WireGuard: netdev.Feature{Detail: d, Unknown: true}}
	}
	defer func() {
		netns.Set(orig)
		scratch.Close()
	}()
	st := &netlink.XfrmState{
		Src: net.ParseIP("192.0.2.1"), Dst: net.ParseIP("192.0.2.2"), Proto: netlink.XFRM_PROTO_ESP,
		Mode: netlink.XFRM_MODE_TRANSPORT, Spi: 0x4c4b0001, Reqid: 0x4c4b,
		Aead: &netlink.XfrmStateAlgo{Name: "rfc4106(gcm(aes))", Key: make([]byte, 20), ICVLen: 128},
	}
	if err := netlink.XfrmStateAdd(st); err != nil {
		f.IPsec = netdev.Feature{Detail: "ESP with rfc4106(gcm(aes)): " + err.Error()}
	} else {
		netlink.XfrmStateDel(st)
		f.IPsec = netdev.Feature{Supported: true, Detail: "ESP with rfc4106(gcm(aes)) accepted by xfrm"}
	}
	wg := &netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: "lk_wgprobe"}}
	if err := netlink.LinkAdd(wg); err != nil {
		f.WireGuard = netdev.Feature{Detail: "wireguard link: " + err.Error()}
	} else {
		netlink.LinkDel(wg)
		f.WireGuard = netdev.Feature{Supported: true, Detail: "wireguard link created"}
	}
	return f
}

// checkEncryption refuses every encryption but none: with the kernel's
// answer when it lacks the facility, and plainly when it has it (lanekit
// does not implement encryption yet).
func checkEncryption(want string, f EncryptionFeatures) error {
	var feat netdev.Feature
	switch want {
	case "", EncryptionNone:
		return nil
	case EncryptionIPsec:
		feat = f.IPsec
	case EncryptionWireGuard:
		feat = f.WireGuard
	default:
		return fmt.Errorf("unknown encryption %q (want none, ipsec or wireguard)", want)
	}
	if !feat.Supported {
		return fmt.Errorf("--encryption %s: %w: %s", want, datapath.ErrNotSupported, feat.Detail)
	}
	return fmt.Errorf("--encryption %s: the kernel has it (%s), but lanekit does not implement node-to-node encryption yet", want, feat.Detail)
}

// RoutingInfo is the routing part of Status.
type RoutingInfo struct {
	Mode       string
	Device     string // tunnel mode: the VXLAN device
	Port       int
	PodMTU     int
	Nodes      []datapath.TunnelNode // tunnel mode: the node map
	Counters   map[string]uint64     // tunnel mode: lk_tunnel_stats by name
	Encryption EncryptionFeatures    // probed facilities
	NodesError string                // reading the node map or counters failed
	BIGTCP     BIGTCPInfo            // bigtcp.go
	Bandwidth  string                // how pods' egress limits are enforced (bandwidth.go)
}

// tunnelDatapath is a datapath that drives the tunnel (*datapath.Loader).
type tunnelDatapath interface {
	SetTunnelNodes([]datapath.TunnelNode) error
	TunnelNodes() ([]datapath.TunnelNode, error)
	TunnelStats() (datapath.TunnelStats, error)
	SetTunnelIdentities(map[policy.Identity]policy.IdentityInfo) error
}

func (a *Agent) tunnelDP() tunnelDatapath {
	if a.cfg.RoutingMode != RoutingTunnel {
		return nil
	}
	td, _ := a.dp.(tunnelDatapath)
	return td
}

// setupRouting validates the routing and encryption settings, probes
// encryption and, in tunnel mode, sizes the pod MTU and creates the VXLAN
// device (before the datapath opens: it names the device). Called by New
// with a.mtu set to the uplink's (or --mtu).
func (a *Agent) setupRouting() error {
	switch a.cfg.RoutingMode {
	case "":
		a.cfg.RoutingMode = RoutingNative
	case RoutingNative, RoutingTunnel:
	default:
		return fmt.Errorf("unknown routing mode %q (want native or tunnel)", a.cfg.RoutingMode)
	}
	if a.cfg.TunnelPort == 0 {
		a.cfg.TunnelPort = DefaultTunnelPort
	}
	if a.cfg.TunnelPort < 1 || a.cfg.TunnelPort > 65535 {
		return fmt.Errorf("tunnel port %d out of range 1-65535", a.cfg.TunnelPort)
	}
	a.encryption = probeEncryption()
	if err := checkEncryption(a.cfg.Encryption, a.encryption); err != nil {
		return err
	}
	if a.cfg.RoutingMode != RoutingTunnel {
		if len(a.cfg.TunnelNodes) > 0 {
			return errors.New("--tunnel-node needs --routing-mode tunnel")
		}
		return nil
	}
	for _, n := range a.cfg.TunnelNodes {
		if !n.PodCIDR.Addr().Is4() || !n.Underlay.Is4() {
			return fmt.Errorf("tunnel node %v=%v: want an IPv4 pod CIDR and underlay address", n.PodCIDR, n.Underlay)
		}
		if n.PodCIDR.Overlaps(a.cfg.PodCIDR) {
			return fmt.Errorf("tunnel node %v overlaps this node's pod CIDR %v", n.PodCIDR, a.cfg.PodCIDR)
		}
	}
	// Without an uplink (--mtu given instead), --mtu is the pod MTU as is.
	if a.cfg.Uplink != "" {
		uplinkMTU, err := a.host.LinkMTU(a.cfg.Uplink)
		if err != nil {
			return fmt.Errorf("tunnel: uplink mtu: %w", err)
		}
		max := uplinkMTU - TunnelOverhead
		switch {
		case a.cfg.MTU == 0:
			a.mtu = max
		case a.cfg.MTU > max:
			return fmt.Errorf("--mtu %d: tunnel mode fits at most %d (uplink %d - %d VXLAN overhead)", a.cfg.MTU, max, uplinkMTU, TunnelOverhead)
		}
	}
	if a.mtu < 576 {
		return fmt.Errorf("tunnel: pod MTU %d too small", a.mtu)
	}
	if err := a.host.Do(func() error { return ensureVXLAN(a.cfg.TunnelPort, a.mtu) }); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	a.tunnelDev = TunnelDevice
	return nil
}

// ensureVXLAN creates (or re-creates, when its settings differ) the
// collect_md VXLAN device in the current namespace and sets it up. The
// device gets an outer UDP source port range of its own, the namespace's
// local port range as it is now: the programs' encapsulation
// (tunnel_bpf_encap) draws from the device's range, so a flow's GSO packets
// (the device's) and its others (BPF's) share one outer port even after
// the sysctl changes. A device without one (an older agent's) is re-created.
func ensureVXLAN(port, mtu int) error {
	if l, err := netlink.LinkByName(TunnelDevice); err == nil {
		vx, ok := l.(*netlink.Vxlan)
		if ok && vx.FlowBased && vx.Port == port && !vx.Learning && ownSourcePorts(vx) {
			if vx.MTU != mtu {
				if err := netlink.LinkSetMTU(l, mtu); err != nil {
					return fmt.Errorf("set %s mtu: %w", TunnelDevice, err)
				}
			}
			if err := netlink.LinkSetHardwareAddr(l, datapath.TunnelMAC); err != nil {
				return fmt.Errorf("set %s address: %w", TunnelDevice, err)
			}
			if err := netlink.LinkSetARPOff(l); err != nil {
				return fmt.Errorf("set %s noarp: %w", TunnelDevice, err)
			}
			return netlink.LinkSetUp(l)
		}
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("replace %s: %w", TunnelDevice, err)
		}
	}
	lo, hi := datapath.LocalPortRange()
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: TunnelDevice, MTU: mtu, HardwareAddr: datapath.TunnelMAC},
		FlowBased: true, Port: port, Learning: false, PortLow: int(lo), PortHigh: int(hi),
	}
	if err := netlink.LinkAdd(vx); err != nil {
		return fmt.Errorf("add vxlan %s (external, port %d, source ports %d-%d): %w", TunnelDevice, port, lo, hi, err)
	}
	l, err := netlink.LinkByName(TunnelDevice)
	if err != nil {
		return err
	}
	// The inner frame's destination: the tunnel MAC on every node.
	if err := netlink.LinkSetHardwareAddr(l, datapath.TunnelMAC); err != nil {
		return fmt.Errorf("set %s address: %w", TunnelDevice, err)
	}
	// No ARP: the node's routes into the tunnel resolve to the device's own
	// (the tunnel) MAC, and to_tunnel drops what is not IPv4.
	if err := netlink.LinkSetARPOff(l); err != nil {
		return fmt.Errorf("set %s noarp: %w", TunnelDevice, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", TunnelDevice, err)
	}
	return nil
}

// syncTunnelNodes writes this node's CIDR, the static --tunnel-node peers
// and the claims of moved VM addresses into the node map (tunnel mode; the
// Kubernetes source replaces the peers with SetTunnelPeers,
// SyncEndpointRoutes the claims).
func (a *Agent) syncTunnelNodes() error {
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	return a.writeTunnelNodesLocked()
}

func (a *Agent) writeTunnelNodesLocked() error {
	td := a.tunnelDP()
	if td == nil {
		return nil
	}
	if err := a.loadTunnelClaimsLocked(td); err != nil {
		return err
	}
	nodes := []datapath.TunnelNode{{PodCIDR: a.cfg.PodCIDR.Masked(), Underlay: netip.IPv4Unspecified(), Self: true}}
	peers := a.cfg.TunnelNodes
	if a.tunnelPeers != nil {
		peers = a.tunnelPeers
	}
	nodes = append(nodes, peers...)
	// The claims of moved VM addresses (epclaims.go) after the CIDRs: a
	// claim's /32 wins over a peer's /32 pod CIDR of the same address.
	claims := a.tunnelClaimNodes()
	nodes = append(nodes, claims...)
	return a.host.Do(func() error {
		if err := td.SetTunnelNodes(nodes); err != nil {
			return err
		}
		return syncTunnelRoutes(append(append([]datapath.TunnelNode{}, peers...), claims...))
	})
}

// ownSourcePorts: vx has an outer source port range of its own.
func ownSourcePorts(vx *netlink.Vxlan) bool {
	_, _, own := datapath.VXLANSourcePorts(vx)
	return own
}

// tunnelRouteProto marks the routes syncTunnelRoutes installs ("lk").
const tunnelRouteProto = netlink.RouteProtocol(0x4c)

// syncTunnelRoutes makes the routes into the tunnel device exactly one per
// peer's pod CIDR and per claim of a moved VM address (a /32; current
// namespace). They carry the node's own traffic to
// other nodes' pods (kubelet probes, hostNetwork pods, replies to pods):
// to_tunnel gives it the tunnel key. Pod traffic never uses them: the
// datapath encapsulates it before any route is consulted. Each route's
// preferred source is the node's address towards that peer's underlay
// address (the kernel's route to it), the outer source the VXLAN device
// gives the packet: the peer's from_tunnel accepts the node's own traffic
// as inner source = outer source (bpf/lib/tunnel.h), whatever other
// addresses the node has.
func syncTunnelRoutes(peers []datapath.TunnelNode) error {
	l, err := netlink.LinkByName(TunnelDevice)
	if err != nil {
		return fmt.Errorf("tunnel routes: %w", err)
	}
	type route struct {
		dst netip.Prefix
		src net.IP
	}
	srcs := map[netip.Addr]net.IP{}
	srcTowards := func(u netip.Addr) net.IP {
		if s, ok := srcs[u]; ok {
			return s
		}
		var s net.IP
		if rs, err := netlink.RouteGet(u.AsSlice()); err == nil && len(rs) > 0 && rs[0].Src.To4() != nil {
			s = rs[0].Src.To4()
		}
		srcs[u] = s
		return s
	}
	want := map[string]route{}
	for _, p := range peers {
		want[p.PodCIDR.Masked().String()] = route{p.PodCIDR.Masked(), srcTowards(p.Underlay)}
	}
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: l.Attrs().Index, Protocol: tunnelRouteProto},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("tunnel routes: %w", err)
	}
	for _, r := range have {
		if r.Dst == nil {
			continue
		}
		if _, ok := want[r.Dst.String()]; ok {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil {
			return fmt.Errorf("tunnel routes: delete %s: %w", r.Dst, err)
		}
	}
	for _, w := range want {
		p := w.dst
		dst := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Src: w.src, Scope: netlink.SCOPE_LINK, Protocol: tunnelRouteProto}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("tunnel routes: %s dev %s src %v: %w", p, TunnelDevice, w.src, err)
		}
	}
	return nil
}

// SetTunnelPeers makes peers the other nodes of the tunnel (from the
// Kubernetes Node objects), replacing --tunnel-node. No-op in native mode.
func (a *Agent) SetTunnelPeers(peers []datapath.TunnelNode) error {
	if a.cfg.RoutingMode != RoutingTunnel {
		return nil
	}
	var keep []datapath.TunnelNode
	for _, p := range peers {
		if p.PodCIDR.Overlaps(a.cfg.PodCIDR) {
			continue
		}
		keep = append(keep, p)
	}
	a.tunnelMu.Lock()
	defer a.tunnelMu.Unlock()
	a.tunnelPeers = append([]datapath.TunnelNode{}, keep...)
	return a.writeTunnelNodesLocked()
}

// RoutingMode is the agent's routing mode.
func (a *Agent) RoutingMode() string { return a.cfg.RoutingMode }

// syncTunnelIdentities writes the tunnel identity maps from the compiled
// policy's endpoint identities (every endpoint of the cluster). Called with
// ctl.mu after the policy maps were written.
func (a *Agent) syncTunnelIdentities() error {
	td := a.tunnelDP()
	c := a.ctl
	if td == nil || c == nil || c.compiled == nil {
		return nil
	}
	ids := map[policy.Identity]policy.IdentityInfo{}
	for _, id := range c.compiled.IPCache {
		if info, ok := c.ids.Info(id); ok {
			ids[id] = info
		}
	}
	if err := a.host.Do(func() error { return td.SetTunnelIdentities(ids) }); err != nil {
		return fmt.Errorf("tunnel identities: %w", err)
	}
	return nil
}

// routingInfo fills Status' routing part.
func (a *Agent) routingInfo() RoutingInfo {
	r := RoutingInfo{Mode: a.cfg.RoutingMode, PodMTU: a.mtu, Encryption: a.encryption, BIGTCP: a.bigTCP,
		Bandwidth: a.bandwidth + ": " + a.bandwidthWhy}
	if a.cfg.RoutingMode != RoutingTunnel {
		return r
	}
	r.Device, r.Port = a.tunnelDev, a.cfg.TunnelPort
	td := a.tunnelDP()
	if td == nil {
		return r
	}
	var errs []string
	a.host.Do(func() error {
		nodes, err := td.TunnelNodes()
		if err != nil {
			errs = append(errs, err.Error())
		}
		r.Nodes = nodes
		st, err := td.TunnelStats()
		if err != nil {
			errs = append(errs, err.Error())
		}
		r.Counters = map[string]uint64{}
		for k, v := range st {
			r.Counters[k.String()] = v
		}
		return nil
	})
	r.NodesError = strings.Join(errs, "; ")
	return r
}

// ParseTunnelNode parses --tunnel-node CIDR=ADDR (a peer's pod CIDR and
// underlay address).
func ParseTunnelNode(s string) (datapath.TunnelNode, error) {
	c, a, ok := strings.Cut(s, "=")
	p, err1 := netip.ParsePrefix(c)
	ip, err2 := netip.ParseAddr(a)
	if !ok || err1 != nil || err2 != nil || !p.Addr().Is4() || !ip.Is4() {
		return datapath.TunnelNode{}, fmt.Errorf("want POD_CIDR=UNDERLAY_IPV4 (e.g. 10.244.2.0/24=10.77.2.1), got %q", s)
	}
	return datapath.TunnelNode{PodCIDR: p.Masked(), Underlay: ip}, nil
}

// RoutingToProto converts RoutingInfo to its API form.
func RoutingToProto(r RoutingInfo) *apiv1.RoutingStatus {
	out := &apiv1.RoutingStatus{
		Mode: r.Mode, TunnelDevice: r.Device, TunnelPort: uint32(r.Port), PodMtu: uint32(r.PodMTU),
		TunnelCounters: r.Counters, Error: r.NodesError,
		Ipsec:     &apiv1.Feature{Supported: r.Encryption.IPsec.Supported, Detail: r.Encryption.IPsec.Detail},
		Wireguard: &apiv1.Feature{Supported: r.Encryption.WireGuard.Supported, Detail: r.Encryption.WireGuard.Detail},
		Bandwidth: r.Bandwidth,
		BigTcp:    &apiv1.BigTCP{Ipv4MaxSize: uint32(r.BIGTCP.Sizes.IPv4), Ipv6MaxSize: uint32(r.BIGTCP.Sizes.IPv6), Detail: r.BIGTCP.Detail},
	}
	for _, n := range r.Nodes {
		out.TunnelNodes = append(out.TunnelNodes, &apiv1.TunnelNode{PodCidr: n.PodCIDR.String(), Underlay: n.Underlay.String(), Self: n.Self})
	}
	return out
}
