/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Every map key and value struct, in one place. */
#ifndef LK_STRUCTS_H
#define LK_STRUCTS_H

#include <linux/types.h>

/* One local endpoint (pod). Keyed by IPv4 address in lk_endpoints, by IPv6
 * address in lk_endpoints6 (ipv6.h) and by host-side ifindex in
 * lk_ep_by_ifindex. */
struct endpoint_info {
	__u32 ifindex; /* host-side device (veth host end / netkit primary) */
	__u32 id; /* agent-assigned endpoint id, > 0 */
	__be32 ip; /* the endpoint's IPv4 address */
	__u8 mac[6]; /* the endpoint's MAC */
	__u8 host_mac[6]; /* host-side device MAC: the endpoint's gateway MAC */
	__u16 queues; /* rx queues of the endpoint device (VMs: queue pairs); 0/1: one */
	__u16 flags; /* enum lk_endpoint_flags */
	__u8 ip6[16]; /* the endpoint's IPv6 address; all zero: none (IPv6 from it is dropped) */
};

struct metrics_key {
	__u32 ep_id; /* 0: not attributable to an endpoint */
	__u32 kind; /* METRIC_FROM_EP, METRIC_TO_EP, METRIC_DROP_BASE + reason */
};

struct metrics_val {
	__u64 packets;
	__u64 bytes;
};

/* Last redirect decision, written only when trace_redirects is set (tests). */
struct redirect_trace {
	__u32 ifindex;
	__u32 kind;
	__u32 queue_mapping; /* skb->queue_mapping when the redirect was decided */
};

/* lk_events_cfg's one value: what the programs report (agent-written). */
struct events_cfg {
	__u32 flags; /* enum lk_events_flags; 0: nothing, no cost beyond this lookup */
	__u32 sample_rate; /* EVENTS_F_FORWARDED: one in sample_rate packets (0/1: all) */
};

/* One flow event in lk_events. */
struct lk_event {
	__u64 ts_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u32 kind; /* enum lk_event_kind */
	__u32 reason; /* enum lk_drop_reason for EVENT_DROP */
	__u32 ep_id; /* endpoint charged (drop) or sending (forwarded); 0: none */
	__u32 peer_ep_id; /* forwarded: the local endpoint receiving it; 0: none */
	__u32 ifindex; /* device the packet entered on */
	__u32 len; /* packet length in bytes */
	__be32 saddr; /* IPv4 only */
	__be32 daddr;
	__be16 sport; /* TCP/UDP only */
	__be16 dport;
	__be16 l3_proto; /* EtherType; 0: too short */
	__u8 l4_proto; /* IPv4 protocol */
	__u8 pad;
};

/* A conntrack key (lk_ct4, ct.h): also the flow tuple the LB hashes
 * (lb_select.h). */
struct ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 flags; /* enum lk_ct_key_flags */
	__u16 pad;
};

#endif
