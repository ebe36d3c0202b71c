//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* rss_hash.c: runs lib/toeplitz.h on one frame through BPF_PROG_TEST_RUN, so
 * `lanekit rss hash` and the tests compute hashes with the very code the
 * steering programs run. The caller writes the key (QEMU layout) and the
 * enabled hash types, runs the program on a frame it built, and reads the
 * result. Returns 1 when the frame got a hash, 0 when it did not. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/toeplitz.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* The hash request: VIRTIO_NET_RSS_HASH_TYPE_* bits to consider. */
struct lk_rss_hash_args {
	__u32 hash_types;
};

/* The result of the last run. */
struct lk_rss_hash_result {
	__u32 hash;
	__u32 report; /* VIRTIO_NET_HASH_REPORT_*, 0 when no hash */
	__u32 input_len; /* bytes hashed */
};

/* Toeplitz key, QEMU layout (see lib/toeplitz.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lk_toeplitz_key);
} lk_hash_key SEC(".maps");

/* The request (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lk_rss_hash_args);
} lk_hash_args SEC(".maps");

/* The result (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lk_rss_hash_result);
} lk_hash_result SEC(".maps");

SEC("socket")
int rss_hash(struct __sk_buff *skb)
{
	struct lk_rss_input in = {};
	struct lk_toeplitz_key *key;
	struct lk_rss_hash_args *args;
	struct lk_rss_hash_result *res;
	__u32 zero = 0;

	key = bpf_map_lookup_elem(&lk_hash_key, &zero);
	args = bpf_map_lookup_elem(&lk_hash_args, &zero);
	res = bpf_map_lookup_elem(&lk_hash_result, &zero);
	if (!key || !args || !res)
		return 0;
	res->hash = 0;
	res->report = VIRTIO_NET_HASH_REPORT_NONE;
	res->input_len = 0;
	if (lk_rss_input_skb(skb, args->hash_types, &in))
		return 0;
	res->hash = lk_toeplitz(key, in.bytes, in.len);
	res->report = in.report;
	res->input_len = in.len;
	return 1;
}
