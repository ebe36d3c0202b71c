/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Toeplitz RSS hash as the virtio spec (5.1.6.4.3) and Microsoft's RSS
 * definition specify: a 40-byte secret key, the input bytes taken in packet
 * order (source address, destination address, source port, destination port,
 * all in network byte order), the result fed to an indirection table.
 *
 * The key and configuration structs have the layout of QEMU's
 * tools/ebpf/rss.bpf.c maps, so a map written by QEMU's loader
 * (ebpf_rss_set_all) drives lanekit's programs and the other way round:
 *   - config: struct lk_rss_config, packed, 10 bytes;
 *   - key: the first 4 key bytes as one host-order u32 (QEMU stores
 *     ntohl(first word)), then key bytes 4..39;
 *   - indirection table: 128 entries of u16 queue index.
 *
 * Every program that hashes (tun_steer.c, rss_hash.c) includes this file:
 * there is one implementation. */
#ifndef LK_TOEPLITZ_H
#define LK_TOEPLITZ_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/virtio_net.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ip6_ext.h"

#define LK_RSS_KEY_SIZE 40
/* The longest input: two IPv6 addresses and two ports. */
#define LK_RSS_INPUT_MAX 36
#define LK_RSS_TABLE_SIZE 128
/* IPv6 extension headers skipped before giving up on finding L4. */
#define LK_RSS_IP6_EXT_MAX 4

struct lk_rss_config {
	__u8 redirect; /* 0: every packet to default_queue */
	__u8 populate_hash; /* kept for layout; a tap has nowhere to put it */
	__u32 hash_types; /* VIRTIO_NET_RSS_HASH_TYPE_* bits */
	__u16 indirections_len; /* used entries of the table, 1..128 */
	__u16 default_queue; /* packets with no hash */
} __attribute__((packed));

struct lk_toeplitz_key {
	__u32 leftmost_32_bits; /* key bytes 0..3 as a big-endian number */
	__u8 next_byte[LK_RSS_INPUT_MAX]; /* key bytes 4..39 */
};

/* The hash input of one packet and the virtio hash report type it gets. */
struct lk_rss_input {
	__u8 bytes[LK_RSS_INPUT_MAX];
	__u32 len;
	__u32 report; /* VIRTIO_NET_HASH_REPORT_* */
};

/* lk_toeplitz hashes in[0..len) with key. For each input bit from the most
 * significant bit of in[0] on: if the bit is set, xor the current 32-bit key
 * window into the result; the window then slides one key bit to the right.
 *
 * w holds 64 key bits, key bytes i..i+7 while input byte i is hashed, so the
 * window of bit j (0 = most significant) of that byte is w >> (32 - j); after
 * the byte, w moves on by one key byte. One bounded loop over at most 36
 * bytes; the bit loop unrolls. */
static __always_inline __u32 lk_toeplitz(const struct lk_toeplitz_key *key,
					 const __u8 *in, __u32 len)
{
	__u64 w = ((__u64)key->leftmost_32_bits << 32) |
		  ((__u64)key->next_byte[0] << 24) | ((__u64)key->next_byte[1] << 16) |
		  ((__u64)key->next_byte[2] << 8) | (__u64)key->next_byte[3];
	__u32 result = 0;
	__u32 i;

	for (i = 0; i < LK_RSS_INPUT_MAX; i++) {
		__u64 next = 0;
		__u8 b;
		int bit;

		if (i >= len)
			break;
		b = in[i];
		for (bit = 0; bit < 8; bit++) {
			if (b & (0x80 >> bit))
				result ^= (__u32)(w >> (32 - bit));
		}
		/* key byte i + 8 is next_byte[i + 4]; the key has 40 bytes */
		if (i + 4 < LK_RSS_INPUT_MAX)
			next = key->next_byte[i + 4];
		w = (w << 8) | next;
	}
	return result;
}

static __always_inline int lk_load(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	return bpf_skb_load_bytes_relative(skb, off, to, len, BPF_HDR_START_MAC);
}

/* lk_load_xdp reads from an XDP frame (offsets from the Ethernet header). */
static __always_inline int lk_load_xdp(struct xdp_md *ctx, __u32 off, void *to, __u32 len)
{
	return bpf_xdp_load_bytes(ctx, off, to, len);
}

/* LK_RSS_INPUT_FNS defines SUFFIX's hash input builder for context type CTX,
 * reading packet bytes with LOAD: lk_rss_l4##SUFFIX and lk_rss_input##SUFFIX.
 * One body for socket filters/tc (skb) and XDP, so that the two cannot hash
 * the same packet differently. */
#define LK_RSS_INPUT_FNS(SUFFIX, CTX, LOAD)								\
/* lk_rss_l4 appends the two ports at l4off to in (after the address bytes)	\
 * when the packet is TCP/UDP of an enabled type. Returns 1 when it did. */	\
