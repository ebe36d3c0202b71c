package datapath

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/pkg/policy"
)

// Tunnel routing mode (bpf/lib/tunnel.h): packets for another node's pod
// CIDR are encapsulated by the node's collect_md VXLAN device, with the
// remote node from lk_tunnel_nodes and the sender's identity in the VNI.

// pinTunnelTC and pinTunnelEgress are the links of from_tunnel and
// to_tunnel on the VXLAN device.
const (
	pinTunnelTC     = "lk_tunnel_tc"
	pinTunnelEgress = "lk_tunnel_egress"
)

// TunnelMAC is the MAC every node's VXLAN device gets: the encapsulating
// side addresses the inner frame to it (bpf/lib/tunnel.h tunnel_mac).
var TunnelMAC = net.HardwareAddr{0x02, 0x4c, 0x4b, 0x54, 0x4e, 0x4c}

// TunnelSrcMAC is the inner frame's source (never the receiving device's
// own MAC, which VXLAN drops as a loop).
var TunnelSrcMAC = net.HardwareAddr{0x02, 0x4c, 0x4b, 0x54, 0x4e, 0x53}

// TunnelStat names a tunnel counter (enum lk_tunnel_stat).
type TunnelStat uint32

const (
	TunnelEncap       = TunnelStat(podLkTunnelStatTUNNEL_STAT_ENCAP)        // encapsulated toward another node
	TunnelDecap       = TunnelStat(podLkTunnelStatTUNNEL_STAT_DECAP)        // received from the tunnel device
	TunnelVNIIdentity = TunnelStat(podLkTunnelStatTUNNEL_STAT_VNI_IDENTITY) // received with a VNI that mapped to an identity
	TunnelOversize    = TunnelStat(podLkTunnelStatTUNNEL_STAT_OVERSIZE)     // too big for the tunnel: to the stack (ICMP frag needed)
	TunnelEncapErr    = TunnelStat(podLkTunnelStatTUNNEL_STAT_ENCAP_ERR)    // setting the tunnel key failed
	TunnelHostEncap   = TunnelStat(podLkTunnelStatTUNNEL_STAT_HOST_ENCAP)   // the node's own packets into the tunnel
	TunnelDecapUplink = TunnelStat(podLkTunnelStatTUNNEL_STAT_DECAP_UPLINK) // of TunnelDecap: decapsulated in from_uplink, the kernel's VXLAN receive skipped
	TunnelEncapBPF    = TunnelStat(podLkTunnelStatTUNNEL_STAT_ENCAP_BPF)    // of TunnelEncap: encapsulated in BPF, the kernel's VXLAN transmit skipped
	tunnelStatMax     = int(podLkTunnelStatTUNNEL_STAT_MAX)
)

func (s TunnelStat) String() string {
	switch s {
	case TunnelEncap:
		return "encap"
	case TunnelDecap:
		return "decap"
	case TunnelVNIIdentity:
		return "vni-identity"
	case TunnelOversize:
		return "oversize"
	case TunnelEncapErr:
		return "encap-error"
	case TunnelHostEncap:
		return "host-encap"
	case TunnelDecapUplink:
		return "decap-uplink"
	case TunnelEncapBPF:
		return "encap-bpf"
	}
	return "unknown"
}

// TunnelStats are the tunnel counters summed over CPUs.
type TunnelStats map[TunnelStat]uint64

// TunnelNode is one node of the tunnel mesh: its pod CIDR and the underlay
// address its VXLAN device receives on.
type TunnelNode struct {
	PodCIDR  netip.Prefix
	Underlay netip.Addr
	Self     bool // this node's own CIDR: never encapsulated
	// Claim: a moved VM address (a /32) that Underlay's node claims, next
	// to the pod CIDRs (the LPM lookup prefers it). The datapath reads only
	// TUNNEL_NODE_F_SELF; the flag lets a restarted agent tell the claims
	// it keeps from the node CIDRs it rewrites.
	Claim bool
}

// Flags of a node map value: TUNNEL_NODE_F_SELF (bpf/lib/tunnel.h), and
// the agent's own mark of claim entries (ignored by the datapath).
const (
	tunnelNodeSelf  = 1
	tunnelNodeClaim = 2
)

// tunnelDev is the VXLAN device of tunnel mode as the programs know it:
// its ifindex (0: native routing) and UDP port.
type tunnelDev struct {
	ifindex uint32
	port    uint16
	// sportMin, sportMax: the outer UDP source port range the device
	// draws from (udp_flow_src_port), which tunnel_bpf_encap follows.
	sportMin, sportMax uint32
}

