/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_reply.h: the packets the service load balancer answers itself instead
 * of forwarding (lb.h, lb6.h): a TCP reset or an ICMP port unreachable for a
 * new flow to a frontend without backends (as kube-proxy's REJECT rules),
 * or a counted drop, decided by lb_no_backend_drop for both families. */
#ifndef LK_LB_REPLY_H
#define LK_LB_REPLY_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "csum.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "ct.h"
#include "events.h"
#include "fib.h"
#include "lb_maps.h"

/* lb_count_drop counts a packet the LB answered instead of forwarding. */
static __always_inline void lb_count_drop(struct __sk_buff *skb, __u32 ep_id, __u32 reason)
{
	metrics_add(ep_id, METRIC_DROP_BASE + reason, skb->len);
	event_drop(reason, ep_id, skb->ifindex, skb->len, (void *)(long)skb->data, (void *)(long)skb->data_end);
}

struct lb_reply_hdr {
	__u8 dmac[6];
	__u8 smac[6];
	__be16 proto;
	struct iphdr ip;
} __attribute__((packed));

/* lb_reply_ip fills a reply's Ethernet + IPv4 header (addresses swapped)
 * with its checksum. */
static __always_inline int lb_reply_ip(struct __sk_buff *skb, struct lb_reply_hdr *h, const struct ct_key *t,
				       __u8 proto, __u16 l4len)
{
	__u8 macs[12];

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0)
		return -1;
	__builtin_memcpy(h->dmac, &macs[6], 6);
	__builtin_memcpy(h->smac, &macs[0], 6);
	h->proto = bpf_htons(ETH_P_IP);
	struct iphdr ip = {};

	ip.version = 4;
	ip.ihl = 5;
	ip.tot_len = bpf_htons(20 + l4len);
	ip.frag_off = bpf_htons(0x4000); /* DF */
	ip.ttl = 64;
	ip.protocol = proto;
	ip.saddr = t->daddr;
	ip.daddr = t->saddr;
	ip.check = ipv4_csum(&ip);
	__builtin_memcpy(&h->ip, &ip, sizeof(ip));
	return 0;
}

struct lb_rst {
	struct lb_reply_hdr h;
	__be16 sport, dport;
	__be32 seq, ack;
	__u8 doff, flags;
	__be16 window, check, urg;
} __attribute__((packed));

/* lb_reply_rst turns a TCP segment into the reset a closed port answers
 * (RFC 9293 3.10.7.1). Returns 0, or -1 to drop (e.g. it is a reset). */
static __always_inline int lb_reply_rst(struct __sk_buff *skb, const struct ct_key *t, __u32 l4off,
					__u16 tot_len, __u32 ihl)
{
	__u8 th[14];
	struct lb_rst r;
	struct {
		__be32 saddr, daddr;
		__u8 zero, proto;
		__be16 len;
		__be16 sport, dport;
		__be32 seq, ack;
		__u8 doff, flags;
		__be16 window, check, urg;
	} __attribute__((packed)) ps;
	__u32 seq, paylen;
	__u8 doff;

	if (bpf_skb_load_bytes(skb, l4off, th, sizeof(th)) < 0)
		return -1;
	if (th[13] & CT_TCP_RST)
		return -1;
	doff = (th[12] >> 4) * 4;
	paylen = tot_len > ihl + doff ? tot_len - ihl - doff : 0;
	if (lb_reply_ip(skb, &r.h, t, IPPROTO_TCP, 20) < 0)
		return -1;
	r.sport = t->dport;
	r.dport = t->sport;
	r.doff = 5 << 4;
	r.window = 0;
	r.check = 0;
	r.urg = 0;
	if (th[13] & CT_TCP_ACK) {
		__builtin_memcpy(&r.seq, &th[8], 4);
		r.ack = 0;
		r.flags = CT_TCP_RST;
	} else {
		__builtin_memcpy(&seq, &th[4], 4);
		seq = bpf_ntohl(seq) + paylen + !!(th[13] & CT_TCP_SYN) + !!(th[13] & CT_TCP_FIN);
		r.seq = 0;
		r.ack = bpf_htonl(seq);
		r.flags = CT_TCP_RST | CT_TCP_ACK;
	}
	ps.saddr = r.h.ip.saddr;
	ps.daddr = r.h.ip.daddr;
	ps.zero = 0;
	ps.proto = IPPROTO_TCP;
	ps.len = bpf_htons(20);
	__builtin_memcpy(&ps.sport, &r.sport, 20);
	r.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&ps, sizeof(ps), 0));
	if (bpf_skb_change_tail(skb, sizeof(r), 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, 0, &r, sizeof(r), 0) < 0)
		return -1;
	return 0;
}

