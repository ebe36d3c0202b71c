/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ct.h: IPv4 connection tracking (TCP, UDP, SCTP, ICMP echo), shared by service
 * load balancing (lb.h) and network policy (policy.h).
 *
 * API (stable; owned by lb):
 *
 *   struct ct_key   { saddr, daddr, sport, dport, proto, flags, pad }  16 bytes
 *       A flow in its ORIGINAL direction (the direction of the packet that
 *       created the entry). Addresses/ports in network byte order. ICMP echo
 *       request/reply: sport = dport = the echo identifier (so a reply's key,
 *       reversed, equals the request's). flags: CT_KEY_SERVICE marks the
 *       LB's pre-DNAT "service" entries (client -> VIP:port); every other
 *       entry (flags 0) is a plain flow entry on the tuple as it is on the
 *       wire after any NAT this node did.
 *
 *   int ct_tuple4(skb, ip4, &key, &tcp_flags)
 *       Fills key (flags 0) and the TCP flags byte from the packet. TCP,
 *       UDP and SCTP (ct_has_ports: the ports lead all three headers; SCTP is
 *       tracked for policy only, lb.h serves TCP and UDP) and their
 *       fragments are tracked (frag.h): a later fragment gets its first
 *       fragment's ports (and no TCP flags). Returns 0, -2 for a later
 *       fragment whose first fragment was not seen (the caller drops it:
 *       DROP_FRAG_NOT_FOUND), or -1 when the packet is not trackable (other
 *       protocol, ICMP other than echo or fragmented, truncated): the caller
 *       decides (policy: judge statelessly; LB: leave it alone).
 *
 *   int ct_lookup4(&key, tcp_flags, &entry)
 *       Looks the key up as-is (CT_ESTABLISHED: the packet goes the original
 *       way) and reversed (CT_REPLY: the packet is a reply; not for
 *       CT_KEY_SERVICE keys). Returns CT_NEW
 *       when neither exists or the entry has timed out. On a hit, *entry
 *       points at the map value (fields may be changed in place, e.g. flags),
 *       last_seen is refreshed (at most once a second) and the TCP state
 *       advanced (SYN/FIN/RST, reply seen).
 *
 *   int ct_create4(&key, &init)
 *       Inserts (or replaces an expired / same-key) entry with init's
 *       fields, last_seen = now. Returns 0, or -1 when the map refused (then
 *       counted in lk_ct_count[CT_COUNT_FAILED]). lk_ct4 is an LRU: a full
 *       table evicts its least recently used flow instead of failing; each
 *       creation beyond capacity is counted in lk_ct_count[CT_COUNT_EVICTED]
 *       (never silent: datapath.ServiceStats reports it).
 *
 *   int ct_create4_unique(&key, &init)
 *       As ct_create4 but fails (-1, not counted) when a live entry with the
 *       key exists: for SNAT port allocation.
 *
 *   void ct_delete4(&key)
 *
 * IPv6 (lk_ct6, struct ct6_key: the same fields with 16-byte addresses;
 * counters in lk_ct6_count): ct_tuple6(skb, ip6, &chain, &key, &tcp_flags)
 * after the extension-header walk, ct_lookup6, ct_create6. One entry
 * layout, one state machine (ct_advance) and one insert (ct_create_in) for
 * both families; only the tuple and the tables differ. The agent's GC walks
 * both tables.
 *
 * Entry flags (struct ct_entry.flags, enum lk_ct_flags): CT_F_SEEN_REPLY
 * (a reply passed: "established" for policy), CT_F_CLOSING (FIN or RST seen),
 * CT_F_REVNAT (replies get their source rewritten to lk_lb_revnat[rev_nat_id]),
 * CT_F_SNAT (this node rewrote the source: replies get their destination
 * restored to nat_addr:nat_port), CT_F_HAIRPIN, CT_F_NODEPORT (LB detail),
 * CT_F_POLICY (created by the policy path: an allowed connection; policy may
 * also set it on an LB-created flow entry). Bits 12-15 are free for policy.
 *
 * Timeouts (enum lk_ct_timeout, seconds; mirrored in Go by bpf2go): TCP
 * before a reply CT_TIMEOUT_TCP_SYN, established CT_TIMEOUT_TCP, after
 * FIN/RST CT_TIMEOUT_TCP_CLOSE; UDP and ICMP CT_TIMEOUT_NONTCP. An expired
 * entry is treated as absent by the datapath and removed by the agent's GC
 * (datapath.Loader.GCConntrack), which uses the same rules.
 *
 * last_seen is ct_now(): CLOCK_MONOTONIC, read coarse (below). */
#ifndef LK_CT_H
#define LK_CT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "frag.h"
#include "ip6_ext.h"

#define LK_CT_ENTRIES 262144 /* default lk_ct4 size; the loader may change it */

/* ct_has_ports: protocols whose header starts with the source and
 * destination ports (TCP, UDP, SCTP), keyed and judged by them. */
static __always_inline int ct_has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* Lookup results. */
enum lk_ct_result {
	CT_NEW = 0,
	CT_ESTABLISHED = 1,
	CT_REPLY = 2,
};

/* struct ct_key.flags */
enum lk_ct_key_flags {
	CT_KEY_SERVICE = 1, /* LB pre-DNAT entry: client -> frontend */
	CT_KEY_MASQ = 2, /* masquerade pre-SNAT entry: endpoint -> outside (masq.h) */
};

/* struct ct_entry.flags */
enum lk_ct_flags {
	CT_F_SEEN_REPLY = 1 << 0,
	CT_F_CLOSING = 1 << 1,
	CT_F_REVNAT = 1 << 2,
	CT_F_SNAT = 1 << 3,
	CT_F_HAIRPIN = 1 << 4,
	CT_F_NODEPORT = 1 << 5,
	CT_F_POLICY = 1 << 6,
	CT_F_MASQ = 1 << 7, /* a masquerade's entry (masq.h): its reply may be a service flow's too */
};

/* Timeouts in seconds. */
enum lk_ct_timeout {
	CT_TIMEOUT_TCP = 21600,
	CT_TIMEOUT_TCP_SYN = 60,
	CT_TIMEOUT_TCP_CLOSE = 10,
	CT_TIMEOUT_NONTCP = 60,
};

/* lk_ct_count slots. */
enum lk_ct_counter {
	CT_COUNT_CREATED = 0, /* entries created by the datapath (atomic) */
	CT_COUNT_EVICTED = 1, /* creations while the table was full: an LRU eviction each */
	CT_COUNT_GC_REMOVED = 2, /* written by the agent's GC only (re-bases the live count) */
	CT_COUNT_FAILED = 3, /* creations the map refused */
	CT_COUNT_MAX = 4,
};


struct ct_entry {
	__u64 last_seen; /* ct_now() */
	__u32 backend_id; /* LB service entries: the chosen backend */
	__u32 rev_nat_id; /* CT_F_REVNAT: lk_lb_revnat key (the frontend id) */
	__be32 nat_addr; /* CT_F_SNAT flow entries: the original source; service entries: the SNAT source used */
	__be16 nat_port;
	__u16 flags; /* enum lk_ct_flags */
	__u8 tcp_flags_fwd; /* TCP flags seen in the original direction (OR) */
	__u8 tcp_flags_rev; /* ... in the reply direction */
	__u8 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_CT_ENTRIES);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ct4 SEC(".maps");

/* Creation/eviction counters (enum lk_ct_counter), shared by all CPUs: touched
 * once per new flow, never per packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CT_COUNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ct_count SEC(".maps");

/* Load-time setting: lk_ct4's max_entries (the loader sets both). */
const volatile __u32 ct_max_entries = LK_CT_ENTRIES;

/* IPv6: the same tracking over struct ct6_key in lk_ct6 (its counters in
 * lk_ct6_count, same slots), through the family-independent ct_advance and
 * ct_create_in. Policy uses it; the IPv6 tuple is taken after the
 * extension-header walk (ip6_ext.h). */
#define LK_CT6_ENTRIES 65536 /* lk_ct6's size */

/* A flow in its original direction, as struct ct_key. 40 bytes. */
struct ct6_key {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 flags; /* enum lk_ct_key_flags */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_CT6_ENTRIES);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ct6 SEC(".maps");

/* lk_ct6's creation/eviction counters (enum lk_ct_counter). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CT_COUNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ct6_count SEC(".maps");

/* lk_ct6's max_entries (fixed: the loader sizes only lk_ct4). */
const volatile __u32 ct6_max_entries = LK_CT6_ENTRIES;


/* Keep the enums in BTF for bpf2go -type. */
const enum lk_ct_result *lk_unused_ct_result __attribute__((unused));
const enum lk_ct_key_flags *lk_unused_ct_key_flags __attribute__((unused));
const enum lk_ct_flags *lk_unused_ct_flags __attribute__((unused));
const enum lk_ct_timeout *lk_unused_ct_timeout __attribute__((unused));
const enum lk_ct_counter *lk_unused_ct_counter __attribute__((unused));

/* From linux/icmp.h, which drags in libc headers. */
#define LK_ICMP_ECHOREPLY 0
#define LK_ICMP_DEST_UNREACH 3
#define LK_ICMP_PORT_UNREACH 3
#define LK_ICMP_ECHO 8

#define CT_TCP_FIN 0x01
#define CT_TCP_SYN 0x02
#define CT_TCP_RST 0x04
#define CT_TCP_ACK 0x10
#define CT_REFRESH_NS 1000000000ULL

/* ct_now is the conntrack's clock: CLOCK_MONOTONIC as of the last tick
 * (bpf_ktime_get_coarse_ns, at most a tick behind; the timeouts are seconds
 * and the agent's GC reads CLOCK_MONOTONIC). bpf_ktime_get_ns reads the
 * clocksource on every call: one or two per packet, a measurable share of
 * a program's run under a hypervisor's pvclock (what Cilium's jiffies-based
 * bpf_mono_now avoids too). An entry stamped by the precise clock (the agent
 * writes some) may read as a little in the future: ct_expired says not
 * expired, and the refresh below rewrites it once. */
static __always_inline __u64 ct_now(void)
{
	return bpf_ktime_get_coarse_ns();
}

static __always_inline int ct_tuple4(struct __sk_buff *skb, const struct iphdr *ip4, struct ct_key *key,
				     __u8 *tcp_flags)
{
	__u32 l4off = ETH_HLEN + ip4->ihl * 4;

	key->saddr = ip4->saddr;
	key->daddr = ip4->daddr;
	key->proto = ip4->protocol;
	key->flags = 0;
	key->pad = 0;
	*tcp_flags = 0;
	if (ct_has_ports(ip4->protocol)) {
		struct frag4_ports ports;
		int err = frag4_ports(skb, ip4, l4off, &ports);

		if (err < 0)
			return err;
		key->sport = ports.sport;
		key->dport = ports.dport;
		if (ip4->protocol == IPPROTO_TCP && !frag4_later(ip4) &&
		    bpf_skb_load_bytes(skb, l4off + 13, tcp_flags, 1) < 0)
			return -1;
		return 0;
	}
	if (ip4->frag_off & bpf_htons(0x3fff)) /* MF or an offset: no (reliable) ports */
		return -1;
	switch (ip4->protocol) {
	case IPPROTO_ICMP: {
		__u8 b[6];

		if (bpf_skb_load_bytes(skb, l4off, b, sizeof(b)) < 0)
			return -1;
		if (b[0] != LK_ICMP_ECHO && b[0] != LK_ICMP_ECHOREPLY)
			return -1;
		__builtin_memcpy(&key->sport, &b[4], 2);
		key->dport = key->sport;
		return 0;
	}
	}
	return -1;
}

static __always_inline void ct_key_reverse(const struct ct_key *k, struct ct_key *r)
{
	r->saddr = k->daddr;
	r->daddr = k->saddr;
	r->sport = k->dport;
	r->dport = k->sport;
	r->proto = k->proto;
	r->flags = k->flags;
	r->pad = 0;
}

static __always_inline __u64 ct_timeout_ns(const struct ct_entry *e, __u8 proto)
{
	__u64 s = CT_TIMEOUT_NONTCP;

	if (proto == IPPROTO_TCP) {
		if (e->flags & CT_F_CLOSING)
			s = CT_TIMEOUT_TCP_CLOSE;
		else if (e->flags & CT_F_SEEN_REPLY)
			s = CT_TIMEOUT_TCP;
		else
			s = CT_TIMEOUT_TCP_SYN;
	}
	return s * 1000000000ULL;
}

static __always_inline int ct_expired(const struct ct_entry *e, __u8 proto, __u64 now)
{
	return now > e->last_seen && now - e->last_seen > ct_timeout_ns(e, proto);
}

/* ct_advance is the family-independent half of a lookup: e is the entry the
 * key (res CT_ESTABLISHED) or its reverse (CT_REPLY) found. */
static __always_inline int ct_advance(struct ct_entry *e, int res, __u8 proto, __u8 tcp_flags,
				      struct ct_entry **out)
{
	__u64 now = ct_now();
	__u16 flags;

	if (ct_expired(e, proto, now))
		return CT_NEW;
	flags = e->flags;
	/* Written only when they change: both directions' packets meet in
	 * this entry, often on two CPUs, and a store on every packet would
	 * move its cache line between them each time. */
	if (res == CT_REPLY) {
		flags |= CT_F_SEEN_REPLY;
		if ((e->tcp_flags_rev | tcp_flags) != e->tcp_flags_rev)
			e->tcp_flags_rev |= tcp_flags;
	} else {
		/* A fresh SYN on a closed flow's tuple (port reuse): a new
		 * connection, its reply not seen yet. */
		if ((tcp_flags & (CT_TCP_SYN | CT_TCP_ACK)) == CT_TCP_SYN && (flags & CT_F_CLOSING))
			flags &= ~(CT_F_CLOSING | CT_F_SEEN_REPLY);
		if ((e->tcp_flags_fwd | tcp_flags) != e->tcp_flags_fwd)
			e->tcp_flags_fwd |= tcp_flags;
	}
	if (tcp_flags & (CT_TCP_FIN | CT_TCP_RST))
		flags |= CT_F_CLOSING;
	if (flags != e->flags || now - e->last_seen > CT_REFRESH_NS) {
		e->flags = flags;
		e->last_seen = now;
	}
	*out = e;
	return res;
}

static __always_inline int ct_lookup4(const struct ct_key *key, __u8 tcp_flags, struct ct_entry **out)
{
	struct ct_entry *e = bpf_map_lookup_elem(&lk_ct4, key);
	int res = CT_ESTABLISHED;

	if (!e) {
		struct ct_key rev;

		if (key->flags & (CT_KEY_SERVICE | CT_KEY_MASQ))
			return CT_NEW; /* service and masquerade entries have no reply direction */
		ct_key_reverse(key, &rev);
		e = bpf_map_lookup_elem(&lk_ct4, &rev);
		if (!e)
			return CT_NEW;
		res = CT_REPLY;
	}
	return ct_advance(e, res, key->proto, tcp_flags, out);
}

/* The tables of a family: lk_ct4 / lk_ct_count / ct_max_entries, or (v6)
 * lk_ct6 / lk_ct6_count / ct6_max_entries. Callers pass a constant v6:
 * each call site keeps its family's maps only. */
#define CT_MAP(v6) ((v6) ? (void *)&lk_ct6 : (void *)&lk_ct4)
#define CT_KEY_PROTO(v6, key) \
	((v6) ? ((const struct ct6_key *)(key))->proto : ((const struct ct_key *)(key))->proto)
#define CT_COUNT_MAP(v6) ((v6) ? (void *)&lk_ct6_count : (void *)&lk_ct_count)

static __always_inline void ct_count_in(__u8 v6, __u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(CT_COUNT_MAP(v6), &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* ct_note_created counts a new entry of the family's table and, when the
 * live count (created - evicted - removed by GC) has reached its capacity,
 * the eviction the LRU made room with. */
static __always_inline void ct_note_created(__u8 v6)
{
	__u32 k0 = CT_COUNT_CREATED, k1 = CT_COUNT_EVICTED, k2 = CT_COUNT_GC_REMOVED;
	__u64 *created = bpf_map_lookup_elem(CT_COUNT_MAP(v6), &k0);
	__u64 *evicted = bpf_map_lookup_elem(CT_COUNT_MAP(v6), &k1);
	__u64 *removed = bpf_map_lookup_elem(CT_COUNT_MAP(v6), &k2);
	__u64 c;

	if (!created || !evicted || !removed)
		return;
	c = __sync_fetch_and_add(created, 1);
	if (c >= *evicted + *removed + (v6 ? ct6_max_entries : ct_max_entries))
		__sync_fetch_and_add(evicted, 1);
}

/* ct_create_in inserts key (a struct ct_key, or a ct6_key when v6) into
 * the family's table: the family-independent body of ct_create4 /
 * ct_create6. */
static __always_inline int ct_create_in(__u8 v6, const void *key, const struct ct_entry *init, __u64 mode)
{
	struct ct_entry e = *init;
	struct ct_entry *old;

	e.last_seen = ct_now();
	if (!bpf_map_update_elem(CT_MAP(v6), key, &e, BPF_NOEXIST)) {
		ct_note_created(v6);
		return 0;
	}
	/* The key exists (or the map refused): replace an entry that is
	 * expired, or any entry when the caller allows it. */
	old = bpf_map_lookup_elem(CT_MAP(v6), key);
	if (old && (mode == BPF_ANY || ct_expired(old, CT_KEY_PROTO(v6, key), e.last_seen))) {
		if (!bpf_map_update_elem(CT_MAP(v6), key, &e, BPF_EXIST))
			return 0;
	}
	if (old && mode != BPF_ANY)
		return -1; /* in use: not a failure of the table */
	ct_count_in(v6, CT_COUNT_FAILED);
	return -1;
}

static __always_inline int ct_create4_flags(const struct ct_key *key, const struct ct_entry *init, __u64 mode)
{
	return ct_create_in(0, key, init, mode);
}

static __always_inline int ct_create4(const struct ct_key *key, const struct ct_entry *init)
{
	return ct_create4_flags(key, init, BPF_ANY);
}

static __always_inline int ct_create4_unique(const struct ct_key *key, const struct ct_entry *init)
{
	return ct_create4_flags(key, init, BPF_NOEXIST);
}

static __always_inline void ct_delete4(const struct ct_key *key)
{
	bpf_map_delete_elem(&lk_ct4, key);
}

#define LK_ICMP6_ECHO_REQUEST 128
#define LK_ICMP6_ECHO_REPLY 129

/* ct_tuple6 is ct_tuple4 for the IPv6 packet ip6 whose extension-header
 * chain is c: TCP, UDP and ICMPv6 echo. TCP and UDP fragments are tracked
 * as IPv4's (frag.h, frag6_ports): a later fragment gets its first
 * fragment's ports, -2 when that was not seen. Other fragmented packets are
 * not trackable (-1). */
static __always_inline int ct_tuple6(struct __sk_buff *skb, const struct ipv6hdr *ip6,
				     const struct lk_ip6_chain *c, struct ct6_key *key, __u8 *tcp_flags)
{
	__builtin_memcpy(&key->saddr, &ip6->saddr, 16);
	__builtin_memcpy(&key->daddr, &ip6->daddr, 16);
	key->proto = c->nh;
	key->flags = 0;
	key->pad = 0;
	*tcp_flags = 0;
	if (ct_has_ports(c->nh)) {
		struct frag4_ports ports;
		int err = c->frag ? frag6_ports(skb, ip6, c, &ports)
				  : (bpf_skb_load_bytes(skb, c->off, &ports, sizeof(ports)) < 0 ? -1 : 0);

		if (err < 0)
			return err;
		key->sport = ports.sport;
		key->dport = ports.dport;
		if (c->nh == IPPROTO_TCP && !c->later && bpf_skb_load_bytes(skb, c->off + 13, tcp_flags, 1) < 0)
			return -1;
		return 0;
	}
	if (c->frag)
		return -1;
	if (c->nh == IPPROTO_ICMPV6) {
		__u8 b[6];

		if (bpf_skb_load_bytes(skb, c->off, b, sizeof(b)) < 0)
			return -1;
		if (b[0] != LK_ICMP6_ECHO_REQUEST && b[0] != LK_ICMP6_ECHO_REPLY)
			return -1;
		__builtin_memcpy(&key->sport, &b[4], 2);
		key->dport = key->sport;
		return 0;
	}
	return -1;
}

/* ct6_key_swap turns k around in place (its reverse direction): IPv6 keys
 * are 40 bytes, and from_pod6's stack has no room for a second one. */
static __always_inline void ct6_key_swap(struct ct6_key *k)
{
	__u64 *a = (__u64 *)&k->saddr, *b = (__u64 *)&k->daddr, t;
	__be16 p = k->sport;

	t = a[0]; a[0] = b[0]; b[0] = t;
	t = a[1]; a[1] = b[1]; b[1] = t;
	k->sport = k->dport;
	k->dport = p;
}

/* ct_lookup6 is ct_lookup4 for IPv6. key is turned around for the reply
 * lookup and back before it returns. */
static __always_inline int ct_lookup6(struct ct6_key *key, __u8 tcp_flags, struct ct_entry **out)
{
	struct ct_entry *e = bpf_map_lookup_elem(&lk_ct6, key);
	int res = CT_ESTABLISHED;

	if (!e) {
		if (key->flags & CT_KEY_SERVICE)
			return CT_NEW;
		ct6_key_swap(key);
		e = bpf_map_lookup_elem(&lk_ct6, key);
		ct6_key_swap(key);
		if (!e)
			return CT_NEW;
		res = CT_REPLY;
	}
	return ct_advance(e, res, key->proto, tcp_flags, out);
}

static __always_inline int ct_create6(const struct ct6_key *key, const struct ct_entry *init)
{
	return ct_create_in(1, key, init, BPF_ANY);
}

#endif