// setTunnel sets tunnel_ifindex, tunnel_port and the source port range in a
// program spec (native routing: all 0, nothing encapsulates).
func setTunnel(spec *ebpf.CollectionSpec, d tunnelDev) error {
	for name, v := range map[string]any{"tunnel_ifindex": d.ifindex, "tunnel_port": d.port,
		"tunnel_sport_min": d.sportMin, "tunnel_sport_max": d.sportMax} {
		sv, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("set %s: not in the program", name)
		}
		if err := sv.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// tunnelDevice resolves Config.Tunnel (zero when empty): the port is the
// device's own, the one its socket listens on, so the programs guard the
// port that is really open (tunnel_port_guard).
func (c Config) tunnelDevice() (tunnelDev, error) {
	if c.Tunnel == "" {
		return tunnelDev{}, nil
	}
	l, err := netlink.LinkByName(c.Tunnel)
	if err != nil {
		return tunnelDev{}, fmt.Errorf("tunnel device %q: %w", c.Tunnel, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok || vx.Port <= 0 || vx.Port > 65535 {
		return tunnelDev{}, fmt.Errorf("tunnel device %q: not a VXLAN device with a UDP port (%s)", c.Tunnel, l.Type())
	}
	lo, hi, _ := VXLANSourcePorts(vx)
	return tunnelDev{ifindex: uint32(l.Attrs().Index), port: uint16(vx.Port), sportMin: uint32(lo), sportMax: uint32(hi)}, nil
}

// VXLANSourcePorts is the outer UDP source port range [lo, hi) device vx
// draws from (udp_flow_src_port): its own when it has one (own: low below
// high, as the kernel decides), else the
// current namespace's local port range, which the device reads at each
// transmit and the programs when they load — a later change of it then
// gives a flow two outer ports until the next load (the agent's device
// always has its own: ensureVXLAN).
func VXLANSourcePorts(vx *netlink.Vxlan) (lo, hi uint16, own bool) {
	if vx.PortLow < vx.PortHigh {
		return uint16(vx.PortLow), uint16(vx.PortHigh), true
	}
	lo, hi = LocalPortRange()
	return lo, hi, false
}

// LocalPortRange reads the current network namespace's
// net.ipv4.ip_local_port_range (the kernel's default when unreadable): the
// outer UDP source ports a VXLAN device without a range of its own draws
// from ([lo, hi): udp_flow_src_port).
func LocalPortRange() (uint16, uint16) {
	var lo, hi uint16
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768, 60999
	}
	if n, err := fmt.Sscan(string(b), &lo, &hi); err != nil || n != 2 || lo == 0 || lo >= hi {
		return 32768, 60999
	}
	return lo, hi
}

// attachTunnel attaches from_tunnel to the VXLAN device (tunnel mode), or
// removes a pinned attachment left by a tunnel-mode agent (native mode).
func (l *Loader) attachTunnel() error {
	d, err := l.cfg.tunnelDevice()
	if err != nil {
		return err
	}
	idx := d.ifindex
	if idx == 0 {
		return errors.Join(l.detach(pinTunnelTC), l.detach(pinTunnelEgress))
	}
	if err := l.attach(pinTunnelTC, int(idx), attachTCXIngress, l.uplink.FromTunnel); err != nil {
		return fmt.Errorf("tunnel %s: %w", l.cfg.Tunnel, err)
	}
	if err := l.attach(pinTunnelEgress, int(idx), attachTCXEgress, l.uplink.ToTunnel); err != nil {
		return fmt.Errorf("tunnel %s: %w", l.cfg.Tunnel, err)
	}
	return nil
}

func tunnelKey(p netip.Prefix) podTunnelNodeKey {
	return podTunnelNodeKey{Prefixlen: uint32(p.Bits()), Addr: ipKey(p.Masked().Addr().As4())}
}

// SetTunnelNodes makes nodes the tunnel's node map (replacing what was
// there). Only IPv4 pod CIDRs and underlay addresses.
func (l *Loader) SetTunnelNodes(nodes []TunnelNode) error {
	want := map[podTunnelNodeKey]podTunnelNode{}
	peers := map[uint32]uint32{}
	for _, n := range nodes {
		if !n.PodCIDR.Addr().Is4() || !n.Underlay.Is4() {
			return fmt.Errorf("set tunnel nodes: %v via %v: want IPv4", n.PodCIDR, n.Underlay)
		}
		v := podTunnelNode{Underlay: ipKey(n.Underlay.As4())}
		if n.Self {
			v.Flags |= tunnelNodeSelf
		} else if !n.Underlay.IsUnspecified() {
			peers[v.Underlay] = 0 // from_tunnel's known outer sources
		}
		if n.Claim {
			v.Flags |= tunnelNodeClaim
		}
		want[tunnelKey(n.PodCIDR)] = v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.pod.LkTunnelNodes
	var (
		k     podTunnelNodeKey
		v     podTunnelNode
		stale []podTunnelNodeKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("set tunnel nodes: %w", err)
	}
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("set tunnel nodes: %w", err)
		}
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("set tunnel nodes: %w", err)
		}
	}
	// The peers after the node map: a new node's pod CIDR is known before
	// its packets are accepted, a gone node's stale entries are gone first.
	if err := replaceU32Map(l.pod.LkTunnelPeers, peers); err != nil {
		return fmt.Errorf("set tunnel nodes: peers: %w", err)
	}
	return nil
}

