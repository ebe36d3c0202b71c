/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tunnel.h: VXLAN tunnel routing mode (the agent's --routing-mode tunnel).
 *
 * The node has one external-metadata (collect_md) VXLAN device; its ifindex
 * is the load-time setting tunnel_ifindex (0: native routing, nothing here
 * runs). A packet for a pod on another node, whose pod CIDR lk_tunnel_nodes
 * maps to that node's underlay address, gets its tunnel key set
 * (bpf_skb_set_tunnel_key: remote address, VNI) and is redirected to the
 * VXLAN device, which encapsulates it: the kernel's UDP tunnel code picks
 * the outer UDP source port from the inner flow hash, and GSO packets stay
 * GSO (UDP tunnel segmentation happens at the uplink, in hardware where it
 * can). No kernel route to another node's pod CIDR is needed or used.
 *
 * The VNI carries the sender's security identity as Cilium does, so the
 * receiving node's ingress policy does not depend on knowing the remote pod's
 * address. Identities are node-local numbers (pkg/policy allocates them in
 * order of arrival), so the wire carries a cluster-wide tunnel identity, a
 * hash of the (namespace, labels) set, and each node maps it to and from its
 * own numbers: lk_tunnel_vni (local identity -> VNI, sender) and
 * lk_tunnel_ident (VNI -> local identity, receiver). VNI 0 (no entry, a hash
 * two label sets share, a source that is no local endpoint such as a
 * NodePort flow's node address) means "resolve the inner source address",
 * as native routing does.
 *
 * The VNI is trusted only as far as the packet's origin is: from_tunnel
 * accepts a packet whose outer source is another node's underlay address
 * (lk_tunnel_peers) and whose inner source, if a pod's, is one of that
 * node's (its pod CIDR, a moved VM address it claims), takes the VNI's
 * identity only for those, and drops the rest (DROP_TUNNEL_UNKNOWN_NODE,
 * DROP_TUNNEL_FOREIGN_SRC: tunnel_rx_check). So no node speaks for another
 * node's pods, and nothing that is no node speaks at all. A pod cannot
 * speak as its own node either: from_pod drops an endpoint's UDP to the
 * tunnel port of any node address (DROP_TUNNEL_PORT: tunnel_port_guard), the
 * one way it could have reached a VXLAN socket with a VNI of its choosing,
 * and with its node's address as the outer source where the node
 * masquerades pod traffic.
 *
 * Include after fib.h's helpers (drop, to_stack, fits_mtu): route_ipv4 asks
 * tunnel_route first. */
#ifndef LK_TUNNEL_H
#define LK_TUNNEL_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "deliver.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"

#define LK_TUNNEL_MAX_NODES 4096
#define LK_TUNNEL_MAX_IDENTITIES 65536
#define LK_TUNNEL_TTL 64

/* Load-time settings: the VXLAN device (0: native routing) and its UDP
 * port (host order). */
const volatile __u32 tunnel_ifindex = 0;
const volatile __u16 tunnel_port = 0;

/* Every node's VXLAN device has this MAC (the agent sets it), so the inner
 * frame is addressed to the receiving device (PACKET_HOST after decap). */
static const __u8 tunnel_mac[6] = { 0x02, 0x4c, 0x4b, 0x54, 0x4e, 0x4c };
/* ... and comes from this one: never the device's own MAC, which the
 * receiving VXLAN device drops as a loop (vxlan_set_mac). */
static const __u8 tunnel_src_mac[6] = { 0x02, 0x4c, 0x4b, 0x54, 0x4e, 0x53 };

/* bpf_skb_set_tunnel_key flags: outer UDP checksum 0, as RFC 7348 says an
 * IPv4 VXLAN sender should (the helper asks for one by default; the
 * device's own udpcsum setting does not apply to collect_md). The inner
 * packet keeps its own checksums, and the receiving node's from_uplink
 * decapsulates only packets without one (tunnel_uplink_decap). */
#define TUNNEL_KEY_FLAGS BPF_F_ZERO_CSUM_TX

/* lk_tunnel_nodes key: an LPM trie key over pod CIDRs. */
struct tunnel_node_key {
	__u32 prefixlen;
	__be32 addr;
};

/* lk_tunnel_nodes value: the node owning the pod CIDR. */
struct tunnel_node {
	__be32 underlay; /* the node's underlay IPv4 address: the outer destination */
	__u32 flags; /* TUNNEL_NODE_F_SELF: this node's own CIDR (never encapsulated) */
};

#define TUNNEL_NODE_F_SELF 1

/* Counters: index into lk_tunnel_stats (per CPU). */
enum lk_tunnel_stat {
	TUNNEL_STAT_ENCAP = 0, /* packets encapsulated toward another node */
	TUNNEL_STAT_DECAP = 1, /* packets received from the tunnel device */
	TUNNEL_STAT_VNI_IDENTITY = 2, /* received with a VNI that mapped to a local identity */
	TUNNEL_STAT_OVERSIZE = 3, /* too big for the tunnel: to the host stack (ICMP frag needed or fragments) */
	TUNNEL_STAT_ENCAP_ERR = 4, /* bpf_skb_set_tunnel_key failed (dropped) */
	TUNNEL_STAT_HOST_ENCAP = 5, /* the node's own packets to another node's pod (to_tunnel) */
	TUNNEL_STAT_DECAP_UPLINK = 6, /* of DECAP: decapsulated in from_uplink, the kernel's VXLAN receive skipped */
	TUNNEL_STAT_ENCAP_BPF = 7, /* of ENCAP: encapsulated by tunnel_bpf_encap, the kernel's VXLAN transmit skipped */
	TUNNEL_STAT_MAX = 8,
};
const enum lk_tunnel_stat *lk_unused_tunnel_stat __attribute__((unused));

/* Pod CIDR -> the node it lives on (agent: from Node objects or --tunnel-node). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LK_TUNNEL_MAX_NODES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tunnel_node_key);
	__type(value, struct tunnel_node);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_tunnel_nodes SEC(".maps");

/* The other nodes' underlay addresses (the agent: every non-self value of
 * lk_tunnel_nodes): the outer sources from_tunnel accepts, and destinations
 * whose tunnel port no endpoint may reach. Value unused (0). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_TUNNEL_MAX_NODES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __be32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_tunnel_peers SEC(".maps");

/* Local identity -> VNI (cluster-wide tunnel identity), sender side. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_TUNNEL_MAX_IDENTITIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_tunnel_vni SEC(".maps");

/* VNI -> local identity, receiver side. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_TUNNEL_MAX_IDENTITIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_tunnel_ident SEC(".maps");

/* Tunnel counters (enum lk_tunnel_stat), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TUNNEL_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_tunnel_stats SEC(".maps");

static __always_inline void tunnel_count(__u32 stat)
{
	__u64 *v = bpf_map_lookup_elem(&lk_tunnel_stats, &stat);

	if (v)
		(*v)++;
}

/* tunnel_vni_of returns the VNI for a packet the local endpoint with address
 * src sent (0: the receiver resolves the address). */
static __always_inline __u32 tunnel_vni_of(__be32 src)
{
	__u32 id = policy_endpoint_identity(src);
	__u32 *vni;

	if (!id)
		return 0;
	vni = bpf_map_lookup_elem(&lk_tunnel_vni, &id);
	return vni ? *vni & 0xffffff : 0;
}

/* tunnel_identity_of maps a received VNI to this node's identity (0: unknown,
 * resolve the inner source address). Counted (TUNNEL_STAT_VNI_IDENTITY) by
 * the path that takes the packet, once: a packet from_uplink judged and then
 * left to the device is judged again by from_tunnel. */
static __always_inline __u32 tunnel_identity_of(__u32 vni)
{
	__u32 *id;

	if (!vni)
		return 0;
	id = bpf_map_lookup_elem(&lk_tunnel_ident, &vni);
	return id ? *id : 0;
}

/* tunnel_src_check judges where a decapsulated packet comes from: outer,
 * its outer source; src, its inner IPv4 source; vni, the VNI it carried.
 * The outer source must be another node's underlay address
 * (lk_tunnel_peers; else DROP_TUNNEL_UNKNOWN_NODE). The inner source, when
 * some pod CIDR or moved VM claim of lk_tunnel_nodes holds it, must be the
 * sending node's: then *ident is the identity its VNI carries. Any other
 * inner source is the sending node's stack (its underlay address, another of
 * its addresses a hostNetwork socket answers from, a NodePort flow it
 * source-NATed to the address its client dialed), judged by address (*ident
 * 0: a VNI never lends it a pod's identity), unless it is another node's
 * underlay address or one of this node's own (the host identity). Else
 * DROP_TUNNEL_FOREIGN_SRC. Returns 0 or a drop reason. */
static __always_inline __u32 tunnel_src_check(__be32 outer, __be32 src, __u32 vni, __u32 *ident)
{
	struct tunnel_node_key k = { .prefixlen = 32, .addr = src };
	struct tunnel_node *n;

	*ident = 0;
	if (!bpf_map_lookup_elem(&lk_tunnel_peers, &outer))
		return DROP_TUNNEL_UNKNOWN_NODE;
	if (src == outer)
		return 0; /* the node itself */
	n = bpf_map_lookup_elem(&lk_tunnel_nodes, &k);
	if (n) {
		if ((n->flags & TUNNEL_NODE_F_SELF) || n->underlay != outer)
			return DROP_TUNNEL_FOREIGN_SRC; /* a pod of this node's or a third node's */
		*ident = tunnel_identity_of(vni);
		return 0;
	}
	if (bpf_map_lookup_elem(&lk_tunnel_peers, &src) || policy_endpoint_identity(src) == LK_IDENTITY_HOST)
		return DROP_TUNNEL_FOREIGN_SRC; /* speaking as another node, or as this one */
	return 0;
}

/* tunnel_rx_check is tunnel_src_check for a packet the tunnel device
 * decapsulated (from_tunnel): the outer source and VNI from its tunnel
 * metadata (none, or an IPv6 underlay: DROP_TUNNEL_UNKNOWN_NODE), the inner
 * packet IPv4 (the tunnel carries nothing else: else
 * DROP_TUNNEL_FOREIGN_SRC). Not inlined: the tunnel key stays off the
 * caller's stack, which from_wire's pipeline fills nearly to the limit. */
static __noinline __attribute__((unused)) __u32 tunnel_rx_check(struct __sk_buff *skb, __u32 *ident)
{
	struct bpf_tunnel_key key = {};
	__be16 proto;
	__be32 outer, src;

	if (!skb || !ident || bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return DROP_TUNNEL_UNKNOWN_NODE;
	outer = bpf_htonl(key.remote_ipv4);
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)) < 0 ||
	    proto != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, saddr), &src, sizeof(src)) < 0)
		return bpf_map_lookup_elem(&lk_tunnel_peers, &outer) ? DROP_TUNNEL_FOREIGN_SRC : DROP_TUNNEL_UNKNOWN_NODE;
	return tunnel_src_check(outer, src, key.tunnel_id, ident);
}

