// Package datapath loads lanekit's BPF programs (compiled at build time with
// bpf2go), pins them under the BPF filesystem and keeps the maps that the
// programs forward by. Everything pinned keeps forwarding while the agent is
// down; a restarted agent re-adopts what it finds pinned.
package datapath

import (
	"errors"
	"net"
	"net/netip"
)

// ErrNotSupported is returned when the running kernel lacks a feature that
// an operation needs (detected by probes, never by version strings).
var ErrNotSupported = errors.New("not supported by this kernel")

// DeviceMode says what kind of pod device carries an endpoint.
type DeviceMode string

const (
	ModeVeth DeviceMode = "veth" // veth pair, tcx programs on the host end
	// ModeNetkit is a netkit pair in L3 mode (pkg/netdev creates them so):
	// IFF_NOARP and all-zero MACs, so the datapath does not check the source
	// MAC (the source IP is the identity) and drops ARP from it.
	ModeNetkit DeviceMode = "netkit"
	// ModeNetkitL2 is a netkit pair in L2 mode: Ethernet devices with MACs
	// and ARP, as a veth pair is to the datapath (same checks, same ARP
	// answers) — for workloads that need MACs (KubeVirt's bridge-style
	// guests, Kata) — with netkit's attach points.
	ModeNetkitL2 DeviceMode = "netkit-l2"
)

// Netkit reports whether m is a netkit pair (either mode).
func (m DeviceMode) Netkit() bool { return m == ModeNetkit || m == ModeNetkitL2 }

// Endpoint is what the datapath needs to forward to and from one local pod.
type Endpoint struct {
	ID      uint32           // agent-assigned, stable across restarts, > 0
	Mode    DeviceMode       // device kind, decides how programs attach
	IfName  string           // host-side device name (veth host end / netkit primary)
	IfIndex int              // host-side device ifindex
	IP      netip.Addr       // the endpoint's IPv4 address
	IP6     netip.Addr       // the endpoint's IPv6 address; invalid: none (its IPv6 is dropped)
	MAC     net.HardwareAddr // the endpoint's own MAC (inside the pod)
	HostMAC net.HardwareAddr // host-side device MAC: the pod's gateway MAC
	Queues  uint16           // rx queues of the endpoint's device; > 1 spreads flows (VMs)
	VM      bool             // a VM endpoint: delivered through the device, to the AF_XDP steering
	// DHCP: what a VM endpoint's DHCP server offers beside the lease
	// (DNS, search domains, MTU); ignored for pods.
	DHCP DHCPOptions
}

// Endpoint flags (enum lk_endpoint_flags in bpf/lib/consts.h, generated).
const (
	epFlagVM = uint16(podLkEndpointFlagsEP_F_VM)
	epFlagL3 = uint16(podLkEndpointFlagsEP_F_L3) // netkit L3: no MACs, no ARP
)

// DropReason is a named code for why the datapath dropped a packet. The
// numbers come from enum lk_drop_reason in bpf/lib/consts.h (bpf2go -type).
type DropReason uint32

