/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* frag.h: IPv4 and IPv6 fragment tracking for conntrack, load balancing and policy,
 * after Cilium's ipv4_handle_fragmentation (bpf/lib/ipv4.h).
 *
 * Only the first fragment of a datagram (offset 0, MF set) carries the L4
 * header. Its ports are remembered in lk_ipv4_frags per (source,
 * destination, protocol, IP ID) as the packet is at the hook that sees it;
 * a later fragment (offset > 0) of the same datagram, at the same hook,
 * takes them from there. So later fragments key the same conntrack entry,
 * get the same DNAT / rev-NAT (lb.h rewrites only their IP header: the L4
 * checksum lives in the first fragment) and are judged by policy on the same
 * port. Hooks that rewrite addresses (lb4) record before the rewrite and the
 * caller's policy records again after it, so each key is the tuple as that
 * lookup sees it.
 *
 * A later fragment whose first fragment was not seen is dropped
 * (DROP_FRAG_NOT_FOUND). That includes fragments arriving out of order (a
 * later fragment before the first): they are dropped, not buffered, as in
 * Cilium; the sender's retransmission (or the application's) recovers.
 * Entries are not removed after the last fragment (a duplicate fragment
 * would lose its ports): the LRU evicts them, and a reused IP ID overwrites. */
#ifndef LK_FRAG_H
#define LK_FRAG_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "ip6_ext.h"

#define LK_FRAG_ENTRIES 8192

#define LK_IP_MF 0x2000
#define LK_IP_OFFSET 0x1fff

struct frag4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag4_ports {
	__be16 sport;
	__be16 dport;
};

/* lk_ipv4_frags: the L4 ports of datagrams whose first fragment passed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_FRAG_ENTRIES);
	__type(key, struct frag4_key);
	__type(value, struct frag4_ports);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ipv4_frags SEC(".maps");

/* frag4_later is true for a fragment other than the first (no L4 header). */
static __always_inline int frag4_later(const struct iphdr *ip4)
{
	return (ip4->frag_off & bpf_htons(LK_IP_OFFSET)) != 0;
}

static __always_inline void frag4_key_of(const struct iphdr *ip4, struct frag4_key *k)
{
	k->saddr = ip4->saddr;
	k->daddr = ip4->daddr;
	k->id = ip4->id;
	k->proto = ip4->protocol;
	k->pad = 0;
}

/* frag_ports_in is the family-independent half of frag4_ports and
 * frag6_ports: a later fragment (no L4 header) takes the ports recorded
 * under key in map; any other packet reads them at l4off, and a first
 * fragment of several records them. Returns 0, -1 (truncated), -2 (a later
 * fragment whose first was not seen). */
static __always_inline int frag_ports_in(struct __sk_buff *skb, void *map, const void *key, int later,
					 int first_of_many, __u32 l4off, struct frag4_ports *ports)
{
	if (later) {
		struct frag4_ports *v = bpf_map_lookup_elem(map, key);

		if (!v)
			return -2;
		*ports = *v;
		return 0;
	}
	if (bpf_skb_load_bytes(skb, l4off, ports, sizeof(*ports)) < 0)
		return -1;
	if (first_of_many)
		bpf_map_update_elem(map, key, ports, BPF_ANY);
	return 0;
}

/* frag4_ports reads a TCP/UDP packet's ports. An unfragmented packet or a
 * first fragment has them at l4off (a first fragment's are remembered);
 * a later fragment gets its first fragment's. Returns 0, -1 when the L4
 * header is truncated, -2 for a later fragment whose first was not seen. */
static __always_inline int frag4_ports(struct __sk_buff *skb, const struct iphdr *ip4, __u32 l4off,
				       struct frag4_ports *ports)
{
	struct frag4_key k;

	frag4_key_of(ip4, &k);
	return frag_ports_in(skb, &lk_ipv4_frags, &k, frag4_later(ip4), !!(ip4->frag_off & bpf_htons(LK_IP_MF)),
			     l4off, ports);
}

/* IPv6: the same over the fragment header's identification (RFC 8200 4.5;
 * the chain walk, ip6_ext.h, reads it). The key is the datagram's
 * (source, destination, upper-layer protocol, identification). */
struct frag6_key {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be32 id;
	__u8 proto;
	__u8 pad[3];
};

/* lk_ipv6_frags: the L4 ports of IPv6 datagrams whose first fragment passed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_FRAG_ENTRIES);
	__type(key, struct frag6_key);
	__type(value, struct frag4_ports);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ipv6_frags SEC(".maps");

/* The key is built in per-CPU scratch: from_pod6's stack has no room for
 * 40 more bytes. Not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct frag6_key);
} lk_frag6_scratch SEC(".maps");

/* frag6_ports is frag4_ports for the IPv6 packet ip6 whose chain c has a
 * fragment header (c->frag) and a TCP or UDP upper layer. Not inlined: a
 * BPF-to-BPF call keeps its few bytes off from_pod6's frame, which sits
 * close to the 512-byte limit (with lk_vm_rx_queue below it). */
static __noinline int frag6_ports(struct __sk_buff *skb, const struct ipv6hdr *ip6,
				       const struct lk_ip6_chain *c, struct frag4_ports *ports)
{
	__u32 zero = 0;
	struct frag6_key *k = bpf_map_lookup_elem(&lk_frag6_scratch, &zero);

	if (!k)
		return -1;
	__builtin_memcpy(&k->saddr, &ip6->saddr, 16);
	__builtin_memcpy(&k->daddr, &ip6->daddr, 16);
	k->id = c->frag_id;
	k->proto = c->nh;
	k->pad[0] = k->pad[1] = k->pad[2] = 0;
	return frag_ports_in(skb, &lk_ipv6_frags, k, c->later, c->mf && !c->later, c->off, ports);
}

#endif