/* The VXLAN header (RFC 7348): the I flag (VNI valid) and nothing else set
 * in the first word; the VNI in the top 24 bits of the second. */
struct tunnel_vxlanhdr {
	__be32 flags;
	__be32 vni;
};

#define TUNNEL_VXLAN_FLAGS 0x08000000
/* Outer IPv4 + UDP + VXLAN + inner Ethernet: what decapsulation removes
 * after the outer Ethernet header. */
#define TUNNEL_OVERHEAD (sizeof(struct iphdr) + sizeof(struct udphdr) + sizeof(struct tunnel_vxlanhdr) + sizeof(struct ethhdr))

/* TUNNEL_LAYOUT points eth, ip, udp, vx, ieth and iip at the headers of a
 * VXLAN packet that starts at data (outer Ethernet, IPv4 without options,
 * UDP, VXLAN, inner Ethernet, inner IPv4); the caller checks iip + 1
 * against the packet's end. */
#define TUNNEL_LAYOUT(data, eth, ip, udp, vx, ieth, iip)                                                      \
	do {                                                                                                  \
		(eth) = (data);                                                                               \
		(ip) = (void *)((eth) + 1);                                                                   \
		(udp) = (void *)((ip) + 1);                                                                   \
		(vx) = (void *)((udp) + 1);                                                                   \
		(ieth) = (void *)((vx) + 1);                                                                  \
		(iip) = (void *)((ieth) + 1);                                                                 \
	} while (0)

