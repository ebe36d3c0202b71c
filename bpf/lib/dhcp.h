/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* dhcp.h: the DHCPv4 server of a VM's link, as arp.h is its ARP responder.
 *
 * A guest on the fast lane gets its address the way KubeVirt's bridge and
 * masquerade bindings (and passt) give one: by DHCP, with no server process.
 * from_pod answers a VM endpoint's DISCOVER with an OFFER and its REQUEST for
 * its own address with an ACK, built in place and handed back through the VM's
 * device (to_endpoint), as the ARP reply is. The lease is the endpoint's
 * address, fixed for the VM's life (live migration keeps it): /32, an
 * infinite lease, the gateway (gateway_ip) as server, router and, in the
 * classless static routes (RFC 3442, which clients prefer to the router
 * option), as an on-link /32 plus the default route, the routes the CNI
 * result gives a pod. The agent adds what KubeVirt's own DHCP (its bridge
 * binding) gives a guest from the launcher pod: DNS servers, search domains
 * and the MTU, rendered per endpoint into lk_dhcp_opts (datapath.DHCPOptions)
 * and copied in after the fixed options; none without an entry.
 *
 * What the guest writes is not trusted: the frame's source MAC and the
 * client hardware address must be the endpoint's MAC, the source address
 * 0.0.0.0 or the endpoint's, the message a BOOTREQUEST with the DHCP cookie
 * and no relay agent (giaddr); options are walked within the UDP payload, at
 * most LK_DHCP_OPTS_MAX of them (what lies beyond is not read), and one
 * running past the payload is malformed. A REQUEST for another address gets a NAK; a REQUEST naming
 * another server, RELEASE, DECLINE, INFORM, messages without a type and
 * any from a VM without an IPv4 address are dropped and counted (DROP_DHCP). Pods get no DHCP: this runs for VM
 * endpoints only. */
#ifndef LK_DHCP_H
#define LK_DHCP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "csum.h"
#include "arp.h" /* gateway_ip */
#include "deliver.h"
#include "frag.h" /* LK_IP_MF, LK_IP_OFFSET */
#include "parse.h"

#define LK_DHCP_OPTS_MAX 48 /* options walked in one message */

#define DHCP_SERVER_PORT 67
#define DHCP_CLIENT_PORT 68
#define DHCP_MAGIC 0x63825363
#define DHCP_BROADCAST_FLAG 0x8000

enum {
	DHCP_DISCOVER = 1,
	DHCP_OFFER = 2,
	DHCP_REQUEST = 3,
	DHCP_ACK = 5,
	DHCP_NAK = 6,
};

enum {
	DHCP_OPT_PAD = 0,
	DHCP_OPT_MASK = 1,
	DHCP_OPT_ROUTER = 3,
	DHCP_OPT_REQUESTED_IP = 50,
	DHCP_OPT_LEASE = 51,
	DHCP_OPT_TYPE = 53,
	DHCP_OPT_SERVER_ID = 54,
	DHCP_OPT_CLASSLESS_ROUTES = 121,
	DHCP_OPT_END = 255,
};

/* The BOOTP header up to the client hardware address (RFC 2131 2). */
struct bootp_head {
	__u8 op, htype, hlen, hops;
	__be32 xid;
	__be16 secs, flags;
	__be32 ciaddr, yiaddr, siaddr, giaddr;
	__u8 chaddr[16];
} __attribute__((packed));

#define BOOTP_NAMES_LEN (64 + 128) /* sname, file: zero in replies */
#define DHCP_FIXED_OPTS 43 /* what dhcp_opts writes before END */
/* The agent's options per endpoint: bytes of whole options, up to what
 * keeps a reply within the 576-byte datagram every client accepts (RFC
 * 2131 2: 548 bytes of DHCP message, of which 240 before the options). */
#define LK_DHCP_EXTRA_MAX 224
#define DHCP_OPTS_AREA (DHCP_FIXED_OPTS + LK_DHCP_EXTRA_MAX + 1) /* + END */
#define DHCP_HEAD_OFF (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))
#define DHCP_COOKIE_OFF (DHCP_HEAD_OFF + sizeof(struct bootp_head) + BOOTP_NAMES_LEN)
#define DHCP_OPTS_OFF (DHCP_COOKIE_OFF + 4)