struct lb_icmp_unreach {
	__u8 type, code;
	__be16 check;
	__be32 unused;
	__u8 orig[28]; /* the offending IPv4 header + 8 bytes */
};

struct lb_unreach {
	struct lb_reply_hdr h;
	struct lb_icmp_unreach icmp;
} __attribute__((packed));

/* lb_reply_unreach turns a UDP datagram into ICMP port unreachable. */
static __always_inline int lb_reply_unreach(struct __sk_buff *skb, const struct ct_key *t, __u32 ihl)
{
	struct lb_icmp_unreach icmp = {};
	struct lb_unreach r;

	if (ihl != 20)
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, icmp.orig, sizeof(icmp.orig)) < 0)
		return -1;
	if (lb_reply_ip(skb, &r.h, t, IPPROTO_ICMP, sizeof(icmp)) < 0)
		return -1;
	icmp.type = LK_ICMP_DEST_UNREACH;
	icmp.code = LK_ICMP_PORT_UNREACH;
	icmp.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&icmp, sizeof(icmp), 0));
	__builtin_memcpy(&r.icmp, &icmp, sizeof(icmp));
	if (bpf_skb_change_tail(skb, sizeof(r), 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, 0, &r, sizeof(r), 0) < 0)
		return -1;
	return 0;
}

/* lb_no_backend_drop decides, for both families, what becomes of a new
 * flow to frontend svc that found no backend: a traffic policy Local
 * frontend drops it without an answer, as kube-proxy does (the client's
 * load balancer, told by healthCheckNodePort, goes elsewhere:
 * DROP_NO_LOCAL_BACKEND); a later fragment (l4off 0) has nothing to answer
 * with (DROP_NO_BACKEND). Returns that verdict, or LB_CONTINUE: answer it
 * (lb_no_backend, lb6_no_backend). */
static __always_inline int lb_no_backend_drop(struct __sk_buff *skb, const struct lb_svc_value *svc, __u32 l4off,
					      __u32 ep_id)
{
	if (svc->flags & LB_SVC_F_LOCAL) {
		lb_count_drop(skb, ep_id, DROP_NO_LOCAL_BACKEND);
		return TC_ACT_SHOT;
	}
	if (!l4off) {
		lb_stat(LB_STAT_NO_BACKEND);
		lb_count_drop(skb, ep_id, DROP_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	return LB_CONTINUE;
}

/* lb_no_backend answers a new flow to a frontend without backends: a TCP
 * reset or ICMP port unreachable, sent back where the packet came from (ep:
 * into the sending endpoint; NULL: out of the device it arrived on). */
static __always_inline int lb_no_backend(struct __sk_buff *skb, const struct ct_key *t, __u32 l4off,
					 __u16 tot_len, __u32 ihl, const struct endpoint_info *ep)
{
	int err;

	lb_stat(LB_STAT_NO_BACKEND);
	lb_count_drop(skb, ep ? ep->id : 0, DROP_NO_BACKEND);
	if (t->proto == IPPROTO_TCP)
		err = lb_reply_rst(skb, t, l4off, tot_len, ihl);
	else
		err = lb_reply_unreach(skb, t, ihl);
	if (err < 0)
		return TC_ACT_SHOT;
	if (ep)
		return to_endpoint(skb, ep);
	trace_redirect(skb->ifindex, REDIR_PLAIN, skb->queue_mapping);
	return bpf_redirect(skb->ifindex, 0);
}

#endif
