/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps, pinned by name under the agent's pin directory. */
#ifndef LK_MAPS_H
#define LK_MAPS_H

#include <linux/bpf.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "structs.h"

/* Local endpoints by IPv4 address: where to deliver. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, __be32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_endpoints SEC(".maps");

/* Local endpoints by IPv6 address: where to deliver. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, struct in6_addr);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_endpoints6 SEC(".maps");

/* Local endpoints by host-side ifindex: who is sending (anti-spoofing). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_ep_by_ifindex SEC(".maps");

/* Per-endpoint packet/byte counters and drops by reason, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS * 4);
	__type(key, struct metrics_key);
	__type(value, struct metrics_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_metrics SEC(".maps");

/* Counter updates lk_metrics had no room for (a full map), per CPU, index 0:
 * a full table is counted, never silent. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_metrics_lost SEC(".maps");

/* Test-only trace of the last redirect (see trace_redirects). */
struct redirect_trace last_redirect;

/* Load-time setting: record redirect decisions in last_redirect (fixtures). */
const volatile __u8 trace_redirects = 0;

static __always_inline void metrics_add(__u32 ep_id, __u32 kind, __u64 bytes)
{
	struct metrics_key key = { .ep_id = ep_id, .kind = kind };
	struct metrics_val *val = bpf_map_lookup_elem(&lk_metrics, &key);

	if (val) {
		val->packets++;
		val->bytes += bytes;
		return;
	}
	struct metrics_val init = { .packets = 1, .bytes = bytes };
	if (!bpf_map_update_elem(&lk_metrics, &key, &init, BPF_NOEXIST))
		return;
	/* Another CPU created the key meanwhile: count on this CPU's value. */
	val = bpf_map_lookup_elem(&lk_metrics, &key);
	if (val) {
		val->packets++;
		val->bytes += bytes;
		return;
	}
	__u32 zero = 0;
	__u64 *lost = bpf_map_lookup_elem(&lk_metrics_lost, &zero);

	if (lost)
		(*lost)++;
}

static __always_inline void trace_redirect(__u32 ifindex, __u32 kind, __u32 queue_mapping)
{
	if (trace_redirects) {
		last_redirect.ifindex = ifindex;
		last_redirect.kind = kind;
		last_redirect.queue_mapping = queue_mapping;
	}
}

#endif