// TunnelPeers lists the underlay addresses from_tunnel accepts as outer
// sources (lk_tunnel_peers), sorted.
func (l *Loader) TunnelPeers() ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		k, v uint32
		out  []netip.Addr
	)
	it := l.pod.LkTunnelPeers.Iterate()
	for it.Next(&k, &v) {
		out = append(out, keyIP(k))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("tunnel peers: %w", err)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// TunnelNodes lists the node map, by pod CIDR.
func (l *Loader) TunnelNodes() ([]TunnelNode, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		k   podTunnelNodeKey
		v   podTunnelNode
		out []TunnelNode
	)
	it := l.pod.LkTunnelNodes.Iterate()
	for it.Next(&k, &v) {
		out = append(out, TunnelNode{
			PodCIDR:  netip.PrefixFrom(keyIP(k.Addr), int(k.Prefixlen)),
			Underlay: keyIP(v.Underlay),
			Self:     v.Flags&tunnelNodeSelf != 0,
			Claim:    v.Flags&tunnelNodeClaim != 0,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("tunnel nodes: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PodCIDR.String() < out[j].PodCIDR.String() })
	return out, nil
}

// keyIP is ipKey's inverse.
func keyIP(k uint32) netip.Addr {
	var b [4]byte
	nativeEndian.PutUint32(b[:], k)
	return netip.AddrFrom4(b)
}

// TunnelVNI is the cluster-wide tunnel identity of an endpoint identity's
// (namespace, labels) set: FNV-1a of the set folded into 24 bits, never 0
// (VNI 0: "resolve the source address"). Every node computes the same VNI for
// the same set, whatever local number its policy compiler gave it.
func TunnelVNI(info policy.IdentityInfo) uint32 {
	h := fnv.New32a()
	h.Write([]byte(info.Namespace))
	keys := make([]string, 0, len(info.Labels))
	for k := range info.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		h.Write([]byte{0})
		h.Write([]byte(k))
		h.Write([]byte{'='})
		h.Write([]byte(info.Labels[k]))
	}
	s := h.Sum32()
	vni := (s ^ s>>24) & 0xffffff
	if vni == 0 {
		vni = 1
	}
	return vni
}

// TunnelIdentities computes the two tunnel identity maps from the endpoint
// identities in use: local identity -> VNI and VNI -> local identity. A VNI
// two label sets share maps to neither (the receiver resolves the address,
// as native routing does).
func TunnelIdentities(ids map[policy.Identity]policy.IdentityInfo) (toVNI map[uint32]uint32, toIdent map[uint32]uint32) {
	toVNI, toIdent = map[uint32]uint32{}, map[uint32]uint32{}
	owners := map[uint32][]policy.Identity{}
	for id, info := range ids {
		if id.IsCIDR() || id == policy.IdentityAny {
			continue
		}
		vni := TunnelVNI(info)
		owners[vni] = append(owners[vni], id)
	}
	for vni, o := range owners {
		if len(o) != 1 {
			continue
		}
		toVNI[uint32(o[0])] = vni
		toIdent[vni] = uint32(o[0])
	}
	return toVNI, toIdent
}

// SetTunnelIdentities replaces the tunnel identity maps (TunnelIdentities).
func (l *Loader) SetTunnelIdentities(ids map[policy.Identity]policy.IdentityInfo) error {
	toVNI, toIdent := TunnelIdentities(ids)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := replaceU32Map(l.pod.LkTunnelVni, toVNI); err != nil {
		return fmt.Errorf("set tunnel identities: %w", err)
	}
	if err := replaceU32Map(l.pod.LkTunnelIdent, toIdent); err != nil {
		return fmt.Errorf("set tunnel identities: %w", err)
	}
	return nil
}

func replaceU32Map(m *ebpf.Map, want map[uint32]uint32) error {
	var (
		k, v  uint32
		stale []uint32
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if w, ok := want[k]; !ok || w != v {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return err
		}
	}
	return nil
}

// PinnedTunnelStats reads the tunnel counters pinned in pinDir.
func PinnedTunnelStats(pinDir string) (TunnelStats, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "lk_tunnel_stats"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("tunnel stats: %w", err)
	}
	defer m.Close()
	return readTunnelStats(m)
}

func readTunnelStats(m *ebpf.Map) (TunnelStats, error) {
	out := TunnelStats{}
	for i := 0; i < tunnelStatMax; i++ {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("tunnel stats %d: %w", i, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[TunnelStat(i)] = sum
	}
	return out, nil
}

// TunnelStats reads the tunnel counters.
func (l *Loader) TunnelStats() (TunnelStats, error) {
	return readTunnelStats(l.pod.LkTunnelStats)
}
