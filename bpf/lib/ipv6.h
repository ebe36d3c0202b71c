/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ipv6.h: the IPv6 pod datapath, the same steps as IPv4 (pod.c):
 *   parse (extension headers walked, bounded: ip6_ext.h) -> anti-spoof
 *   (source address; neighbour discovery, ndp.h; router advertisements,
 *   redirects and DHCPv6 server messages dropped) -> [policy: policy6.h]
 *   -> route (local: bpf_redirect_peer; remote: bpf_fib_lookup AF_INET6 +
 *   redirect / redirect_neigh, the GSO-aware MTU rule of fib.h)
 * What only the host stack can do goes there: hop limit <= 1 (ICMPv6 time
 * exceeded), a packet too big for the egress device (Packet Too Big),
 * hop-by-hop options (a router must look), multicast and link-scoped
 * traffic.
 *
 * NetworkPolicy is enforced as for IPv4 (policy6.h): the sender's egress in
 * from_pod6, the receiver's ingress wherever IPv6 enters a pod (from_pod6,
 * from_uplink, to_pod), replies by IPv6 conntrack. Neighbour discovery is
 * exempt (it is the link, as ARP is for IPv4). DROP_POLICY_IPV6 (the fail
 * closed of the first slice) is no longer produced; the value stays so
 * that reason numbers do not move. */
#ifndef LK_IPV6_H
#define LK_IPV6_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "fib.h"
#include "ip6_ext.h"
#include "ndp.h"
#include "policy.h"
#include "policy6.h"
#include "lb6.h"
#include "edt.h"

/* Extension headers the datapath walks; a longer chain is dropped
 * (DROP_IPV6_EXT_HDRS). Eight is more than any packet RFC 8200's order of
 * headers needs (each at most once, destination options twice). */
#define LK_IP6_EXT_MAX 8

#define LK_ICMP6_MLD_QUERY 130
#define LK_ICMP6_MLD_REPORT 131
#define LK_ICMP6_MLD_DONE 132
#define LK_ICMP6_MLD2_REPORT 143
#define LK_DHCP6_CLIENT_PORT 546
#define LK_DHCP6_SERVER_PORT 547

/* from_pod's IPv6 half (from_pod6 in pod.c), entered by a tail call: the
 * IPv4 pipeline (load balancing, policy) fills most of from_pod's 512-byte
 * stack, and a tail call starts a fresh one. Slot 0. Pinned, so that the
 * entry outlives the agent (the datapath keeps forwarding while it is down). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_pod6_progs SEC(".maps");

/* from_uplink's (and from_tunnel's) IPv6 half, from_uplink6 in uplink.c,
 * entered by a tail call for the same reason: slot 0. Not installed, IPv6
 * goes to the host stack (and to_pod judges what it sends into a pod). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_uplink6_progs SEC(".maps");

static __always_inline int ep_has_ip6(const struct endpoint_info *ep)
{
	return !ip6_is_zero(ep->ip6);
}

static __always_inline int ip6_walk(struct __sk_buff *skb, const struct pkt *p, struct lk_ip6_chain *c)
{
	if (lk_ip6_walk_skb(skb, ETH_HLEN, p->ip6->nexthdr, LK_IP6_EXT_MAX, c) != LK_IP6_CHAIN_OK ||
	    c->off > skb->len)
		return -1;
	return 0;
}

/* BIG TCP (netdev/bigtcp.go): the stack marks an IPv6 GSO packet of more
 * than 64 KiB with a hop-by-hop header that holds only a jumbo payload
 * option (RFC 2675; payload_len 0), and the device that segments it drops
 * the header (each segment has its own length). It is the kernel's
 * bookkeeping, not an option for routers: such a TCP GSO packet is
 * forwarded as if it had no hop-by-hop header (the host stack does not
 * forward it). GRO on the uplink builds such packets too. Any other
 * hop-by-hop header still goes to the host stack, and so does a single
 * frame (not GSO) with this one: a sender cannot take this path with a
 * crafted header. */
