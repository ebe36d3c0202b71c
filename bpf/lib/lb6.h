/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb6.h: service load balancing for IPv6 frontends: ClusterIP from pods
 * (from_pod6), NodePort and external addresses from the wire
 * (from_uplink6), with replies translated back wherever they enter
 * (from_pod6 for a local backend, from_uplink6 for a remote one or an
 * external client). The IPv4 design of
 * lb.h over IPv6 tables:
 *
 *   lk_lb_svc6       (VIP, port, proto, scope) -> struct lb_svc_value
 *   lk_lb_backends6  backend ID -> IPv6 backend
 *   lk_lb_revnat6    frontend ID -> the IPv6 frontend replies come from
 *   lk_lb_affinity6  (client, frontend ID) -> backend (ClientIP affinity)
 *   lk_ct6_nat       lk_ct6 key -> the IPv6 nat_addr of its entry (SNAT)
 *
 * Shared with IPv4: the frontend value, the Maglev tables (lk_lb_maglev,
 * keyed by frontend ID; IDs are allocated across families by
 * service.Tables), the LB counters (lk_lb_stats) and the slot choice
 * (lb_maglev_pick, lb_select.h). Conntrack is lk_ct6 (ct.h) with the entries
 * of lb.h: a service entry (client -> VIP:port, CT_KEY_SERVICE, the chosen
 * backend) and a flow entry on the translated tuple (CT_F_REVNAT, the
 * frontend ID). As in lb.h, a new flow's entries are created only after
 * policy allowed the packet (lb6_commit).
 *
 * NodePort and external addresses (externalIPs, LoadBalancer ingress IPs)
 * over IPv6 as lb.h does for IPv4: NodePort scope frontends on the node's
 * IPv6 addresses (from_uplink6, and pods reaching them), traffic policy
 * Local (DROP_NO_LOCAL_BACKEND), source NAT by the same rule
 * (lb_snat_kind): a flow from the wire to a remote backend leaves from the
 * node's address (an external address: the node's source towards the
 * backend, lb_node_src), a pod reaching itself through a Service from
 * LB_HAIRPIN_IP6. Source ports from lb_snat_flow_in, as IPv4's. struct
 * ct_entry holds a 4-byte nat_addr: an IPv6 entry's is in lk_ct6_nat, keyed
 * as its lk_ct6 entry (the flow entry: the original client; the service
 * entry: the SNAT source used).
 *
 * Fragments (frag.h, ct_tuple6): a later fragment takes its first
 * fragment's ports and so the same backend and translation (the address
 * only: its L4 header, checksum included, is in the first fragment); one
 * whose first fragment was not seen is dropped (DROP_FRAG_NOT_FOUND).
 *
 * A frontend without backends answers a new flow as lb.h does (a TCP reset
 * or an ICMPv6 port unreachable, into the endpoint or back out of the
 * device it came from), and ICMPv6 errors about a load-balanced flow are
 * translated back (lb6_icmp_rev_nat), for source-NATed flows to their
 * client. */
#ifndef LK_LB6_H
#define LK_LB6_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "parse.h"
#include "ct.h"
#include "ip6_ext.h"
#include "lb_maps.h"
#include "lb6_maps.h"
#include "lb_select.h"
#include "lb.h"
#include "ndp.h" /* ip6_equal */

/* The answer to a new flow without a backend: Ethernet + IPv6 (this) and a
 * TCP reset or an ICMPv6 port unreachable quoting the first 48 bytes of the
 * packet (its IPv6 header and the UDP header), built in struct lb6_csum. */
struct lb6_reply_hdr {
	__u8 dmac[6];
	__u8 smac[6];
	__be16 proto;
	struct {
		__be32 ver_tc_flow; /* version 6 */
		__be16 payload_len;
		__u8 nexthdr;
		__u8 hop_limit;
		__u8 saddr[16];
		__u8 daddr[16];
	} __attribute__((packed)) ip; /* struct ipv6hdr without its unions (bpf2go) */
} __attribute__((packed));

struct lb6_rst {
	__be16 sport, dport;
	__be32 seq, ack;
	__u8 doff, flags;
	__be16 window, check, urg;
};

struct lb6_unreach {
	__u8 type, code;
	__be16 check;
	__be32 unused;
	__u8 orig[48];
};