const (
	DropNone        DropReason = 0
	DropSpoofedMAC  DropReason = DropReason(podLkDropReasonDROP_SPOOFED_MAC)    // source MAC is not the endpoint's
	DropSpoofedIP   DropReason = DropReason(podLkDropReasonDROP_SPOOFED_IP)     // source IP is not the endpoint's
	DropUnknownEP   DropReason = DropReason(podLkDropReasonDROP_UNKNOWN_EP)     // packet from a device with no endpoint entry
	DropMalformed   DropReason = DropReason(podLkDropReasonDROP_MALFORMED)      // truncated or invalid headers
	DropTTLExceeded DropReason = DropReason(podLkDropReasonDROP_TTL_EXCEEDED)   // TTL would reach zero when routed
	DropFIBFailed   DropReason = DropReason(podLkDropReasonDROP_FIB_FAILED)     // no route (blackhole, unreachable, prohibited)
	DropRedirect    DropReason = DropReason(podLkDropReasonDROP_REDIRECT)       // redirect helper failed
	DropUnsupported DropReason = DropReason(podLkDropReasonDROP_UNSUPPORTED_L3) // L3 protocol the datapath does not route (IPv6 from an endpoint without an IPv6 address)
	DropNoSocket    DropReason = DropReason(podLkDropReasonDROP_NO_SOCKET)      // VM frame but no AF_XDP socket on its queue (backend down)
	DropNotForVM    DropReason = DropReason(podLkDropReasonDROP_NOT_FOR_VM)     // unicast frame for another MAC on a VM device
	DropVLAN        DropReason = DropReason(podLkDropReasonDROP_VLAN)           // 802.1Q/802.1ad tagged frame from an endpoint
	// [LB]
	DropNoBackend DropReason = DropReason(podLkDropReasonDROP_NO_BACKEND)  // service without a backend: TCP reset / ICMP unreachable sent
	DropNATNoPort DropReason = DropReason(podLkDropReasonDROP_NAT_NO_PORT) // no free source port for a NodePort/hairpin SNAT
	// [/LB]
	// policy (policy.go)
	DropPolicyIngress DropReason = DropReason(podLkDropReasonDROP_POLICY_INGRESS) // the receiving local endpoint's NetworkPolicy ingress denies it
	DropPolicyEgress  DropReason = DropReason(podLkDropReasonDROP_POLICY_EGRESS)  // the sending local endpoint's NetworkPolicy egress denies it
	// fragments (bpf/lib/frag.h)
	DropFragNotFound DropReason = DropReason(podLkDropReasonDROP_FRAG_NOT_FOUND) // a later fragment (IPv4 or IPv6) whose first fragment was not seen (or came later)
	// traffic policy Local (bpf/lib/lb.h)
	DropNoLocalBackend DropReason = DropReason(podLkDropReasonDROP_NO_LOCAL_BACKEND) // a traffic policy Local frontend without an endpoint on this node
	// IPv6 (bpf/lib/ipv6.h, ndp.h)
	DropIPv6ExtHdrs DropReason = DropReason(podLkDropReasonDROP_IPV6EXT_HDRS) // extension-header chain truncated or too long
	DropRouterMsg   DropReason = DropReason(podLkDropReasonDROP_ROUTER_MSG)   // RA, ICMPv6 redirect or DHCPv6 server message from an endpoint
	DropPolicyIPv6  DropReason = DropReason(podLkDropReasonDROP_POLICY_IPV6)  // retired (IPv6 policy is enforced now): never counted; kept so no reason is renumbered
	// tunnel mode (bpf/lib/tunnel.h)
	DropTunnelPort        DropReason = DropReason(podLkDropReasonDROP_TUNNEL_PORT)         // UDP from an endpoint to a node address's VXLAN port
	DropTunnelUnknownNode DropReason = DropReason(podLkDropReasonDROP_TUNNEL_UNKNOWN_NODE) // from the tunnel: outer source is no other node's underlay address
	DropTunnelForeignSrc  DropReason = DropReason(podLkDropReasonDROP_TUNNEL_FOREIGN_SRC)  // from the tunnel: inner source not the sending node's (pod CIDR, claim, itself)
	// bandwidth (bpf/lib/edt.h)
	DropEDTHorizon DropReason = DropReason(podLkDropReasonDROP_EDT_HORIZON) // the endpoint's egress limit would hold the packet past the horizon
	// [LB] to a LoadBalancer ingress IP from a source outside its
	// loadBalancerSourceRanges
	DropLBSrcRange DropReason = DropReason(podLkDropReasonDROP_LB_SRC_RANGE)
	// a VM's DHCP message its link's server does not answer (bpf/lib/dhcp.h)
	DropDHCP DropReason = DropReason(podLkDropReasonDROP_DHCP)
)

func (r DropReason) String() string {
	switch r {
	case DropNone:
		return "none"
	case DropSpoofedMAC:
		return "spoofed-mac"
	case DropSpoofedIP:
		return "spoofed-ip"
	case DropUnknownEP:
		return "unknown-endpoint"
	case DropMalformed:
		return "malformed"
	case DropTTLExceeded:
		return "ttl-exceeded"
	case DropFIBFailed:
		return "fib-failed"
	case DropRedirect:
		return "redirect-failed"
	case DropUnsupported:
		return "unsupported-l3"
	case DropNoSocket:
		return "vm-socket-missing"
	case DropNotForVM:
		return "not-for-vm"
	case DropVLAN:
		return "vlan-tagged"
	case DropNoBackend: // [LB]
		return "no-backend"
	case DropNATNoPort: // [LB]
		return "nat-no-port"
	case DropPolicyIngress:
		return "policy-ingress"
	case DropPolicyEgress:
		return "policy-egress"
	case DropFragNotFound:
		return "frag-not-found"
	case DropNoLocalBackend:
		return "no-local-backend"
	case DropIPv6ExtHdrs:
		return "ipv6-ext-headers"
	case DropRouterMsg:
		return "router-message"
	case DropPolicyIPv6:
		return "policy-ipv6-unenforced"
	case DropTunnelPort:
		return "tunnel-port"
	case DropTunnelUnknownNode:
		return "tunnel-unknown-node"
	case DropTunnelForeignSrc:
		return "tunnel-foreign-source"
	case DropEDTHorizon:
		return "bandwidth-horizon"
	case DropLBSrcRange:
		return "lb-src-range"
	case DropDHCP:
		return "dhcp-unanswered"
	}
	return "unknown"
}