struct lk_hop_jumbo {
	__u8 nexthdr;
	__u8 hdrlen;
	__u8 tlv_type;
	__u8 tlv_len;
	__be32 jumbo_len;
};

#define LK_IPV6_TLV_JUMBO 0xc2

/* ip6_bigtcp says whether chain c (walked by ip6_walk) is a BIG TCP GSO
 * packet's, and marks it (c->jumbo: the MTU check discounts the header). */
static __always_inline int ip6_bigtcp(struct __sk_buff *skb, const struct pkt *p, struct lk_ip6_chain *c)
{
	struct lk_hop_jumbo h;

	if (c->first_nh != IPPROTO_HOPOPTS || c->count != 1 || c->nh != IPPROTO_TCP || !skb->gso_size ||
	    p->ip6->payload_len != 0 || c->off != ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(h))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &h, sizeof(h)) < 0)
		return 0;
	if (h.hdrlen != 0 || h.tlv_type != LK_IPV6_TLV_JUMBO || h.tlv_len != 4 ||
	    bpf_ntohl(h.jumbo_len) + sizeof(struct ipv6hdr) + ETH_HLEN != skb->len)
		return 0;
	c->jumbo = 1;
	return 1;
}

/* lb6_reply translates back a reply of a flow this node load-balanced, on
 * a path that carries only replies (lb4_reply for IPv6): to_uplink and
 * to_pod, where the node's stack answers a flow whose backend it is (a
 * hostNetwork endpoint). Returns 1 when rewritten, 0 when not, -1 on a
 * failed rewrite. */
static __always_inline int lb6_reply(struct __sk_buff *skb, struct pkt *p, struct lb6_pending *pd)
{
	struct lk_ip6_chain c;
	int r;

	if (!pd || ip6_walk(skb, p, &c))
		return 0;
	r = lb6_icmp_rev_nat(skb, &c, pd);
	if (r)
		return r;
	if ((c.nh != IPPROTO_TCP && c.nh != IPPROTO_UDP) || ct_tuple6(skb, p->ip6, &c, &pd->ft, &pd->tcpf) < 0)
		return 0;
	return lb6_rev_nat(skb, c.later ? 0 : c.off, pd);
}

/* What an endpoint's packet is at L4, for anti-spoofing (ip6_l4_class). */
enum lk_ip6_l4 {
	LK_IP6_L4_OTHER = 0, /* anything else: routed after the source check */
	LK_IP6_L4_MALFORMED, /* the ICMPv6 type or UDP ports are not in the packet */
	LK_IP6_L4_ROUTER, /* router advertisement, redirect, DHCPv6 server/relay message */
	LK_IP6_L4_LINK, /* router solicitation, MLD: link-scope, for the host stack */
	LK_IP6_L4_NS, /* neighbour solicitation (ndp.h) */
	LK_IP6_L4_NA, /* neighbour advertisement (ndp.h) */
};

/* ip6_l4_class classifies the L4 header at c->off. A later fragment (no L4
 * header; its first fragment was classified) is LK_IP6_L4_OTHER. */