#define LB6_RST_LEN 20
#define LB6_UNREACH_LEN 56

/* The L4 checksum's input: the IPv6 pseudo-header and the L4 message,
 * which is what goes on the wire after the header. */
struct lb6_csum {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__u8 zero[3];
	__u8 nh;
	union {
		struct lb6_rst rst;
		struct lb6_unreach unreach;
	};
};

/* The hairpin source of IPv6 (lb.h's 169.254.42.1): an address of the
 * discard-only prefix 100::/64 (RFC 6666), never a real host's; the pod
 * routes its reply to it through its gateway, back into from_pod6. */
#define LB_HAIRPIN_IP6_W3 0xa9fe2a01 /* 100::a9fe:2a01, the last word (host order) */

/* The IPv6 nat_addr of an lk_ct6 entry (struct ct_entry has 4 bytes). */
struct lb_nat6_value {
	__u8 addr[16];
};

/* lk_ct6_nat: lk_ct6 key -> the IPv6 nat_addr of its entry, for entries
 * with CT_F_SNAT. Written with the entry; an LRU as lk_ct6 is, so a
 * deleted or evicted entry's goes the same way in time (a reply finding
 * none is not translated: the stack's). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_CT6_ENTRIES);
	__type(key, struct ct6_key);
	__type(value, struct lb_nat6_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ct6_nat SEC(".maps");

/* One IPv6 LB decision between lb6 and lb6_commit (struct lb_pending), and
 * the scratch space of a no-backend answer. */
struct lb6_pending {
	struct ct6_key sk; /* the service entry: client -> VIP:port */
	struct ct_entry se;
	struct ct6_key ft; /* the packet's tuple; after DNAT the flow entry's */
	struct ct_entry fe;
	struct lb_affinity6_key ak;
	struct ct_key h; /* the tuple folded to 32-bit addresses, for the Maglev hash */
	struct lb_nat6_value nat; /* the SNAT source of this flow */
	__u64 fib[8]; /* lb_node_src's struct bpf_fib_lookup (bpf2go cannot mirror its unions) */
	__be16 snat_port;
	__u16 snat_flags; /* CT_F_SNAT | CT_F_HAIRPIN / CT_F_NODEPORT, or 0 */
	__u8 svc; /* create sk */
	__u8 flow; /* create (or complete) ft */
	__u8 allowed_reply; /* a reply translated back, of a flow policy allowed */
	__u8 tcpf;
	struct lb6_reply_hdr r;
	struct lb6_csum cs;
};

_Static_assert(sizeof(((struct lb6_pending *)0)->fib) == sizeof(struct bpf_fib_lookup), "lb6_pending.fib");

/* Scratch, per CPU (from_pod6's stack has no room): not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb6_pending);
} lk_lb6_pending SEC(".maps");

static __always_inline struct lb6_pending *lb6_pending_get(void)
{
	__u32 zero = 0;
	struct lb6_pending *p = bpf_map_lookup_elem(&lk_lb6_pending, &zero);

	if (p) {
		p->svc = 0;
		p->flow = 0;
		p->allowed_reply = 0;
	}
	return p;
}

static __always_inline struct lb_backend6_value *lb6_backend(__u32 id, __u32 frontend_id)
{
	struct lb_backend6_value *be = bpf_map_lookup_elem(&lk_lb_backends6, &id);

	if (be && be->frontend_id != frontend_id)
		return 0;
	return be;
}

/* lb6_fold folds 16 address bytes into 32 bits for the flow hash. */
static __always_inline __u32 lb6_fold(const struct in6_addr *a)
{
	return a->in6_u.u6_addr32[0] ^ a->in6_u.u6_addr32[1] ^ a->in6_u.u6_addr32[2] ^ a->in6_u.u6_addr32[3];
}

/* lb6_select is lb_select for IPv6: the client's affinity entry (fresh,
 * active backend), else Maglev over the flow hash. Returns the backend ID
 * (0: none) and the backend in *out. */
static __always_inline __u32 lb6_select(const struct lb_svc_value *svc, struct lb6_pending *pd,
					struct lb_backend6_value **out)
{
	struct lb_affinity_value *av;
	struct lb_backend6_value *be;
	__u64 now = bpf_ktime_get_ns();
	__u32 id;

