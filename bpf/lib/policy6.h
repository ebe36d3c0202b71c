/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* policy6.h: NetworkPolicy for IPv6, the IPv4 enforcement of policy.h over
 * the IPv6 tables (lk_policy_ipcache6, lk_policy_cidrs6) and IPv6
 * conntrack (lk_ct6, ct.h). The judgement itself is policy.h's
 * policy_decide, parameterised by family: the same rules (identities are
 * family-independent), the same isolation, the same per-policy verdict
 * counters and drop reasons (DROP_POLICY_EGRESS / DROP_POLICY_INGRESS).
 *
 * What differs is only how a packet is read: L4 after the extension-header
 * walk (ip6_ext.h; a chain the walk refuses is dropped as
 * DROP_IPV6_EXT_HDRS for an endpoint a policy selects), ICMPv6 echo tracked
 * by its identifier, ICMPv6 errors (destination unreachable, packet too big,
 * time exceeded, parameter problem) passing with the connection they quote.
 * TCP, UDP and SCTP fragments are tracked (ct_tuple6, frag.h): a later fragment
 * passes with its first fragment's connection; one whose first fragment
 * this hook did not see is judged on its own, with port 0 (only port-less
 * rules admit it). Neighbour discovery never reaches these functions (ndp.h and
 * to_pod_ipv6 take it first): it is the link, as ARP is for IPv4. */
#ifndef LK_POLICY6_H
#define LK_POLICY6_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "parse.h"
#include "ct.h"
#include "ip6_ext.h"
#include "policy.h"

/* The connection-relevant part of an IPv6 packet (struct policy_flow; the
 * addresses are the conntrack key's, which ct_tuple6 always fills). */
struct policy_flow6 {
	__u16 dport; /* host order; 0 without ports (later fragments, other protocols) */
	__u8 proto; /* the upper-layer header after the extension headers */
	__u8 answer; /* TCP other than a bare SYN, ICMPv6 echo reply or error */
};

static __always_inline int policy_icmp6_is_error(__u8 type)
{
	return type >= 1 && type <= 4; /* unreachable, too big, time exceeded, parameter problem */
}

static __always_inline void policy_flow6_of(struct __sk_buff *skb, const struct lk_ip6_chain *c,
					    struct policy_flow6 *f)
{
	__be16 port;

	f->proto = c->nh;
	f->dport = 0;
	f->answer = 0;
	if (c->later)
		return;
	if (c->nh == IPPROTO_ICMPV6) {
		__u8 type;

		if (bpf_skb_load_bytes(skb, c->off, &type, 1) == 0)
			f->answer = type == LK_ICMP6_ECHO_REPLY || policy_icmp6_is_error(type);
		return;
	}
	if (!ct_has_ports(c->nh))
		return;
	if (c->nh == IPPROTO_TCP) {
		__u8 flags;

		if (bpf_skb_load_bytes(skb, c->off + 13, &flags, 1) == 0)
			f->answer = (flags & (LK_TCP_SYN | LK_TCP_ACK)) != LK_TCP_SYN;
	}
	if (bpf_skb_load_bytes(skb, c->off + 2, &port, sizeof(port)) < 0)
		return;
	f->dport = bpf_ntohs(port);
}

/* policy_related6 reports whether the packet (chain c) is an ICMPv6 error
 * quoting, in either direction, a TCP, UDP or SCTP connection policy allowed
 * (the quoted header without extension headers). The error's head: type,
 * code, checksum, 4 bytes, the quoted IPv6 header (next header at 6, the
 * addresses at 8), its first L4 bytes (the ports). k: scratch space. */
static __always_inline int policy_related6(struct __sk_buff *skb, const struct lk_ip6_chain *c,
					   struct ct6_key *k)
{
	struct ct_entry *e;
	__u8 type, nh;

	if (c->nh != IPPROTO_ICMPV6 || c->frag)
		return 0;
	if (bpf_skb_load_bytes(skb, c->off, &type, 1) < 0 || !policy_icmp6_is_error(type))
		return 0;
	if (bpf_skb_load_bytes(skb, c->off + 8 + 6, &nh, 1) < 0 || !ct_has_ports(nh))
		return 0;
	if (bpf_skb_load_bytes(skb, c->off + 8 + 8, &k->saddr, 32) < 0 ||
	    bpf_skb_load_bytes(skb, c->off + 8 + 40, &k->sport, 4) < 0)
		return 0;
	k->proto = nh;
	k->flags = 0;
	k->pad = 0;
	e = bpf_map_lookup_elem(&lk_ct6, k);
	if (!e) {
		ct6_key_swap(k);
		e = bpf_map_lookup_elem(&lk_ct6, k);
	}
	return e && (e->flags & CT_F_POLICY);
}