static __always_inline int ip6_l4_class(struct __sk_buff *skb, const struct lk_ip6_chain *c)
{
	if (c->later)
		return LK_IP6_L4_OTHER;
	if (c->nh == IPPROTO_ICMPV6) {
		__u8 type;

		if (bpf_skb_load_bytes(skb, c->off, &type, 1) < 0)
			return LK_IP6_L4_MALFORMED;
		switch (type) {
		case LK_ICMP6_RA:
		case LK_ICMP6_REDIRECT:
			return LK_IP6_L4_ROUTER;
		case LK_ICMP6_NS:
			return LK_IP6_L4_NS;
		case LK_ICMP6_NA:
			return LK_IP6_L4_NA;
		case LK_ICMP6_RS:
		case LK_ICMP6_MLD_QUERY:
		case LK_ICMP6_MLD_REPORT:
		case LK_ICMP6_MLD_DONE:
		case LK_ICMP6_MLD2_REPORT:
			return LK_IP6_L4_LINK;
		}
		return LK_IP6_L4_OTHER;
	}
	if (c->nh == IPPROTO_UDP) {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, c->off, ports, sizeof(ports)) < 0)
			return LK_IP6_L4_MALFORMED;
		if (ports[0] == bpf_htons(LK_DHCP6_SERVER_PORT) || ports[1] == bpf_htons(LK_DHCP6_CLIENT_PORT))
			return LK_IP6_L4_ROUTER;
	}
	return LK_IP6_L4_OTHER;
}

/* route_ipv6 forwards an IPv6 packet endpoint ep_id (0: the uplink) sent,
 * whose chain is c, to the local endpoint dst or through the FIB. The
 * hop limit must have been checked (> 1) by the caller. */
static __always_inline int route_ipv6(struct __sk_buff *skb, struct pkt *p, __u32 ep_id,
				      const struct lk_ip6_chain *c, const struct endpoint_info *dst)
{
	struct ipv6hdr *ip6 = p->ip6;

	if (dst)
		return deliver_local_l3(skb, p, ep_id, dst, 1);

	/* tot_len 0: as route_ipv4, the GSO-aware MTU check is fits_mtu_l3's. */
	struct bpf_fib_lookup fib = {
		.family = AF_INET6,
		.l4_protocol = c->nh,
		.tot_len = 0,
		.ifindex = skb->ifindex,
	};
	fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0fffffff);
	__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		if (!fits_mtu_l3(skb, c->off - ETH_HLEN, c->jumbo ? sizeof(struct lk_hop_jumbo) : 0, c->nh, fib.ifindex))
			return to_stack(skb, ep_id); /* ICMPv6 Packet Too Big */
		skb_event_forwarded(skb, ep_id, 0);
		ip6->hop_limit--;
		mac_copy(p->eth->h_dest, fib.dmac);
		mac_copy(p->eth->h_source, fib.smac);
		trace_redirect(fib.ifindex, REDIR_PLAIN, skb->queue_mapping);
		return bpf_redirect(fib.ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH: {
		struct bpf_redir_neigh nh = { .nh_family = AF_INET6 };

		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		if (!fits_mtu_l3(skb, c->off - ETH_HLEN, c->jumbo ? sizeof(struct lk_hop_jumbo) : 0, c->nh, fib.ifindex))
			return to_stack(skb, ep_id);
		skb_event_forwarded(skb, ep_id, 0);
		ip6->hop_limit--;
		trace_redirect(fib.ifindex, REDIR_NEIGH, skb->queue_mapping);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	case BPF_FIB_LKUP_RET_BLACKHOLE:
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		return drop(skb, ep_id, DROP_FIB_FAILED);
	default:
		return to_stack(skb, ep_id); /* for the node itself, forwarding off, too big */
	}
}