	__builtin_memcpy(pd->ak.client, &pd->ft.saddr, 16);
	pd->ak.frontend_id = svc->frontend_id;
	if (svc->flags & LB_SVC_F_AFFINITY) {
		av = bpf_map_lookup_elem(&lk_lb_affinity6, &pd->ak);
		if (av && now - av->last_used <= (__u64)svc->affinity_seconds * 1000000000ULL) {
			id = av->backend_id;
			be = lb6_backend(id, svc->frontend_id);
			if (be && be->state == LB_BACKEND_ACTIVE) {
				av->last_used = now;
				lb_stat(LB_STAT_AFFINITY);
				*out = be;
				return id;
			}
		}
	}
	pd->h.saddr = lb6_fold(&pd->ft.saddr);
	pd->h.daddr = lb6_fold(&pd->ft.daddr);
	pd->h.sport = pd->ft.sport;
	pd->h.dport = pd->ft.dport;
	pd->h.proto = pd->ft.proto;
	id = lb_maglev_pick(svc, lb_flow_hash(&pd->h));
	be = id ? lb6_backend(id, svc->frontend_id) : 0;
	if (!be)
		return 0;
	if (svc->flags & LB_SVC_F_AFFINITY) {
		struct lb_affinity_value nv = { .last_used = now, .backend_id = id };

		bpf_map_update_elem(&lk_lb_affinity6, &pd->ak, &nv, BPF_ANY);
	}
	*out = be;
	return id;
}

/* lb6_rewrite rewrites the source (src 1) or destination address and port
 * of a TCP/UDP packet whose L4 header is at l4off, patching the L4 checksum
 * (IPv6 has no header checksum). l4off 0: a later fragment, which has no L4
 * header: the address only (its first fragment carried ports and checksum). */
static __always_inline int lb6_rewrite(struct __sk_buff *skb, __u32 l4off, __u8 proto, int src, const __u8 *addr,
				       __be16 port)
{
	__u32 addr_off = ETH_HLEN + (src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
	__u32 port_off = l4off + (src ? 0 : 2);
	__u32 csum_off = l4off + (proto == IPPROTO_TCP ? 16 : 6);
	__be32 old[4], new[4];
	__be16 old_port;
	__s64 diff;

	if (bpf_skb_load_bytes(skb, addr_off, old, 16) < 0)
		return -1;
	__builtin_memcpy(new, addr, 16);
	if (l4off) {
		if (bpf_skb_load_bytes(skb, port_off, &old_port, 2) < 0)
			return -1;
		diff = bpf_csum_diff(old, 16, new, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, 2) < 0 ||
		    bpf_skb_store_bytes(skb, port_off, &port, 2, 0) < 0)
			return -1;
	}
	if (bpf_skb_store_bytes(skb, addr_off, new, 16, 0) < 0)
		return -1;
	return 0;
}

/* lb6_rev_nat translates a reply of a load-balanced IPv6 flow (tuple
 * pd->ft; l4off 0: a later fragment) back: its source to the frontend
 * (CT_F_REVNAT), its destination to the original client (CT_F_SNAT, from
 * lk_ct6_nat). Returns 1 when rewritten, 0 when not, -1 on a failed
 * rewrite. */
static __always_inline int lb6_rev_nat(struct __sk_buff *skb, __u32 l4off, struct lb6_pending *pd)
{
	struct lb_revnat6_value *rn;
	struct lb_nat6_value *nat = 0;
	struct ct_entry *e = 0;
	__be16 nat_port;
	__u16 flags;

	if (ct_lookup6(&pd->ft, pd->tcpf, &e) != CT_REPLY || !e)
		return 0;
	flags = e->flags;
	nat_port = e->nat_port;
	if (!(flags & (CT_F_REVNAT | CT_F_SNAT)))
		return 0;
	if (flags & CT_F_SNAT) {
		ct6_key_swap(&pd->ft); /* the entry's key */
		nat = bpf_map_lookup_elem(&lk_ct6_nat, &pd->ft);
		ct6_key_swap(&pd->ft);
		if (!nat)
			return 0;
	}
	if (flags & CT_F_REVNAT) {
		rn = bpf_map_lookup_elem(&lk_lb_revnat6, &e->rev_nat_id);
		if (rn && lb6_rewrite(skb, l4off, pd->ft.proto, 1, rn->addr, bpf_htons(rn->port)) < 0)
			return -1;
	}
	if (nat && lb6_rewrite(skb, l4off, pd->ft.proto, 0, nat->addr, nat_port) < 0)
		return -1;
	lb_stat(LB_STAT_REVNAT);
	if (flags & CT_F_POLICY)
		pd->allowed_reply = 1;
	return 1;
}