// Counters are one endpoint's packet counters, summed over CPUs.
// "From" is traffic the endpoint sent, "To" is traffic delivered to it.
type Counters struct {
	FromPackets, FromBytes uint64
	ToPackets, ToBytes     uint64
	// StackPackets/StackBytes: of what the endpoint sent, what the datapath
	// handed to the host stack instead of forwarding it itself (for the
	// host, broadcast/multicast, TTL 1, too big for the egress MTU).
	StackPackets, StackBytes uint64
	Drops                    map[DropReason]uint64
}

// Datapath is what the agent drives. The real implementation is *Loader;
// tests of the agent use a fake.
type Datapath interface {
	// UpsertEndpoint attaches the pod programs to ep's host device (or
	// updates the attachment in place if one is pinned) and writes the
	// endpoint's map entries. It is idempotent.
	UpsertEndpoint(ep Endpoint) error
	// DeleteEndpoint detaches and removes ep's map entries and pins.
	// Deleting what is already gone is not an error.
	DeleteEndpoint(ep Endpoint) error
	// Endpoints lists the endpoint IDs present in the datapath maps.
	Endpoints() ([]uint32, error)
	// Counters returns ep's counters.
	Counters(id uint32) (Counters, error)
	// Close releases the agent's handles; pinned objects stay and keep forwarding.
	Close() error
}

// Config is how an agent opens the datapath. One agent (one node) owns one
// PinDir; the lab runs several agents, each with its own PinDir.
type Config struct {
	PinDir string // where programs, maps and links are pinned, e.g. /sys/fs/bpf/lanekit
	Uplink string // the node's uplink device (the "wire"); ingress to pods is steered there
	// GatewayIP is the address pods route through; the datapath answers
	// their ARP requests for it. Zero means DefaultGatewayIP.
	GatewayIP netip.Addr
	// ConntrackEntries sizes the conntrack table lk_ct4 (0: 262144). A pinned
	// table of another size is migrated: its flows are copied into one of
	// this size (migrate.go).
	ConntrackEntries int
	// LBFrontends sizes the service frontend maps (lk_lb_svc(6),
	// lk_lb_revnat(6), lk_lb_maglev; 0: DefaultLBFrontends) and LBBackends
	// the backend maps (lk_lb_backends(6); 0: DefaultLBBackends). Pinned maps
	// of another size are migrated (migrate.go).
	LBFrontends, LBBackends int
	// PolicyMaps sizes the policy and tunnel maps (a 0 field: its default).
	// Pinned maps of another size are migrated.
	PolicyMaps PolicySizes
	// SNATPortMin..SNATPortMax is the source port range NodePort (to a
	// remote backend) and hairpin SNAT allocate from (0, 0: 61000-65535,
	// DefaultSNATPortMin/Max). It must not be the node's ephemeral range
	// (net.ipv4.ip_local_port_range): reserve it with
	// net.ipv4.ip_local_reserved_ports, as the README says.
	SNATPortMin, SNATPortMax uint16
	// Tunnel is the node's collect_md VXLAN device (tunnel routing mode,
	// tunnel.go); empty: native routing.
	Tunnel string
	// HostPF is a DPU's host-facing PF representor (lanekitd --mode dpu
	// --dpu-host-pf): from_host load-balances the host's own ClusterIP
	// traffic there; empty: none.
	HostPF string

	traceRedirects bool // fixtures: record each redirect decision
}

// DefaultGatewayIP is the link-local next hop every pod routes through.
var DefaultGatewayIP = netip.MustParseAddr("169.254.1.1")

// GatewayIP6 is the IPv6 next hop every pod routes through (gateway_ip6 in
// bpf/lib/ndp.h, which answers the pods' neighbour solicitations for it).
var GatewayIP6 = netip.MustParseAddr("fe80::1")