/* A whole reply, built in a per-CPU scratch entry (from_pod's stack is
 * nearly full) and stored into the packet at once. */
struct dhcp_reply {
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__be16 proto;
	struct { /* struct iphdr without its address union, which bpf2go cannot render */
		__u8 ver_ihl, tos;
		__be16 tot_len, id, frag_off;
		__u8 ttl, protocol;
		__be16 check;
		__be32 saddr, daddr;
	} __attribute__((packed)) ip;
	struct udphdr udp;
	struct bootp_head b;
	__u8 names[BOOTP_NAMES_LEN]; /* sname, file */
	__be32 cookie;
	__u8 opts[DHCP_OPTS_AREA];
} __attribute__((packed));

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dhcp_reply);
} lk_dhcp_reply SEC(".maps");

/* lk_dhcp_opts value: len bytes of options (each whole: code, length,
 * value), zero after them. */
struct dhcp_extra {
	__u16 len;
	__u8 opts[LK_DHCP_EXTRA_MAX];
};

/* An endpoint's extra DHCP options (key: endpoint ID), VM endpoints only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct dhcp_extra);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_dhcp_opts SEC(".maps");

/* What the walk of the options found (0: absent). */
struct dhcp_req {
	__u8 type;
	__be32 requested;
	__be32 server;
};

/* dhcp_parse_opts walks the options in [off, end). Returns 0, or a drop
 * reason. An option's length is checked against the payload before its value
 * is read; a message without END ends at the payload's end. */
static __always_inline __u32 dhcp_parse_opts(struct __sk_buff *skb, __u32 off, __u32 end, struct dhcp_req *r)
{
	for (int i = 0; i < LK_DHCP_OPTS_MAX; i++) {
		__u8 h[2];

		if (off >= end)
			return 0;
		if (bpf_skb_load_bytes(skb, off, h, 1) < 0)
			return DROP_MALFORMED;
		if (h[0] == DHCP_OPT_END)
			return 0;
		if (h[0] == DHCP_OPT_PAD) {
			off++;
			continue;
		}
		if (off + 2 > end || bpf_skb_load_bytes(skb, off, h, 2) < 0)
			return DROP_MALFORMED;
		if (off + 2 + h[1] > end)
			return DROP_MALFORMED;
		if (h[0] == DHCP_OPT_TYPE && h[1] == 1) {
			if (bpf_skb_load_bytes(skb, off + 2, &r->type, 1) < 0)
				return DROP_MALFORMED;
		} else if (h[0] == DHCP_OPT_REQUESTED_IP && h[1] == 4) {
			if (bpf_skb_load_bytes(skb, off + 2, &r->requested, 4) < 0)
				return DROP_MALFORMED;
		} else if (h[0] == DHCP_OPT_SERVER_ID && h[1] == 4) {
			if (bpf_skb_load_bytes(skb, off + 2, &r->server, 4) < 0)
				return DROP_MALFORMED;
		}
		off += 2 + h[1];
	}
	return 0; /* the walk's limit: what it found counts */
}

/* dhcp_opts fills the reply's options: message type and server, and for an
 * OFFER or ACK the lease (infinite), mask (/32), router and classless routes,
 * then the endpoint's entry in lk_dhcp_opts. The area was zeroed. */