/* TUNNEL_UPLINK_PASS: tunnel_uplink_decap left the packet to the kernel. */
#define TUNNEL_UPLINK_PASS (-1)

/* tunnel_uplink_decap decapsulates, in from_uplink, a VXLAN packet another
 * node sent about its pod to a pod or VM of this one, so that it skips the
 * node's IP and UDP receive, the VXLAN device and its GRO cell: from_wire
 * then runs on the inner packet as from_tunnel would, and redirect_peer
 * takes it into the pod. Only the plain case, as our nodes send it: outer
 * IPv4 to one of this node's addresses (the host identity) with a valid
 * header checksum, no options, not a fragment, its length the frame's; UDP
 * to the tunnel port, checksum 0 (the VXLAN devices send none), its length
 * the datagram's; the VXLAN I flag alone; an inner IPv4 frame to the tunnel
 * MAC, no options, not a fragment, TTL > 1, for a local endpoint; not a GSO
 * packet (on this kernel bpf_skb_adjust_room leaves a GSO packet's UDP
 * tunnel type and encapsulation mark in place, which would break its
 * segmentation if forwarded: the kernel device takes those, bulk TCP's GRO
 * aggregates); and the sender judged by tunnel_src_check with the identity
 * its VNI carries. Everything else, a forged or foreign packet included,
 * is left unchanged to the VXLAN device and from_tunnel, which judges and
 * counts it as before: one place decides drops. Returns the sender's
 * identity (0: resolve the inner source) once decapsulated, else
 * TUNNEL_UPLINK_PASS. Not inlined: its frame stays off from_wire's. */