/* lb6_icmp_rev_nat translates an ICMPv6 error (unreachable, packet too
 * big, time exceeded, parameter problem) about a load-balanced flow back,
 * as lb_icmp_rev_nat does for IPv4: the quoted packet's destination becomes
 * the frontend again (and, for a flow this node source-NATed, its source
 * and the outer destination the client), the outer source the frontend
 * when the backend itself sent it, so the client learns it for the address it used (Packet Too Big:
 * path MTU discovery). The quoted packet must be the flow's IPv6 header
 * without extension headers and its ports. The ICMPv6 checksum is patched
 * incrementally; the quoted L4 checksum is left alone. Returns 1 when
 * rewritten, 0 when not, -1 on a failed rewrite. */
static __always_inline int lb6_icmp_rev_nat(struct __sk_buff *skb, const struct lk_ip6_chain *c, struct lb6_pending *pd)
{
	__u32 in = c->off + 8, csum_off = c->off + 2; /* the quoted IPv6 header; the ICMPv6 checksum */
	struct lb_revnat6_value *rn;
	struct ct_entry *e;
	__be32 old[4], new[4];
	__be16 new_port;
	__u8 type, nh;
	__s64 diff;

	if (c->nh != IPPROTO_ICMPV6 || c->frag || bpf_skb_load_bytes(skb, c->off, &type, 1) < 0 || type < 1 ||
	    type > 4)
		return 0;
	if (bpf_skb_load_bytes(skb, in + 6, &nh, 1) < 0 || (nh != IPPROTO_TCP && nh != IPPROTO_UDP))
		return 0;
	/* The quoted flow, as the client sent it after DNAT: client -> backend. */
	if (bpf_skb_load_bytes(skb, in + 8, &pd->ft.saddr, 32) < 0 ||
	    bpf_skb_load_bytes(skb, in + 40, &pd->ft.sport, 4) < 0)
		return 0;
	pd->ft.proto = nh;
	pd->ft.flags = 0;
	pd->ft.pad = 0;
	e = bpf_map_lookup_elem(&lk_ct6, &pd->ft);
	if (!e || !(e->flags & CT_F_REVNAT))
		return 0;
	rn = bpf_map_lookup_elem(&lk_lb_revnat6, &e->rev_nat_id);
	if (!rn)
		return 0;
	if (e->flags & CT_F_SNAT) {
		/* A flow this node source-NATed (NodePort from the wire,
		 * hairpin): the error went to the SNAT source; the quoted
		 * source and the outer destination become the client again. */
		struct lb_nat6_value *nat = bpf_map_lookup_elem(&lk_ct6_nat, &pd->ft);
		__u32 dst_off = ETH_HLEN + offsetof(struct ipv6hdr, daddr);
		__be16 cport = e->nat_port;

		if (!nat)
			return 0;
		__builtin_memcpy(old, &pd->ft.saddr, 16);
		__builtin_memcpy(new, nat->addr, 16);
		diff = bpf_csum_diff(old, 16, new, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, pd->ft.sport, cport, 2) < 0 ||
		    bpf_skb_store_bytes(skb, in + 8, new, 16, 0) < 0 || bpf_skb_store_bytes(skb, in + 40, &cport, 2, 0) < 0)
			return -1;
		if (bpf_skb_load_bytes(skb, dst_off, old, 16) < 0)
			return -1;
		if (old[0] == pd->ft.saddr.in6_u.u6_addr32[0] && old[1] == pd->ft.saddr.in6_u.u6_addr32[1] &&
		    old[2] == pd->ft.saddr.in6_u.u6_addr32[2] && old[3] == pd->ft.saddr.in6_u.u6_addr32[3] &&
		    (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) < 0 ||
		     bpf_skb_store_bytes(skb, dst_off, new, 16, 0) < 0))
			return -1;
	}
	if (e->flags & CT_F_POLICY)
		pd->allowed_reply = 1;
	__builtin_memcpy(old, &pd->ft.daddr, 16);
	__builtin_memcpy(new, rn->addr, 16);
	new_port = bpf_htons(rn->port);
	diff = bpf_csum_diff(old, 16, new, 16, 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) < 0 ||
	    bpf_l4_csum_replace(skb, csum_off, pd->ft.dport, new_port, 2) < 0 ||
	    bpf_skb_store_bytes(skb, in + 24, new, 16, 0) < 0 || bpf_skb_store_bytes(skb, in + 42, &new_port, 2, 0) < 0)
		return -1;
	/* Sent by the backend itself: from the frontend. */
	{
		__be32 src[4];

		if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), src, 16) < 0)
			return -1;
		if (src[0] == old[0] && src[1] == old[1] && src[2] == old[2] && src[3] == old[3] &&
		    (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) < 0 ||
		     bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), new, 16, 0) < 0))
			return -1;
	}
	lb_stat(LB_STAT_REVNAT);
	return 1;
}

