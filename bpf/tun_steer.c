//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tun_steer.c: receive steering for a multiqueue tap (TUNSETSTEERINGEBPF).
 * The tap's transmit path (packets going to the guest) runs this socket
 * filter program to pick the queue: the Toeplitz hash of the packet
 * (lib/toeplitz.h) indexes the indirection table, exactly as a virtio-net
 * device with VIRTIO_NET_F_RSS would. The kernel takes the return value
 * modulo the number of attached queues.
 *
 * The three configuration maps have the layout of QEMU's tools/ebpf/rss.bpf.c
 * (config, key, 128-entry u16 table, BPF_F_MMAPABLE), so QEMU's loader or
 * lanekit's agent can write them. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/toeplitz.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Steering configuration (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct lk_rss_config));
	__uint(map_flags, BPF_F_MMAPABLE);
} lk_tap_rss_config SEC(".maps");

/* Toeplitz key, QEMU layout (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct lk_toeplitz_key));
	__uint(map_flags, BPF_F_MMAPABLE);
} lk_tap_rss_key SEC(".maps");

/* Indirection table: hash % indirections_len -> queue. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LK_RSS_TABLE_SIZE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u16));
	__uint(map_flags, BPF_F_MMAPABLE);
} lk_tap_rss_table SEC(".maps");

/* Packets by outcome, per CPU: LK_STEER_HASHED went through the table,
 * LK_STEER_DEFAULT got no hash (or redirect is off) and went to the default
 * queue. */
enum { LK_STEER_HASHED = 0, LK_STEER_DEFAULT = 1, LK_STEER_MAX = 2 };
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LK_STEER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} lk_tap_rss_stats SEC(".maps");

static __always_inline void count(__u32 what)
{
	__u64 *n = bpf_map_lookup_elem(&lk_tap_rss_stats, &what);

	if (n)
		*n += 1;
}

SEC("socket")
int tun_steer(struct __sk_buff *skb)
{
	struct lk_rss_input in = {};
	struct lk_rss_config *cfg;
	struct lk_toeplitz_key *key;
	__u32 zero = 0;
	__u32 idx;
	__u16 *queue;

	cfg = bpf_map_lookup_elem(&lk_tap_rss_config, &zero);
	key = bpf_map_lookup_elem(&lk_tap_rss_key, &zero);
	if (!cfg || !key)
		return 0;
	if (!cfg->redirect || cfg->indirections_len == 0 ||
	    cfg->indirections_len > LK_RSS_TABLE_SIZE)
		goto dflt;
	if (lk_rss_input_skb(skb, cfg->hash_types, &in))
		goto dflt;
	idx = lk_toeplitz(key, in.bytes, in.len) % cfg->indirections_len;
	queue = bpf_map_lookup_elem(&lk_tap_rss_table, &idx);
	if (!queue)
		goto dflt;
	count(LK_STEER_HASHED);
	return *queue;
dflt:
	count(LK_STEER_DEFAULT);
	return cfg->default_queue;
}