static __noinline __attribute__((unused)) long tunnel_uplink_decap(struct __sk_buff *skb)
{
	void *data, *end;
	struct ethhdr *eth, *ieth;
	struct iphdr *ip, *iip;
	struct udphdr *udp;
	struct tunnel_vxlanhdr *vx;
	__u32 ident, vni;

	if (!skb || !tunnel_ifindex || skb->gso_size || skb->vlan_present)
		return TUNNEL_UPLINK_PASS;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	TUNNEL_LAYOUT(data, eth, ip, udp, vx, ieth, iip);
	if ((void *)(iip + 1) > end)
		return TUNNEL_UPLINK_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
	    (ip->frag_off & bpf_htons(0x3fff)) || bpf_ntohs(ip->tot_len) != skb->len - sizeof(*eth))
		return TUNNEL_UPLINK_PASS;
	if (udp->dest != bpf_htons(tunnel_port) || udp->check ||
	    bpf_ntohs(udp->len) != bpf_ntohs(ip->tot_len) - sizeof(*ip))
		return TUNNEL_UPLINK_PASS;
	if (vx->flags != bpf_htonl(TUNNEL_VXLAN_FLAGS) || (vx->vni & bpf_htonl(0xff)))
		return TUNNEL_UPLINK_PASS;
	if (ieth->h_proto != bpf_htons(ETH_P_IP) || !mac_equal(ieth->h_dest, tunnel_mac) || iip->version != 4 ||
	    iip->ihl != 5 || (iip->frag_off & bpf_htons(0x3fff)) || iip->ttl <= 1)
		return TUNNEL_UPLINK_PASS;
	if (ipv4_csum(ip))
		return TUNNEL_UPLINK_PASS; /* a broken outer header: the stack drops it */
	if (policy_endpoint_identity(ip->daddr) != LK_IDENTITY_HOST || !bpf_map_lookup_elem(&lk_endpoints, &iip->daddr))
		return TUNNEL_UPLINK_PASS;
	vni = bpf_ntohl(vx->vni) >> 8;
	if (tunnel_src_check(ip->saddr, iip->saddr, vni, &ident))
		return TUNNEL_UPLINK_PASS; /* from_tunnel drops it, with the reason */
	if (bpf_skb_adjust_room(skb, -(__s32)TUNNEL_OVERHEAD, BPF_ADJ_ROOM_MAC, 0) < 0)
		return TUNNEL_UPLINK_PASS; /* unchanged: the device's (from_tunnel judges and counts it) */
	tunnel_count(TUNNEL_STAT_DECAP);
	tunnel_count(TUNNEL_STAT_DECAP_UPLINK);
	if (ident)
		tunnel_count(TUNNEL_STAT_VNI_IDENTITY);
	return ident;
}