/* lb6_reply_for builds in pd the answer to the packet (chain c) of a new
 * flow without a backend, sent back from the frontend: a TCP reset (RFC
 * 9293 3.10.7.1) or an ICMPv6 port unreachable (RFC 4443 3.1). Returns 0,
 * or -1 to answer nothing (a reset, an unreadable packet). */
static __always_inline int lb6_reply_for(struct __sk_buff *skb, const struct lk_ip6_chain *c, struct lb6_pending *pd)
{
	struct lb6_reply_hdr *r = &pd->r;
	struct lb6_csum *cs = &pd->cs;
	__u8 th[14];

	if (bpf_skb_load_bytes(skb, 0, r->smac, 6) < 0 || bpf_skb_load_bytes(skb, 6, r->dmac, 6) < 0)
		return -1;
	r->proto = bpf_htons(ETH_P_IPV6);
	r->ip.ver_tc_flow = bpf_htonl(6 << 28);
	r->ip.hop_limit = 64;
	__builtin_memcpy(r->ip.saddr, &pd->ft.daddr, 16);
	__builtin_memcpy(r->ip.daddr, &pd->ft.saddr, 16);
	__builtin_memset(cs, 0, sizeof(*cs));
	__builtin_memcpy(cs->saddr, &pd->ft.daddr, 16);
	__builtin_memcpy(cs->daddr, &pd->ft.saddr, 16);
	if (pd->ft.proto == IPPROTO_TCP) {
		__u32 seq, paylen, hdrs = c->off - ETH_HLEN - sizeof(struct ipv6hdr);
		__be16 plen;

		if (bpf_skb_load_bytes(skb, c->off, th, sizeof(th)) < 0 || (th[13] & CT_TCP_RST) ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 4, &plen, 2) < 0)
			return -1;
		paylen = bpf_ntohs(plen);
		paylen = paylen > hdrs + (th[12] >> 4) * 4 ? paylen - hdrs - (th[12] >> 4) * 4 : 0;
		cs->rst.sport = pd->ft.dport;
		cs->rst.dport = pd->ft.sport;
		cs->rst.doff = 5 << 4;
		if (th[13] & CT_TCP_ACK) {
			__builtin_memcpy(&cs->rst.seq, &th[8], 4);
			cs->rst.flags = CT_TCP_RST;
		} else {
			__builtin_memcpy(&seq, &th[4], 4);
			seq = bpf_ntohl(seq) + paylen + !!(th[13] & CT_TCP_SYN) + !!(th[13] & CT_TCP_FIN);
			cs->rst.ack = bpf_htonl(seq);
			cs->rst.flags = CT_TCP_RST | CT_TCP_ACK;
		}
		cs->nh = IPPROTO_TCP;
		cs->len = bpf_htonl(LB6_RST_LEN);
		cs->rst.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)cs, 40 + LB6_RST_LEN, 0));
		r->ip.nexthdr = IPPROTO_TCP;
		r->ip.payload_len = bpf_htons(LB6_RST_LEN);
		return 0;
	}
	cs->unreach.type = 1; /* destination unreachable */
	cs->unreach.code = 4; /* port unreachable */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, cs->unreach.orig, sizeof(cs->unreach.orig)) < 0)
		return -1;
	cs->nh = IPPROTO_ICMPV6;
	cs->len = bpf_htonl(LB6_UNREACH_LEN);
	cs->unreach.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)cs, 40 + LB6_UNREACH_LEN, 0));
	r->ip.nexthdr = IPPROTO_ICMPV6;
	r->ip.payload_len = bpf_htons(LB6_UNREACH_LEN);
	return 0;
}