static __always_inline int lk_rss_l4##SUFFIX(CTX *ctx, struct lk_rss_input *in,	\
					     __u32 types, __u8 proto, __u32 l4off, int v6)	\
{										\
	__u32 tcp = v6 ? VIRTIO_NET_RSS_HASH_TYPE_TCPv6 : VIRTIO_NET_RSS_HASH_TYPE_TCPv4;	\
	__u32 udp = v6 ? VIRTIO_NET_RSS_HASH_TYPE_UDPv6 : VIRTIO_NET_RSS_HASH_TYPE_UDPv4;	\
	__u32 off = v6 ? 32 : 8;						\
										\
	if (proto == IPPROTO_TCP && (types & tcp)) {				\
		in->report = v6 ? VIRTIO_NET_HASH_REPORT_TCPv6 : VIRTIO_NET_HASH_REPORT_TCPv4;	\
	} else if (proto == IPPROTO_UDP && (types & udp)) {			\
		in->report = v6 ? VIRTIO_NET_HASH_REPORT_UDPv6 : VIRTIO_NET_HASH_REPORT_UDPv4;	\
	} else {								\
		return 0;							\
	}									\
	/* source port, destination port: the first 4 bytes of both headers */	\
	if (v6) {								\
		if (LOAD(ctx, l4off, &in->bytes[32], 4))			\
			return 0;						\
	} else {								\
		if (LOAD(ctx, l4off, &in->bytes[8], 4))				\
			return 0;						\
	}									\
	in->len = off + 4;							\
	return 1;								\
}										\
										\
/* lk_rss_input builds the hash input of the frame in ctx (Ethernet first,	\
 * one optional 802.1Q tag) for the enabled hash types, in the virtio order	\
 * of preference: TCP, then UDP, then the address-only type (virtio 1.3	\
 * 5.1.6.4.3; lanekit offers no _EX type, so IPv6 extension headers are	\
 * skipped, as the spec says for that case). The rules, which pkg/rss's	\
 * FrameInput models in Go:							\
 * - the L4 type applies when the TCP/UDP header's ports are in the frame	\
 *   and the packet is not a fragment: IPv4 MF or offset set, or an IPv6	\
 *   fragment header (first fragment included, so a datagram's fragments	\
 *   share a queue);							\
 * - IPv6 hop-by-hop, routing, destination-options and fragment headers are	\
 *   walked, at most LK_RSS_IP6_EXT_MAX of them; a longer chain, a truncated	\
 *   extension header, AH/ESP and any other payload (ICMPv6, no next header)	\
 *   leave L4 unknown: the address type applies;				\
 * - the address type applies to every IP header that is whole (IPv4: 20	\
 *   bytes, version 4, IHL >= 5; IPv6: 40 bytes, version 6).		\
 * Returns 0 with in filled, or -1 when the packet gets no hash (not IP, a	\
 * broken IP header, or no enabled type applies). */			\
static __always_inline int lk_rss_input##SUFFIX(CTX *ctx, __u32 types,		\
						struct lk_rss_input *in)	\
{										\
	__u32 l3 = ETH_HLEN;							\
	__be16 proto;								\
										\
	if (LOAD(ctx, 12, &proto, sizeof(proto)))				\
		return -1;							\
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {	\
		if (LOAD(ctx, 16, &proto, sizeof(proto)))			\
			return -1;						\
		l3 += 4;							\
	}									\
										\
	if (proto == bpf_htons(ETH_P_IP)) {					\
		struct iphdr ip;						\
		int frag;							\
										\
		if (LOAD(ctx, l3, &ip, sizeof(ip)))				\
			return -1;						\
		if (ip.version != 4 || ip.ihl < 5)				\
			return -1;						\
		if (LOAD(ctx, l3 + 12, &in->bytes[0], 8)) /* saddr, daddr */	\
			return -1;						\
		frag = ip.frag_off & bpf_htons(0x3fff); /* MF or an offset */	\
		if (!frag && lk_rss_l4##SUFFIX(ctx, in, types, ip.protocol, l3 + ip.ihl * 4, 0))	\
			return 0;						\
		if (!(types & VIRTIO_NET_RSS_HASH_TYPE_IPv4))			\
			return -1;						\
		in->len = 8;							\
		in->report = VIRTIO_NET_HASH_REPORT_IPv4;			\
		return 0;							\
	}									\
										\
	if (proto == bpf_htons(ETH_P_IPV6)) {					\
		struct ipv6hdr ip6;						\
		struct lk_ip6_chain c;						\
		__u32 off;							\
		__u8 nh;							\
		int frag;							\
										\
		if (LOAD(ctx, l3, &ip6, sizeof(ip6)))				\
			return -1;						\
		if (ip6.version != 6)						\
			return -1;						\
		if (LOAD(ctx, l3 + 8, &in->bytes[0], 32)) /* saddr, daddr */	\
			return -1;						\
		/* ip6_ext.h; a truncated or longer chain: addresses only */	\
		lk_ip6_walk##SUFFIX(ctx, l3, ip6.nexthdr, LK_RSS_IP6_EXT_MAX, &c);	\
		nh = c.status == LK_IP6_CHAIN_OK ? c.nh : IPPROTO_NONE;		\
		off = c.off;							\
		frag = c.frag;							\
		if (!frag && lk_rss_l4##SUFFIX(ctx, in, types, nh, off, 1))	\
			return 0;						\
		if (!(types & VIRTIO_NET_RSS_HASH_TYPE_IPv6))			\
			return -1;						\
		in->len = 32;							\
		in->report = VIRTIO_NET_HASH_REPORT_IPv6;			\
		return 0;							\
	}									\
	return -1;								\
}

LK_IP6_WALK_FN(_skb, struct __sk_buff, lk_load)
LK_IP6_WALK_FN(_xdp, struct xdp_md, lk_load_xdp)
LK_RSS_INPUT_FNS(_skb, struct __sk_buff, lk_load)
LK_RSS_INPUT_FNS(_xdp, struct xdp_md, lk_load_xdp)

#endif /* LK_TOEPLITZ_H */