/* tunnel_port_guard returns DROP_TUNNEL_PORT for a packet an endpoint sent
 * that is UDP to the tunnel port of a node address: one of this node's own
 * (the host identity in the ipcache, either family: the VXLAN socket listens
 * on every address) or another node's underlay address. proto and l4off:
 * the L4 protocol and its header's frame offset (0: a later fragment, no L4
 * header: its first fragment was judged); dst4, or the 16 bytes at dst6 (0:
 * IPv4), the destination after load balancing (a Service whose endpoint is
 * a node's tunnel port is no way around it). 0: not such a packet, or
 * native routing. One function for both families. */
static __always_inline __u32 tunnel_port_guard(struct __sk_buff *skb, __u8 proto, __u32 l4off, __be32 dst4,
					       const void *dst6)
{
	__be16 dport;

	if (!tunnel_ifindex || proto != IPPROTO_UDP || !l4off ||
	    bpf_skb_load_bytes(skb, l4off + 2, &dport, sizeof(dport)) < 0 || dport != bpf_htons(tunnel_port))
		return 0;
	if (policy_endpoint_identity_af(dst4, dst6) == LK_IDENTITY_HOST)
		return DROP_TUNNEL_PORT;
	if (!dst6 && bpf_map_lookup_elem(&lk_tunnel_peers, &dst4))
		return DROP_TUNNEL_PORT;
	return 0;
}

/* tunnel_has_key reports whether skb already carries tunnel metadata. */
static __noinline __attribute__((unused)) int tunnel_has_key(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};

	return skb && bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) == 0;
}

/* tunnel_host_key sets the tunnel key of a packet the node's own stack sends
 * to another node's pod (VNI 0: the receiver resolves the address, as for
 * any traffic from a node). Returns a TC verdict. */
static __always_inline __attribute__((unused)) int tunnel_host_key(struct __sk_buff *skb, struct pkt *p)
{
	struct tunnel_node_key k = { .prefixlen = 32, .addr = p->ip4->daddr };
	struct bpf_tunnel_key key = {};
	struct tunnel_node *n = bpf_map_lookup_elem(&lk_tunnel_nodes, &k);

	if (!n || (n->flags & TUNNEL_NODE_F_SELF))
		return TC_ACT_SHOT;
	key.remote_ipv4 = bpf_ntohl(n->underlay);
	key.tunnel_ttl = LK_TUNNEL_TTL;
	/* The neighbour of a NOARP device is the device's own MAC: as source
	 * too, the receiver would drop it as a loop. */
	mac_copy(p->eth->h_dest, tunnel_mac);
	mac_copy(p->eth->h_source, tunnel_src_mac);
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), TUNNEL_KEY_FLAGS) < 0) {
		tunnel_count(TUNNEL_STAT_ENCAP_ERR);
		return TC_ACT_SHOT;
	}
	tunnel_count(TUNNEL_STAT_HOST_ENCAP);
	return TC_ACT_OK;
}