/* lb6_no_backend answers a new flow to a frontend without backends
 * (lb_no_backend for IPv6): into the endpoint that sent it, or (ep NULL)
 * back out of the device it arrived on; counted as a DROP_NO_BACKEND drop
 * of the endpoint (0: the wire). */
static __always_inline int lb6_no_backend(struct __sk_buff *skb, const struct lk_ip6_chain *c,
					  struct lb6_pending *pd, const struct endpoint_info *ep)
{
	__u32 hdr = sizeof(struct lb6_reply_hdr);

	lb_stat(LB_STAT_NO_BACKEND);
	lb_count_drop(skb, ep ? ep->id : 0, DROP_NO_BACKEND);
	if (lb6_reply_for(skb, c, pd) < 0)
		return TC_ACT_SHOT;
	if (pd->cs.nh == IPPROTO_TCP) {
		if (bpf_skb_change_tail(skb, hdr + LB6_RST_LEN, 0) < 0 ||
		    bpf_skb_store_bytes(skb, hdr, &pd->cs.rst, LB6_RST_LEN, 0) < 0)
			return TC_ACT_SHOT;
	} else if (bpf_skb_change_tail(skb, hdr + LB6_UNREACH_LEN, 0) < 0 ||
		   bpf_skb_store_bytes(skb, hdr, &pd->cs.unreach, LB6_UNREACH_LEN, 0) < 0) {
		return TC_ACT_SHOT;
	}
	if (bpf_skb_store_bytes(skb, 0, &pd->r, hdr, 0) < 0)
		return TC_ACT_SHOT;
	if (ep)
		return to_endpoint(skb, ep);
	trace_redirect(skb->ifindex, REDIR_PLAIN, skb->queue_mapping);
	return bpf_redirect(skb->ifindex, 0);
}

/* lb6_snat_source fills pd->nat with the source a new flow of frontend svc
 * to backend be is translated to (pd->snat_flags says which kind). Returns
 * 0, or -1 when the node has no route to the backend. */
static __always_inline int lb6_snat_source(struct __sk_buff *skb, const struct lb_svc_value *svc,
					   const struct lb_backend6_value *be, struct lb6_pending *pd)
{
	if (pd->snat_flags & CT_F_HAIRPIN) {
		__builtin_memset(pd->nat.addr, 0, 16);
		pd->nat.addr[0] = 0x01; /* 100:: */
		*(__be32 *)&pd->nat.addr[12] = bpf_htonl(LB_HAIRPIN_IP6_W3);
		return 0;
	}
	if (svc->flags & LB_SVC_F_EXTERNAL)
		return lb_node_src(skb, (struct bpf_fib_lookup *)pd->fib, 1, be->addr, pd->nat.addr);
	__builtin_memcpy(pd->nat.addr, &pd->ft.daddr, 16); /* the node address the client reached */
	return 0;
}

/* lb6_forward load-balances the packet (tuple pd->ft; l4off 0: a later
 * fragment) to frontend svc of scope `scope`: lb_forward for IPv6. A tracked
 * flow keeps its backend and SNAT; a new one takes lb6_select's backend,
 * and lb_snat_kind's SNAT, whose entries are created at once (the port is
 * allocated by creating the flow entry); the others wait for lb6_commit. */
static __always_inline int lb6_forward(struct __sk_buff *skb, const struct lk_ip6_chain *c, __u32 l4off,
				       const struct lb_svc_value *svc, __u8 scope, const struct endpoint_info *ep,
				       struct lb6_pending *pd, int *changed)
{
	struct lb_backend6_value *be = 0;
	struct lb_nat6_value *nat;
	struct ct_entry *se = 0;
	__u32 id = 0, ep_id = ep ? ep->id : 0;

