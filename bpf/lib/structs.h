/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Every map key and value struct, in one place. */
#ifndef LK_STRUCTS_H
#define LK_STRUCTS_H

#include <linux/types.h>

/* One local endpoint (pod). Keyed by IPv4 address in lk_endpoints and by
 * host-side ifindex in lk_ep_by_ifindex. */
struct endpoint_info {
	__u32 ifindex; /* host-side device (veth host end / netkit primary) */
	__u32 id; /* agent-assigned endpoint id, > 0 */
	__be32 ip; /* the endpoint's IPv4 address */
	__u8 mac[6]; /* the endpoint's MAC */
	__u8 host_mac[6]; /* host-side device MAC: the endpoint's gateway MAC */
	__u16 queues; /* rx queues of the endpoint device (VMs: queue pairs); 0/1: one */
	__u16 flags; /* enum lk_endpoint_flags */
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

#endif