/* from_pod_ipv6 is from_pod (pod.c) for IPv6. */
static __always_inline int from_pod_ipv6(struct __sk_buff *skb, struct pkt *p, const struct endpoint_info *ep)
{
	struct lb6_pending *pd;
	struct endpoint_info *dst;
	struct lk_ip6_chain c;

	if (!ep_has_ip6(ep))
		return drop(skb, ep->id, DROP_UNSUPPORTED_L3); /* an IPv4-only endpoint */
	if (!(ep->flags & EP_F_L3) && !mac_equal(p->eth->h_source, ep->mac))
		return drop(skb, ep->id, DROP_SPOOFED_MAC);
	if (ip6_walk(skb, p, &c))
		return drop(skb, ep->id, DROP_IPV6_EXT_HDRS);
	switch (ip6_l4_class(skb, &c)) {
	case LK_IP6_L4_MALFORMED:
		return drop(skb, ep->id, DROP_MALFORMED);
	case LK_IP6_L4_ROUTER:
		return drop(skb, ep->id, DROP_ROUTER_MSG);
	case LK_IP6_L4_NS:
		return ndp_from_endpoint(skb, p, ep, &c, LK_ICMP6_NS);
	case LK_IP6_L4_NA:
		return ndp_from_endpoint(skb, p, ep, &c, LK_ICMP6_NA);
	case LK_IP6_L4_LINK:
		if (!ip6_equal(&p->ip6->saddr, ep->ip6) && !ip6_is_linklocal((__u8 *)&p->ip6->saddr) &&
		    !ip6_is_zero((__u8 *)&p->ip6->saddr))
			return drop(skb, ep->id, DROP_SPOOFED_IP);
		return to_stack(skb, ep->id);
	}
	if (!ip6_equal(&p->ip6->saddr, ep->ip6)) {
		/* Link-scope chatter from a link-local (or no) address stays on
		 * the pod's link: the host stack takes it. */
		if ((ip6_is_linklocal((__u8 *)&p->ip6->saddr) || ip6_is_zero((__u8 *)&p->ip6->saddr)) &&
		    (ip6_is_multicast((__u8 *)&p->ip6->daddr) || ip6_is_linklocal((__u8 *)&p->ip6->daddr)))
			return to_stack(skb, ep->id);
		return drop(skb, ep->id, DROP_SPOOFED_IP);
	}
	metrics_add(ep->id, METRIC_FROM_EP, skb->len);

	/* [LB] (lb6.h): IPv6 ClusterIP frontends; replies translated back. */
	pd = lb6_pending_get();
	{
		int changed, v = lb6(skb, p, &c, ep, pd, &changed);

		if (v != LB_CONTINUE)
			return v;
		if (changed && (parse_eth(p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p->ip6))
			return drop(skb, ep->id, DROP_MALFORMED);
	}
	/* [/LB] */

	/* Tunnel mode: no endpoint reaches a node's VXLAN socket (tunnel.h). */
	if (tunnel_port_guard(skb, c.nh, c.later ? 0 : c.off, 0, &p->ip6->daddr))
		return drop(skb, ep->id, DROP_TUNNEL_PORT);

	/* [policy] (policy6.h): the sender's egress, a local receiver's ingress,
	 * on the packet as load balancing left it. */
	dst = bpf_map_lookup_elem(&lk_endpoints6, &p->ip6->daddr);
	if (!pd || !pd->allowed_reply) {
		__u32 charge, reason = policy_from_endpoint6(skb, p, &c, ep, dst, &charge);

		if (reason)
			return drop(skb, charge, reason);
	}
	/* [/policy] */
	lb6_commit(pd); /* [LB] the new flow's state, now that it is allowed */

	if (edt_sched_departure(skb, ep->id)) /* its egress bandwidth limit (edt.h) */
		return drop(skb, ep->id, DROP_EDT_HORIZON);

	if (is_multicast_ether(p->eth->h_dest) || ip6_is_multicast((__u8 *)&p->ip6->daddr) ||
	    ip6_is_linklocal((__u8 *)&p->ip6->daddr))
		return to_stack(skb, ep->id);
	if (p->ip6->hop_limit <= 1)
		return to_stack(skb, ep->id); /* the host stack sends ICMPv6 time exceeded */
	if (c.first_nh == IPPROTO_HOPOPTS && !ip6_bigtcp(skb, p, &c))
		return to_stack(skb, ep->id); /* hop-by-hop options are every router's to process */
	return route_ipv6(skb, p, ep->id, &c, dst);
}

/* from_uplink_ipv6 is from_wire (uplink.c) for IPv6: NodePort and
 * external-address frontends are load-balanced and replies of flows this
 * node load-balanced translated back (lb6); a packet for a local endpoint
 * goes into it with bpf_redirect_peer after its ingress policy, one the LB
 * translated for elsewhere (a remote backend, an external client) is routed
 * (that node's policy judges it); the rest is the stack's. */
static __always_inline int from_uplink_ipv6(struct __sk_buff *skb, struct pkt *p)
{
	struct endpoint_info *dst;
	struct lb6_pending *pd;
	struct lk_ip6_chain c;
	__u32 reason;
	int changed, v;

	if (ip6_walk(skb, p, &c) || (c.first_nh == IPPROTO_HOPOPTS && !ip6_bigtcp(skb, p, &c)))
		return TC_ACT_OK; /* the stack judges broken chains, reads options (to_pod judges policy) */
	pd = lb6_pending_get();
	v = lb6(skb, p, &c, 0, pd, &changed);
	if (v != LB_CONTINUE)
		return v;
	if (changed && (parse_eth(p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p->ip6))
		return TC_ACT_SHOT;
	dst = bpf_map_lookup_elem(&lk_endpoints6, &p->ip6->daddr);
	if (!dst) {
		if (!changed)
			return TC_ACT_OK; /* the node's, or nobody's here */
		lb6_commit(pd);
		if (p->ip6->hop_limit <= 1)
			return TC_ACT_OK; /* the stack sends time exceeded */
		return route_ipv6(skb, p, 0, &c, 0);
	}
	/* [policy] the receiver's ingress (a reply translated back belongs to
	 * a connection policy allowed) */
	if (!pd || !pd->allowed_reply) {
		reason = policy_to_endpoint6(skb, p, &c, dst, 0);
		if (reason)
			return drop(skb, dst->id, reason);
	}
	lb6_commit(pd); /* [LB] the new flow's state, now that it is allowed */
	if (p->ip6->hop_limit <= 1)
		return TC_ACT_OK;
	return deliver_local_l3(skb, p, 0, dst, 1);
}

/* to_pod_ipv6 is to_pod (pod.c) for IPv6: replies of service flows whose
 * backend is the node's stack are translated back (lb6_reply); the
 * receiver's ingress judges
 * what the stack sends into it (from_stack: the node's own addresses pass),
 * neighbour discovery (the host resolving the pod) excepted. A chain the
 * walk refuses cannot be judged: dropped for an endpoint a policy selects. */
static __always_inline int to_pod_ipv6(struct __sk_buff *skb, struct pkt *p)
{
	struct endpoint_info *dst = bpf_map_lookup_elem(&lk_endpoints6, &p->ip6->daddr);
	struct lk_ip6_chain c;
	__u32 reason;
	__u8 type;

	if (!dst)
		return TC_ACT_OK;
	/* [LB] a reply from a backend on this node's stack goes back to the
	 * client pod from the frontend. */
	{
		struct lb6_pending *pd = lb6_pending_get();
		int r = lb6_reply(skb, p, pd);

		if (r < 0)
			return drop(skb, dst->id, DROP_MALFORMED);
		if (r) {
			if (parse_eth(p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p->ip6)
				return drop(skb, dst->id, DROP_MALFORMED);
			if (pd->allowed_reply)
				return TC_ACT_OK; /* a connection policy allowed */
		}
	}
	/* [/LB] */
	if (ip6_walk(skb, p, &c))
		return policy_selected6(dst) ? drop(skb, dst->id, DROP_IPV6_EXT_HDRS) : TC_ACT_OK;
	if (!c.frag && c.nh == IPPROTO_ICMPV6 && !bpf_skb_load_bytes(skb, c.off, &type, 1) &&
	    (type == LK_ICMP6_NS || type == LK_ICMP6_NA))
		return TC_ACT_OK;
	reason = policy_to_endpoint6(skb, p, &c, dst, 1);
	if (reason)
		return drop(skb, dst->id, reason);
	return TC_ACT_OK;
}

#endif
