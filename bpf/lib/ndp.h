/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ndp.h: neighbour discovery on a pod's link, the IPv6 side of arp.h.
 *
 * The pod routes through a link-local gateway (gateway_ip6, fe80::1 by
 * default) that is on no device: from_pod answers the pod's neighbour
 * solicitation for it with a neighbour advertisement carrying the host-side
 * MAC, built in place and handed straight back to the pod. Other
 * solicitations and advertisements (the pod answering the host's own
 * solicitation for its address, duplicate address detection) go to the
 * host stack after anti-spoofing: a target or source link-layer address
 * option must be the endpoint's MAC, an advertised target the endpoint's
 * address (or a link-local one other than the gateway's), a source the
 * endpoint's address, a link-local one or (DAD only) the unspecified one.
 * Neighbour discovery arrives with hop limit 255 and unfragmented (RFC
 * 4861, RFC 6980), with at most LK_ND_OPTS_MAX options; anything else is
 * malformed. Router advertisements and redirects are dropped by the caller
 * (ipv6.h). No router advertisements are sent: the CNI result sets the
 * default route. */
#ifndef LK_NDP_H
#define LK_NDP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "fib.h"
#include "ip6_ext.h"
#include "parse.h"

#define LK_ICMP6_RS 133
#define LK_ICMP6_RA 134
#define LK_ICMP6_NS 135
#define LK_ICMP6_NA 136
#define LK_ICMP6_REDIRECT 137
#define LK_ND_OPT_SLLAO 1
#define LK_ND_OPT_TLLAO 2
#define LK_ND_OPTS_MAX 4
/* NA flags: router, solicited, override (RFC 4861 4.4). */
#define LK_ND_NA_FLAGS 0xe0000000

/* The pods' IPv6 gateway (link-local, on no device). Set at load time. */
const volatile __u8 gateway_ip6[16] = { 0xfe, 0x80, [15] = 1 };

/* An NS or NA body: ICMPv6 header, flags/reserved, target. */
struct lk_nd_msg {
	__u8 type;
	__u8 code;
	__be16 csum;
	__be32 flags;
	__u8 target[16];
};

/* A link-layer address option for Ethernet. */
struct lk_nd_opt {
	__u8 type;
	__u8 len; /* in units of 8 bytes */
	__u8 mac[ETH_ALEN];
};

/* The advertisement from_pod writes over a solicitation for the gateway. */
struct lk_nd_na {
	struct ipv6hdr ip6;
	struct lk_nd_msg m;
	struct lk_nd_opt tlla;
};

static __always_inline int ip6_equal(const void *a, const void *b)
{
	__u64 x[2], y[2];

	__builtin_memcpy(x, a, 16);
	__builtin_memcpy(y, b, 16);
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int ip6_is_zero(const __u8 *a)
{
	__u64 w[2];

	__builtin_memcpy(w, a, 16);
	return (w[0] | w[1]) == 0;
}

static __always_inline int ip6_is_linklocal(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

static __always_inline int ip6_is_multicast(const __u8 *a)
{
	return a[0] == 0xff;
}

static __always_inline int ip6_is_gateway(const __u8 *a)
{
	__u8 gw[16];

	__builtin_memcpy(gw, (const void *)gateway_ip6, 16);
	return ip6_equal(a, gw);
}

/* nd_target_ok: an address the endpoint may claim (advertise, DAD): its
 * own, or a link-local one that is not the gateway's. */
static __always_inline int nd_target_ok(const __u8 *t, const struct endpoint_info *ep)
{
	return ip6_equal(t, ep->ip6) || (ip6_is_linklocal(t) && !ip6_is_gateway(t));
}

static __always_inline __u32 csum_fold32(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~s & 0xffff;
}

/* nd_answer_gateway turns the endpoint's solicitation for the gateway into
 * the gateway's solicited advertisement (with a target link-layer address
 * option when the solicitation carried a source one, as RFC 4861 7.2.4
 * requires for multicast solicitations) and hands it back to the endpoint. */
static __always_inline int nd_answer_gateway(struct __sk_buff *skb, struct pkt *p,
					     const struct endpoint_info *ep, int with_opt)
{
	struct lk_nd_na na = {};
	struct ethhdr eth;
	__u32 len = with_opt ? sizeof(struct lk_nd_msg) + sizeof(struct lk_nd_opt) : sizeof(struct lk_nd_msg);
	struct {
		__be32 len;
		__be32 nh;
	} ph = { bpf_htonl(len), bpf_htonl(IPPROTO_ICMPV6) };
	__s64 sum;

	na.ip6.version = 6;
	na.ip6.payload_len = bpf_htons(len);
	na.ip6.nexthdr = IPPROTO_ICMPV6;
	na.ip6.hop_limit = 255;
	__builtin_memcpy(&na.ip6.saddr, (const void *)gateway_ip6, 16);
	__builtin_memcpy(&na.ip6.daddr, &p->ip6->saddr, 16);
	na.m.type = LK_ICMP6_NA;
	na.m.flags = bpf_htonl(LK_ND_NA_FLAGS);
	__builtin_memcpy(na.m.target, (const void *)gateway_ip6, 16);
	na.tlla.type = LK_ND_OPT_TLLAO;
	na.tlla.len = 1;
	mac_copy(na.tlla.mac, ep->host_mac);

	sum = bpf_csum_diff(0, 0, (__be32 *)&na.ip6.saddr, 32, 0);
	sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), sum);
	if (with_opt)
		sum = bpf_csum_diff(0, 0, (__be32 *)&na.m, sizeof(na.m) + sizeof(na.tlla), sum);
	else
		sum = bpf_csum_diff(0, 0, (__be32 *)&na.m, sizeof(na.m), sum);
	na.m.csum = csum_fold32(sum);

	mac_copy(eth.h_dest, ep->mac);
	mac_copy(eth.h_source, ep->host_mac);
	eth.h_proto = bpf_htons(ETH_P_IPV6);
	/* The solicitation may be longer (more options, padding): cut it to size. */
	if (skb->len != ETH_HLEN + sizeof(struct ipv6hdr) + len &&
	    bpf_skb_change_tail(skb, ETH_HLEN + sizeof(struct ipv6hdr) + len, 0))
		return drop(skb, ep->id, DROP_MALFORMED);
	if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &na, sizeof(struct ipv6hdr) + sizeof(struct lk_nd_msg), 0))
		return drop(skb, ep->id, DROP_MALFORMED);
	if (with_opt &&
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct lk_nd_msg), &na.tlla,
				sizeof(na.tlla), 0))
		return drop(skb, ep->id, DROP_MALFORMED);
	return to_endpoint(skb, ep);
}