	pd->sk = pd->ft;
	pd->sk.flags = CT_KEY_SERVICE;
	pd->snat_flags = 0;
	if (ct_lookup6(&pd->sk, pd->tcpf, &se) != CT_NEW && se) {
		id = se->backend_id;
		be = lb6_backend(id, svc->frontend_id);
		if (be && (se->flags & CT_F_SNAT)) {
			nat = bpf_map_lookup_elem(&lk_ct6_nat, &pd->sk);
			if (nat) {
				pd->nat = *nat;
				pd->snat_port = se->nat_port;
				pd->snat_flags = se->flags & (CT_F_SNAT | CT_F_HAIRPIN | CT_F_NODEPORT);
			} else {
				be = 0; /* its SNAT source is gone: a new choice */
			}
		}
		if (be)
			lb_stat(LB_STAT_CT_HIT);
	}
	if (!be) {
		if (se)
			lb_stat(LB_STAT_RESELECT);
		id = lb6_select(svc, pd, &be);
		if (!id || !be) {
			int v = lb_no_backend_drop(skb, svc, l4off, ep_id);

			if (v != LB_CONTINUE)
				return v;
			*changed = 1; /* the packet was rewritten (the verifier sees any verdict) */
			return lb6_no_backend(skb, c, pd, ep);
		}
		lb_stat(LB_STAT_NEW_FLOW);
		pd->snat_flags = lb_snat_kind(ip6_equal(&pd->ft.saddr, be->addr), scope, ep,
					      scope == LB_SCOPE_NODEPORT && !ep &&
						      (bpf_map_lookup_elem(&lk_endpoints6, be->addr) ||
						       ip6_equal(&pd->ft.daddr, be->addr)));
		pd->se = (struct ct_entry){ .backend_id = id, .rev_nat_id = svc->frontend_id };
		if (pd->snat_flags) {
			struct ct6_key *ft = &pd->ft;

			if (lb6_snat_source(skb, svc, be, pd) < 0) {
				lb_count_drop(skb, ep_id, DROP_FIB_FAILED);
				return TC_ACT_SHOT;
			}
			/* The flow entry: its source port allocated by creating it. */
			pd->fe = (struct ct_entry){ .rev_nat_id = svc->frontend_id,
						    .nat_port = pd->sk.sport,
						    .flags = CT_F_REVNAT | pd->snat_flags };
			__builtin_memcpy(&ft->saddr, pd->nat.addr, 16);
			__builtin_memcpy(&ft->daddr, be->addr, 16);
			ft->dport = bpf_htons(be->port);
			pd->snat_port = lb_snat_flow_in(1, ft, &ft->sport, 0, &pd->fe, lb_flow_hash(&pd->h),
							(pd->snat_flags & CT_F_HAIRPIN) ? pd->sk.sport : 0);
			if (!pd->snat_port) {
				lb_count_drop(skb, ep_id, DROP_NAT_NO_PORT);
				return TC_ACT_SHOT;
			}
			/* The original client, for the replies (lk_ct6_nat). */
			bpf_map_update_elem(&lk_ct6_nat, ft, &pd->sk.saddr, BPF_ANY);
			/* The service entry, with the source used (at once too). */
			pd->se.nat_port = pd->snat_port;
			pd->se.flags = pd->snat_flags;
			bpf_map_update_elem(&lk_ct6_nat, &pd->sk, &pd->nat, BPF_ANY);
			ct_create6(&pd->sk, &pd->se);
		} else {
			pd->svc = 1;
		}
	}
	if (lb6_rewrite(skb, l4off, pd->ft.proto, 0, be->addr, bpf_htons(be->port)) < 0)
		return drop(skb, ep_id, DROP_MALFORMED);
	if (pd->snat_flags && lb6_rewrite(skb, l4off, pd->ft.proto, 1, pd->nat.addr, pd->snat_port) < 0)
		return drop(skb, ep_id, DROP_MALFORMED);
	/* The flow entry on the translated tuple (replies match it reversed). */
	if (pd->snat_flags) {
		__builtin_memcpy(&pd->ft.saddr, pd->nat.addr, 16);
		pd->ft.sport = pd->snat_port;
	}
	__builtin_memcpy(&pd->ft.daddr, be->addr, 16);
	pd->ft.dport = bpf_htons(be->port);
	pd->fe = (struct ct_entry){ .rev_nat_id = svc->frontend_id,
				    .nat_port = pd->sk.sport,
				    .flags = CT_F_REVNAT | pd->snat_flags };
	pd->flow = 1;
	*changed = 1;
	return LB_CONTINUE;
}