/* The outer UDP source port range: the one the VXLAN device draws from
 * (its own, else the node's local port range; load-time settings, the
 * agent reads them). The inner flow's hash picks the port as
 * udp_flow_src_port does, so that a network's ECMP and a receiver's RSS
 * spread flows and a flow keeps one port whichever path encapsulates it. */
const volatile __u32 tunnel_sport_min = 32768;
const volatile __u32 tunnel_sport_max = 60999;

/* tunnel_bpf_encap encapsulates a packet for another node itself (outer
 * Ethernet from the FIB, IPv4 from the route's source address to underlay,
 * UDP to the tunnel port with checksum 0, the VXLAN header with vni, the
 * inner Ethernet header the tunnel device would write) and redirects it out
 * of the route's device: the kernel's VXLAN transmit (the device's queue,
 * its route lookup, the UDP tunnel and IP output path) is skipped. Only what
 * is no GSO packet (requests, replies, handshakes, ACKs: bulk TCP's GSO
 * packets stay whole through the device, whose segmentation offload knows
 * UDP tunnels) and only with the route and its neighbour known and the
 * encapsulated packet within the device's MTU. The outer header is what the
 * device would write for the metadata tunnel_route gives it: TTL 64, no DF,
 * the inner packet's ECN bits (a CE mark as ECT(0), INET_ECN_encapsulate).
 * The inner MACs must have been set. Returns a TC verdict, or -1: not done
 * here, the packet unchanged (the caller hands it to the device). Not
 * inlined: its frame stays off from_pod's. */
static __noinline __attribute__((unused)) int tunnel_bpf_encap(struct __sk_buff *skb, __be32 underlay, __u32 vni)
{
	struct bpf_fib_lookup fib = {};
	struct ethhdr *eth, *ieth;
	struct iphdr *ip, *iip;
	struct udphdr *udp;
	struct tunnel_vxlanhdr *vx;
	void *data, *end;
	__u32 hash, len, mtu = 0;
	__u8 ecn;

	if (!skb || skb->gso_size)
		return -1;
	fib.family = AF_INET;
	fib.ipv4_dst = underlay;
	fib.ifindex = skb->ifindex;
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC) != BPF_FIB_LKUP_RET_SUCCESS ||
	    bpf_check_mtu(skb, fib.ifindex, &mtu, TUNNEL_OVERHEAD, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return -1;
	/* The flow's hash as the device would take it (skb_get_hash: the
	 * socket's, set on the packet, else the flow dissector's), so that a
	 * flow's packets keep one outer port whichever path encapsulates them
	 * (ECMP keeps them in order). */
	hash = skb->hash;
	if (!hash)
		hash = bpf_get_hash_recalc(skb);
	len = skb->len;
	if (bpf_skb_adjust_room(skb, TUNNEL_OVERHEAD, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
					BPF_F_ADJ_ROOM_ENCAP_L2(sizeof(struct ethhdr))) < 0)
		return -1;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	TUNNEL_LAYOUT(data, eth, ip, udp, vx, ieth, iip);
	if ((void *)(iip + 1) > end)
		return drop(skb, 0, DROP_REDIRECT); /* grown, yet not there: cannot happen */
	mac_copy(eth->h_dest, fib.dmac);
	mac_copy(eth->h_source, fib.smac);
	eth->h_proto = bpf_htons(ETH_P_IP);
	mac_copy(ieth->h_dest, tunnel_mac);
	mac_copy(ieth->h_source, tunnel_src_mac);
	ieth->h_proto = bpf_htons(ETH_P_IP);
	ecn = iip->tos & 3;
	*(__u8 *)ip = 0x45;
	ip->tos = ecn == 3 ? 2 : ecn;
	ip->tot_len = bpf_htons(len - sizeof(struct ethhdr) + TUNNEL_OVERHEAD);
	ip->id = (__be16)bpf_get_prandom_u32();
	ip->frag_off = 0;
	ip->ttl = LK_TUNNEL_TTL;
	ip->protocol = IPPROTO_UDP;
	ip->check = 0;
	ip->saddr = fib.ipv4_src;
	ip->daddr = underlay;
	ip->check = ipv4_csum(ip);
	hash ^= hash << 16;
	udp->source = bpf_htons((__u16)((((__u64)hash * (tunnel_sport_max - tunnel_sport_min)) >> 32) + tunnel_sport_min));
	udp->dest = bpf_htons(tunnel_port);
	udp->len = bpf_htons(len - sizeof(struct ethhdr) + TUNNEL_OVERHEAD - sizeof(struct iphdr));
	udp->check = 0;
	vx->flags = bpf_htonl(TUNNEL_VXLAN_FLAGS);
	vx->vni = bpf_htonl(vni << 8);
	tunnel_count(TUNNEL_STAT_ENCAP);
	tunnel_count(TUNNEL_STAT_ENCAP_BPF);
	trace_redirect(fib.ifindex, REDIR_PLAIN, skb->queue_mapping);
	bpf_redirect(fib.ifindex, 0);
	return TC_ACT_REDIRECT; /* as tunnel_route's device path, below */
}