/* policy_enforce6 is policy_enforce for the IPv6 packet p whose chain is c. */
static __always_inline __u32 policy_enforce6(struct __sk_buff *skb, const struct pkt *p,
					     const struct lk_ip6_chain *c, __u32 src_id,
					     const struct policy_isolation *src_iso, __u32 dst_id,
					     const struct policy_isolation *dst_iso, __u8 from_stack)
{
	struct ct_entry *e = 0;
	struct policy_flow6 f;
	struct ct6_key key;
	int res = CT_NEW, tracked, egress;
	__u8 tcp_flags;

	if (!(src_iso->policy_ingress | src_iso->policy_egress | dst_iso->policy_ingress |
	      dst_iso->policy_egress))
		return 0;
	tracked = ct_tuple6(skb, p->ip6, c, &key, &tcp_flags) == 0;
	if (tracked) {
		res = ct_lookup6(&key, tcp_flags, &e);
		if (res != CT_NEW && e && (e->flags & CT_F_POLICY))
			return 0;
	}
	if (!tracked) {
		if (policy_related6(skb, c, &key))
			return 0;
		ct_tuple6(skb, p->ip6, c, &key, &tcp_flags); /* the addresses again */
	}
	policy_flow6_of(skb, c, &f);
	egress = policy_decide(src_id, src_iso, POLICY_DIR_EGRESS, 0, &key.daddr, 0, f.proto, f.dport, f.answer,
			       0);
	if (!egress)
		return DROP_POLICY_EGRESS;
	if (!policy_decide(dst_id, dst_iso, POLICY_DIR_INGRESS, 0, &key.saddr, 0, f.proto, f.dport, 0,
			   from_stack))
		return DROP_POLICY_INGRESS;
	if (!tracked || egress == 2)
		return 0;
	if (res != CT_NEW && e) {
		e->flags |= CT_F_POLICY;
	} else {
		struct ct_entry init = { .flags = CT_F_POLICY };

		ct_create6(&key, &init); /* a full table: the next packet is judged again */
	}
	return 0;
}

/* policy_selected6: some NetworkPolicy selects ep (either direction). */
static __always_inline int policy_selected6(const struct endpoint_info *ep)
{
	struct policy_isolation iso = policy_isolation_of(policy_endpoint_identity_af(0, ep->ip6));

	return (iso.policy_ingress | iso.policy_egress) != 0;
}

/* policy_from_endpoint6 is policy_from_endpoint for IPv6: ep sent p (chain
 * c) to dst (its local receiver, or 0). */
static __always_inline __u32 policy_from_endpoint6(struct __sk_buff *skb, const struct pkt *p,
						   const struct lk_ip6_chain *c, const struct endpoint_info *ep,
						   const struct endpoint_info *dst, __u32 *charge)
{
	__u32 src_id = policy_endpoint_identity_af(0, ep->ip6), dst_id = 0, dst_ep = 0, reason;
	struct policy_isolation src_iso, dst_iso;

	if (dst) {
		dst_id = policy_endpoint_identity_af(0, dst->ip6);
		dst_ep = dst->id;
	}
	src_iso = policy_isolation_of(src_id);
	dst_iso = policy_isolation_of(dst_id);
	reason = policy_enforce6(skb, p, c, src_id, &src_iso, dst_id, &dst_iso, 0);
	*charge = reason == DROP_POLICY_INGRESS ? dst_ep : ep->id;
	return reason;
}

/* policy_to_endpoint6 is policy_to_endpoint for IPv6: dst's ingress for a
 * packet from the wire or (from_stack) the node's stack. */
static __always_inline __u32 policy_to_endpoint6(struct __sk_buff *skb, const struct pkt *p,
						 const struct lk_ip6_chain *c, const struct endpoint_info *dst,
						 __u8 from_stack)
{
	__u32 dst_id = policy_endpoint_identity_af(0, dst->ip6);
	struct policy_isolation src_iso = {}, dst_iso = policy_isolation_of(dst_id);

	return policy_enforce6(skb, p, c, 0, &src_iso, dst_id, &dst_iso, from_stack);
}

#endif