/* lb6 is the [LB] step for IPv6: a packet an endpoint sent (ep) to a
 * ClusterIP frontend, else to a NodePort one on the node's address, or one
 * from the wire (ep NULL) to a NodePort scope frontend (NodePort, external
 * address) is load-balanced; replies are translated back first. Returns
 * LB_CONTINUE (*changed: the packet was rewritten, the caller parses it
 * again) or a TC verdict. */
static __always_inline int lb6(struct __sk_buff *skb, const struct pkt *p, const struct lk_ip6_chain *c,
			       const struct endpoint_info *ep, struct lb6_pending *pd, int *changed)
{
	struct lb_svc6_key sk = {};
	struct lb_svc_value *svc;
	__u32 ep_id = ep ? ep->id : 0;
	__u32 l4off = c->later ? 0 : c->off; /* a later fragment: the addresses only */
	int r;

	*changed = 0;
	if (!pd)
		return LB_CONTINUE;
	r = lb6_icmp_rev_nat(skb, c, pd);
	if (r < 0)
		return drop(skb, ep_id, DROP_MALFORMED);
	if (r) {
		*changed = 1;
		return LB_CONTINUE;
	}
	if (c->nh != IPPROTO_TCP && c->nh != IPPROTO_UDP)
		return LB_CONTINUE;
	r = ct_tuple6(skb, p->ip6, c, &pd->ft, &pd->tcpf);
	if (r == -2) {
		lb_count_drop(skb, ep_id, DROP_FRAG_NOT_FOUND);
		return TC_ACT_SHOT;
	}
	if (r < 0)
		return LB_CONTINUE;
	r = lb6_rev_nat(skb, l4off, pd);
	if (r < 0)
		return drop(skb, ep_id, DROP_MALFORMED);
	if (r) {
		*changed = 1;
		return LB_CONTINUE;
	}
	__builtin_memcpy(sk.addr, &pd->ft.daddr, 16);
	sk.port = bpf_ntohs(pd->ft.dport);
	sk.proto = pd->ft.proto;
	sk.scope = ep ? LB_SCOPE_CLUSTERIP : LB_SCOPE_NODEPORT;
	svc = bpf_map_lookup_elem(&lk_lb_svc6, &sk);
	if (!svc && ep) {
		/* A pod reaching a NodePort on this node's address. */
		sk.scope = LB_SCOPE_NODEPORT;
		svc = bpf_map_lookup_elem(&lk_lb_svc6, &sk);
	}
	if (!svc)
		return LB_CONTINUE;
	if (!lb_src_range_ok(svc, 1, &pd->ft.saddr)) {
		lb_count_drop(skb, ep_id, DROP_LB_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	return lb6_forward(skb, c, l4off, svc, sk.scope, ep, pd, changed);
}

/* lb6_commit creates what lb6 left pending, after the packet passed policy
 * (lb_commit). The flow entry of a tracked flow is refreshed or completed;
 * a source-NATed flow's was created by lb6_forward (re-created here, with
 * its lk_ct6_nat entry, should the LRU have dropped it). */
static __always_inline void lb6_commit(struct lb6_pending *pd)
{
	struct ct_entry *fe = 0;

	if (!pd)
		return;
	if (pd->svc)
		ct_create6(&pd->sk, &pd->se);
	if (!pd->flow)
		return;
	if (ct_lookup6(&pd->ft, pd->tcpf, &fe) != CT_NEW && fe) {
		fe->rev_nat_id = pd->fe.rev_nat_id;
		fe->nat_port = pd->fe.nat_port;
		fe->flags |= pd->fe.flags;
		return;
	}
	if (pd->snat_flags)
		bpf_map_update_elem(&lk_ct6_nat, &pd->ft, &pd->sk.saddr, BPF_ANY);
	ct_create6(&pd->ft, &pd->fe);
}

#endif
