/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ip6_ext.h: the one IPv6 extension-header walker. The RSS hash input
 * (toeplitz.h, skb and XDP) and the pod datapath (ipv6.h) both walk the
 * chain with it, so they cannot disagree on where L4 starts.
 *
 * Hop-by-hop, routing, destination-options and fragment headers are
 * walked, at most max of them (a constant after inlining: the loop is
 * bounded); AH, ESP, no-next-header and every upper-layer protocol end the
 * walk, and so does the fragment header of a later fragment (offset not 0):
 * the rest of that packet is payload, and nh is the fragment header's next
 * header (its datagram's, not read from the payload). The result says what
 * stopped it. */
#ifndef LK_IP6_EXT_H
#define LK_IP6_EXT_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* IPv6 fragment header: frag_off is the offset (high 13 bits) and M (bit 0). */
#define LK_IP6_FRAG_OFFSET 0xfff8
#define LK_IP6_FRAG_MF 0x0001

/* The IPv6 fragment header (the kernel's struct frag_hdr is not UAPI). */
struct lk_ip6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

/* How a walk ended (struct lk_ip6_chain.status). */
enum lk_ip6_chain_status {
	LK_IP6_CHAIN_OK = 0, /* nh is no walked extension header: off is where it starts */
	LK_IP6_CHAIN_TRUNCATED = 1, /* an extension header runs past the packet */
	LK_IP6_CHAIN_TOO_LONG = 2, /* more than max extension headers */
};

/* The walked chain of one packet. */
struct lk_ip6_chain {
	__u32 off; /* offset (from the frame start) of the header nh names */
	__u8 nh; /* the first header that is not a walked extension header */
	__u8 count; /* extension headers walked */
	__u8 frag; /* a fragment header was seen */
	__u8 later; /* ...and its offset is not 0: no L4 header in this packet */
	__u8 first_nh; /* the IPv6 header's next header (hop-by-hop: a router must look) */
	__u8 status; /* enum lk_ip6_chain_status */
	__u8 mf; /* ...and more fragments follow (M set) */
	__u8 jumbo; /* the hop-by-hop header is BIG TCP's jumbo marker (ipv6.h ip6_bigtcp) */
	__be32 frag_id; /* ...its identification (frag.h keys datagrams by it) */
};

static __always_inline int lk_ip6_is_ext(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT;
}

/* LK_IP6_WALK_FN defines lk_ip6_walk##SUFFIX for context type CTX, reading
 * packet bytes with LOAD(ctx, off, to, len) (0 on success): it walks the
 * chain after the fixed IPv6 header at l3 (frame offset) whose next header
 * is nh, at most max extension headers, and fills c. Returns c->status. */
#define LK_IP6_WALK_FN(SUFFIX, CTX, LOAD)						\
static __always_inline int lk_ip6_walk##SUFFIX(CTX *ctx, __u32 l3, __u8 nh, __u32 max,	\
					       struct lk_ip6_chain *c)		\
{											\
	__u32 i;									\
											\
	c->off = l3 + sizeof(struct ipv6hdr);						\
	c->nh = nh;									\
	c->first_nh = nh;								\
	c->count = 0;									\
	c->frag = 0;									\
	c->later = 0;									\
	c->mf = 0;									\
	c->jumbo = 0;									\
	c->frag_id = 0;									\
	c->status = LK_IP6_CHAIN_OK;							\
	for (i = 0; i < max; i++) {							\
		struct ipv6_opt_hdr ext;						\
											\
		if (!lk_ip6_is_ext(c->nh))						\
			return LK_IP6_CHAIN_OK;						\
		if (c->nh == IPPROTO_FRAGMENT) {					\
			struct lk_ip6_frag_hdr fh;						\
											\
			if (LOAD(ctx, c->off, &fh, sizeof(fh))) {			\
				c->status = LK_IP6_CHAIN_TRUNCATED;			\
				return c->status;					\
			}								\
			c->frag = 1;							\
			c->mf = !!(fh.frag_off & bpf_htons(LK_IP6_FRAG_MF));		\
			c->frag_id = fh.identification;					\
			c->off += sizeof(fh);						\
			c->nh = fh.nexthdr;						\
			c->count++;							\
			/* A later fragment: what follows is payload, not	\
			 * headers (walking on would let its bytes name	\
			 * another datagram or an L4 header). */		\
			if (fh.frag_off & bpf_htons(LK_IP6_FRAG_OFFSET)) {		\
				c->later = 1;						\
				return LK_IP6_CHAIN_OK;					\
			}								\
			continue;							\
		} else {								\
			if (LOAD(ctx, c->off, &ext, sizeof(ext))) {			\
				c->status = LK_IP6_CHAIN_TRUNCATED;			\
				return c->status;					\
			}								\
			c->off += (ext.hdrlen + 1) * 8;					\
			c->nh = ext.nexthdr;						\
		}									\
		c->count++;								\
	}										\
	if (lk_ip6_is_ext(c->nh))							\
		c->status = LK_IP6_CHAIN_TOO_LONG;					\
	return c->status;								\
}

#endif
