/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* vm_rss.h: a VM's virtio RSS configuration, as its guest set it
 * (VIRTIO_NET_CTRL_MQ_RSS_CONFIG / HASH_CONFIG), and the two places that use
 * it:
 *   - the tc programs delivering to the VM (lib/fib.h deliver_local) pick the
 *     rx queue of the VM's device, so the frame reaches the AF_XDP socket of
 *     the guest queue the guest's indirection table names (a socket only
 *     takes frames of the rx queue it is bound to, so the choice must be made
 *     before the device's transmit, not in the XDP program behind it);
 *   - steer_vm (vm.c) computes the same Toeplitz hash and puts it with its
 *     type in front of the frame as XDP metadata (struct lk_xsk_meta) for the
 *     backend's virtio_net_hdr_v1_hash.
 *
 * Each VM has its own one-entry array (BPF_F_MMAPABLE) in lk_rss_vms, keyed by
 * endpoint id. The agent hands that inner map's fd to the VM's unprivileged
 * vhost-user backend with the AF_XDP sockets; the backend writes its guest's
 * configuration through an mmap of it and can reach no other VM's. */
#ifndef LK_VM_RSS_H
#define LK_VM_RSS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "consts.h"
#include "toeplitz.h"

/* Mirrored by vhost/src/rss.rs (RssMap) and pkg/datapath (VMRSS): keep the
 * three in step. 312 bytes, every field naturally aligned. */
struct lk_vm_rss_cfg {
	__u32 hash_types; /* VIRTIO_NET_RSS_HASH_TYPE_*; 0: no guest config (flow-hash queue, no hash) */
	__u16 steer; /* 1: RSS_CONFIG (queue from the table), 0: HASH_CONFIG (hash only) */
	__u16 table_mask; /* indirection table entries - 1 (power of two - 1, < 128) */
	__u16 unclassified_queue; /* queue of packets with no hash */
	__u16 pad;
	__u32 seq; /* odd while the backend rewrites the entry (readers keep the flow hash) */
	struct lk_toeplitz_key key; /* QEMU layout, see toeplitz.h */
	__u16 table[LK_RSS_TABLE_SIZE];
};

struct lk_vm_rss_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	/* sizes, not BTF types: clang 14 emits only a forward declaration of a
	 * struct reached through the inner map's pointer */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct lk_vm_rss_cfg));
};

/* endpoint id -> the VM's configuration map. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lk_vm_rss_inner);
} lk_rss_vms SEC(".maps");

/* XDP metadata steer_vm puts in front of each frame it hands to a socket.
 * Mirrored by vhost/src/rss.rs (XskMeta). */
struct lk_xsk_meta {
	__u32 hash; /* Toeplitz hash (valid when report != 0) */
	__u16 report; /* VIRTIO_NET_HASH_REPORT_* */
	__u16 magic; /* LK_XSK_META_MAGIC: written by steer_vm */
};
#define LK_XSK_META_MAGIC 0x4c4b

/* lk_vm_rss_get returns VM ep_id's configuration when its guest set one. */
static __always_inline struct lk_vm_rss_cfg *lk_vm_rss_get(__u32 ep_id)
{
	struct lk_vm_rss_cfg *cfg;
	void *inner;
	__u32 zero = 0;

	inner = bpf_map_lookup_elem(&lk_rss_vms, &ep_id);
	if (!inner)
		return 0;
	cfg = bpf_map_lookup_elem(inner, &zero);
	if (!cfg || !cfg->hash_types || (cfg->seq & 1))
		return 0;
	return cfg;
}

/* lk_vm_rss_pick maps a hash (got = 0: the packet has none) to a queue of a
 * VM with queues queue pairs: the guest's table, or its unclassified queue.
 * Returns -1 when the configuration does not steer (HASH_CONFIG) or names a
 * queue the VM does not have. */
static __always_inline int lk_vm_rss_pick(const struct lk_vm_rss_cfg *cfg, int got, __u32 hash, __u32 queues)
{
	__u32 idx, q;

	if (!cfg->steer)
		return -1;
	if (got) {
		idx = hash & cfg->table_mask & (LK_RSS_TABLE_SIZE - 1);
		q = cfg->table[idx];
	} else {
		q = cfg->unclassified_queue;
	}
	if (q >= queues)
		return -1;
	return q;
}

/* lk_vm_rx_queue is the rx queue of VM ep_id's device (queues of them) that
 * skb must arrive on: the one its guest's RSS table picks for the packet's
 * Toeplitz hash, or, without a steering guest configuration, the one the
 * kernel's flow hash picks (the default: one flow, one queue). A global
 * function: verified once, not once per caller. */
__attribute__((noinline)) int lk_vm_rx_queue(struct __sk_buff *skb, __u32 ep_id, __u32 queues)
{
	struct lk_rss_input in = {};
	struct lk_vm_rss_cfg *cfg;
	__u32 hash = 0;
	int got, q;

	if (!skb || !queues)
		return 0;
	cfg = lk_vm_rss_get(ep_id);
	if (cfg) {
		got = !lk_rss_input_skb(skb, cfg->hash_types, &in);
		if (got)
			hash = lk_toeplitz(&cfg->key, in.bytes, in.len);
		q = lk_vm_rss_pick(cfg, got, hash, queues);
		if (q >= 0)
			return q;
	}
	return bpf_get_hash_recalc(skb) % queues;
}

#endif /* LK_VM_RSS_H */