static __always_inline void dhcp_opts(__u8 *o, __u8 type, const __u32 *ep_id)
{
	struct dhcp_extra *x;
	__u32 n;
	__be32 g = gateway_ip; /* read through the volatile object (see vm.c is_vm_mac) */
	__u8 gw[4];

	__builtin_memcpy(gw, &g, 4);
	o[0] = DHCP_OPT_TYPE;
	o[1] = 1;
	o[2] = type;
	o[3] = DHCP_OPT_SERVER_ID;
	o[4] = 4;
	__builtin_memcpy(&o[5], gw, 4);
	if (type == DHCP_NAK) {
		o[9] = DHCP_OPT_END;
		return;
	}
	o[9] = DHCP_OPT_LEASE;
	o[10] = 4;
	__builtin_memset(&o[11], 0xff, 4);
	o[15] = DHCP_OPT_MASK;
	o[16] = 4;
	__builtin_memset(&o[17], 0xff, 4);
	o[21] = DHCP_OPT_ROUTER;
	o[22] = 4;
	__builtin_memcpy(&o[23], gw, 4);
	/* gateway/32 on-link (router 0.0.0.0), then 0.0.0.0/0 via the gateway */
	o[27] = DHCP_OPT_CLASSLESS_ROUTES;
	o[28] = 14;
	o[29] = 32;
	__builtin_memcpy(&o[30], gw, 4);
	/* o[34..37]: router 0.0.0.0 (zeroed) */
	o[38] = 0;
	__builtin_memcpy(&o[39], gw, 4);
	o[DHCP_FIXED_OPTS] = DHCP_OPT_END;
	/* The key is the endpoint entry's own field (a map value): no stack. */
	x = bpf_map_lookup_elem(&lk_dhcp_opts, ep_id);
	if (!x)
		return;
	n = x->len;
	if (n > LK_DHCP_EXTRA_MAX)
		return; /* the agent never writes one; nothing half */
	__builtin_memcpy(&o[DHCP_FIXED_OPTS], x->opts, LK_DHCP_EXTRA_MAX);
	o[DHCP_FIXED_OPTS + n] = DHCP_OPT_END;
}

static __always_inline int dhcp_drop(struct __sk_buff *skb, const struct endpoint_info *ep, __u32 reason,
				     int *verdict)
{
	*verdict = drop(skb, ep->id, reason);
	return 1;
}

/* dhcp_serve answers a VM endpoint's DHCP client message: it returns 1 with
 * the verdict in *verdict, or 0 for a packet that is none (the caller goes
 * on; the packet is untouched). A flag, not a reserved verdict: a helper's
 * return value could equal any reserved one, and the verifier would then
 * walk on with the packet pointers the rewrite invalidated. */