/* tunnel_route sends an IPv4 packet for a remote node's pod CIDR into the
 * tunnel. Returns a TC verdict, or -1 when the destination is no remote pod
 * CIDR (native routing or not a pod: the caller routes by the FIB). The TTL
 * must have been checked (> 1). ep_id is the sender (0: from the uplink). */
static __always_inline int tunnel_route(struct __sk_buff *skb, struct pkt *p, __u32 ep_id)
{
	struct tunnel_node_key k = { .prefixlen = 32 };
	struct bpf_tunnel_key key = {};
	struct tunnel_node *n;
	__u32 ifindex = tunnel_ifindex;

	if (!ifindex)
		return -1;
	k.addr = p->ip4->daddr;
	n = bpf_map_lookup_elem(&lk_tunnel_nodes, &k);
	if (!n || (n->flags & TUNNEL_NODE_F_SELF))
		return -1;
	key.remote_ipv4 = bpf_ntohl(n->underlay);
	key.tunnel_id = ep_id ? tunnel_vni_of(p->ip4->saddr) : 0;
	key.tunnel_ttl = LK_TUNNEL_TTL;
	/* A packet too big for the tunnel (GSO-aware: fits_mtu against the
	 * VXLAN device's MTU, the uplink's minus the overhead) goes to the host
	 * stack, as in native routing: its route into the tunnel device has that
	 * MTU, so it answers ICMP fragmentation needed (DF set) or fragments
	 * (to_tunnel then keys the fragments). Counted, so the share is
	 * visible. */
	if (!fits_mtu(skb, p->ip4, ifindex)) {
		tunnel_count(TUNNEL_STAT_OVERSIZE);
		return to_stack(skb, ep_id);
	}
	skb_event_forwarded(skb, ep_id, 0);
	ipv4_decrease_ttl(p->ip4);
	mac_copy(p->eth->h_dest, tunnel_mac);
	mac_copy(p->eth->h_source, tunnel_src_mac);
	{
		int v = tunnel_bpf_encap(skb, n->underlay, key.tunnel_id);

		if (v >= 0)
			return v;
	}
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), TUNNEL_KEY_FLAGS) < 0) {
		tunnel_count(TUNNEL_STAT_ENCAP_ERR);
		return drop(skb, ep_id, DROP_REDIRECT);
	}
	tunnel_count(TUNNEL_STAT_ENCAP);
	trace_redirect(ifindex, REDIR_PLAIN, skb->queue_mapping);
	/* TC_ACT_REDIRECT, as bpf_redirect with flags 0 answers, as a constant:
	 * the caller's packet pointers do not survive tunnel_bpf_encap, and the
	 * compiler would otherwise keep a path for a negative answer back into
	 * route_ipv4's FIB lookup, which reads them. */
	bpf_redirect(ifindex, 0);
	return TC_ACT_REDIRECT;
}

#endif