/* ndp_from_endpoint judges a neighbour solicitation or advertisement
 * (type) the endpoint ep sent; c is its walked header chain. */
static __always_inline int ndp_from_endpoint(struct __sk_buff *skb, struct pkt *p,
					     const struct endpoint_info *ep,
					     const struct lk_ip6_chain *c, __u8 type)
{
	struct ipv6hdr *ip6 = p->ip6;
	struct lk_nd_msg m;
	__u32 end, o, i;
	__u8 want = type == LK_ICMP6_NS ? LK_ND_OPT_SLLAO : LK_ND_OPT_TLLAO;
	int with_opt = 0, plain = c->off == ETH_HLEN + sizeof(struct ipv6hdr);

	if (ep->flags & EP_F_L3) /* no link-layer addresses to resolve (as ARP, arp.h) */
		return drop(skb, ep->id, DROP_UNSUPPORTED_L3);
	if (c->frag || ip6->hop_limit != 255)
		return drop(skb, ep->id, DROP_MALFORMED);
	end = ETH_HLEN + sizeof(struct ipv6hdr) + bpf_ntohs(ip6->payload_len);
	if (end > skb->len || bpf_skb_load_bytes(skb, c->off, &m, sizeof(m)) < 0)
		return drop(skb, ep->id, DROP_MALFORMED);
	o = c->off + sizeof(m);
	for (i = 0; i < LK_ND_OPTS_MAX + 1; i++) {
		struct lk_nd_opt opt;

		if (o + 2 > end)
			break;
		if (i == LK_ND_OPTS_MAX || bpf_skb_load_bytes(skb, o, &opt, 2) < 0 || opt.len == 0 ||
		    o + opt.len * 8 > end)
			return drop(skb, ep->id, DROP_MALFORMED);
		if (opt.type == want) {
			if (opt.len != 1 || bpf_skb_load_bytes(skb, o, &opt, sizeof(opt)) < 0)
				return drop(skb, ep->id, DROP_MALFORMED);
			if (!mac_equal(opt.mac, ep->mac))
				return drop(skb, ep->id, DROP_SPOOFED_MAC);
			with_opt = 1;
		}
		o += opt.len * 8;
	}
	if (!ip6_equal(&ip6->saddr, ep->ip6) && !ip6_is_linklocal((__u8 *)&ip6->saddr) &&
	    !(type == LK_ICMP6_NS && ip6_is_zero((__u8 *)&ip6->saddr)))
		return drop(skb, ep->id, DROP_SPOOFED_IP);
	if (type == LK_ICMP6_NA || ip6_is_zero((__u8 *)&ip6->saddr)) {
		/* An advertisement, or duplicate address detection: a claim. */
		if (!nd_target_ok(m.target, ep))
			return drop(skb, ep->id, DROP_SPOOFED_IP);
		return to_stack(skb, ep->id);
	}
	if (ip6_is_gateway(m.target) && plain)
		return nd_answer_gateway(skb, p, ep, with_opt);
	return to_stack(skb, ep->id); /* resolving the host's own link-local address */
}

#endif