static __always_inline int dhcp_serve(struct __sk_buff *skb, struct pkt *p, const struct endpoint_info *ep,
				      int *verdict)
{
	struct iphdr *ip = p->ip4;
	struct udphdr *udp = (void *)(ip + 1);
	struct bootp_head *b = (void *)(udp + 1);
	struct dhcp_req req = {};
	struct dhcp_reply *r;
	__u32 end, reason, zero = 0;
	__be32 cookie;
	__u8 type;
	int bcast;
	__s64 sum;

	if (ip->protocol != IPPROTO_UDP || ip->ihl != 5 || (ip->frag_off & bpf_htons(LK_IP_MF | LK_IP_OFFSET)))
		return 0;
	if ((void *)(udp + 1) > p->data_end)
		return 0;
	if (udp->dest != bpf_htons(DHCP_SERVER_PORT) || udp->source != bpf_htons(DHCP_CLIENT_PORT))
		return 0;
	if (ip->daddr != 0xffffffff && ip->daddr != gateway_ip)
		return 0; /* for some other server: the normal path judges it */
	if (!ep->ip)
		return dhcp_drop(skb, ep, DROP_DHCP, verdict); /* an IPv6-only VM: no address to lease */
	if (!mac_equal(p->eth->h_source, ep->mac))
		return dhcp_drop(skb, ep, DROP_SPOOFED_MAC, verdict);
	if (ip->saddr != 0 && ip->saddr != ep->ip)
		return dhcp_drop(skb, ep, DROP_SPOOFED_IP, verdict);
	end = DHCP_HEAD_OFF - sizeof(struct udphdr) + bpf_ntohs(udp->len);
	if ((void *)(b + 1) > p->data_end || end < DHCP_OPTS_OFF || end > skb->len)
		return dhcp_drop(skb, ep, DROP_MALFORMED, verdict);
	if (b->op != 1 || b->htype != 1 || b->hlen != ETH_ALEN || b->giaddr)
		return dhcp_drop(skb, ep, DROP_MALFORMED, verdict);
	if (!mac_equal(b->chaddr, ep->mac))
		return dhcp_drop(skb, ep, DROP_SPOOFED_MAC, verdict);
	r = bpf_map_lookup_elem(&lk_dhcp_reply, &zero);
	if (!r)
		return dhcp_drop(skb, ep, DROP_MALFORMED, verdict);
	__builtin_memset(r, 0, sizeof(*r));
	__builtin_memcpy(&r->b, b, sizeof(r->b));
	if (bpf_skb_load_bytes(skb, DHCP_COOKIE_OFF, &cookie, 4) < 0 || cookie != bpf_htonl(DHCP_MAGIC))
		return dhcp_drop(skb, ep, DROP_MALFORMED, verdict);
	reason = dhcp_parse_opts(skb, DHCP_OPTS_OFF, end, &req);
	if (reason)
		return dhcp_drop(skb, ep, reason, verdict);

	if (req.type == DHCP_DISCOVER) {
		type = DHCP_OFFER;
	} else if (req.type == DHCP_REQUEST) {
		if (req.server && req.server != gateway_ip)
			return dhcp_drop(skb, ep, DROP_DHCP, verdict); /* the client chose another server */
		type = (req.requested ? req.requested : r->b.ciaddr) == ep->ip ? DHCP_ACK : DHCP_NAK;
	} else {
		return dhcp_drop(skb, ep, DROP_DHCP, verdict);
	}

	/* RFC 2131 4.1: a NAK is broadcast; a reply to a client that has an
	 * address goes to it; else broadcast only when the client asks. */
	bcast = type == DHCP_NAK || (!r->b.ciaddr && (r->b.flags & bpf_htons(DHCP_BROADCAST_FLAG)));
	if (bcast)
		__builtin_memset(r->dmac, 0xff, ETH_ALEN);
	else
		mac_copy(r->dmac, ep->mac);
	mac_copy(r->smac, ep->host_mac);
	r->proto = bpf_htons(ETH_P_IP);
	r->ip.ver_ihl = 0x45;
	r->ip.tot_len = bpf_htons(sizeof(*r) - sizeof(struct ethhdr));
	r->ip.ttl = 64;
	r->ip.protocol = IPPROTO_UDP;
	r->ip.saddr = gateway_ip;
	r->ip.daddr = bcast ? 0xffffffff : ep->ip;
	r->ip.check = ipv4_csum(&r->ip);
	r->udp.source = bpf_htons(DHCP_SERVER_PORT);
	r->udp.dest = bpf_htons(DHCP_CLIENT_PORT);
	r->udp.len = bpf_htons(sizeof(*r) - offsetof(struct dhcp_reply, udp));
	r->b.op = 2; /* BOOTREPLY */
	r->b.hops = 0;
	r->b.yiaddr = type == DHCP_NAK ? 0 : ep->ip;
	r->b.siaddr = 0;
	r->cookie = bpf_htonl(DHCP_MAGIC);
	dhcp_opts(r->opts, type, &ep->id);

	/* UDP checksum: the pseudo header (addresses, protocol, length), then
	 * the datagram */
	sum = bpf_csum_diff(0, 0, (void *)r + offsetof(struct dhcp_reply, ip.saddr), 8, 0);
	sum += bpf_htons(IPPROTO_UDP) + r->udp.len;
	sum = bpf_csum_diff(0, 0, (void *)r + offsetof(struct dhcp_reply, udp), sizeof(*r) - offsetof(struct dhcp_reply, udp),
			    sum);
	r->udp.check = csum_fold(sum);
	if (!r->udp.check)
		r->udp.check = 0xffff;

	if (bpf_skb_change_tail(skb, sizeof(*r), 0) < 0 || bpf_skb_store_bytes(skb, 0, r, sizeof(*r), 0) < 0)
		return dhcp_drop(skb, ep, DROP_MALFORMED, verdict);
	*verdict = to_endpoint(skb, ep);
	return 1;
}

#endif
