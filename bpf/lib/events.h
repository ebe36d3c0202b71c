/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow events: drops and sampled forwarded packets, through a ring buffer
 * the agent reads while someone observes (lanekit observe). Nothing is
 * reserved in the ring unless lk_events_cfg enables the kind: the agent
 * writes it when the first subscriber arrives and clears it after the last
 * one leaves. */
#ifndef LK_EVENTS_H
#define LK_EVENTS_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, LK_EVENTS_RING_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_events SEC(".maps");

/* One entry: struct events_cfg, written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct events_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_events_cfg SEC(".maps");

/* Events lost because the ring was full, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_events_lost SEC(".maps");

/* Keep struct lk_event in BTF for bpf2go -type (the ring has no value type). */
const struct lk_event *lk_unused_event __attribute__((unused));

static __always_inline const struct events_cfg *events_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lk_events_cfg, &zero);
}

/* events_fill copies the addresses of the frame [data, data_end) into ev:
 * EtherType, and for IPv4 the addresses, protocol and (TCP/UDP) ports. */
static __always_inline void events_fill(struct lk_event *ev, void *data, void *data_end)
{
	struct ethhdr *eth = data;
	struct iphdr *iph;

	if ((void *)(eth + 1) > data_end)
		return;
	ev->l3_proto = eth->h_proto;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return;
	iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->version != 4)
		return;
	ev->saddr = iph->saddr;
	ev->daddr = iph->daddr;
	ev->l4_proto = iph->protocol;
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return;
	/* Ports of the first fragment only; later fragments have none. */
	if (iph->frag_off & bpf_htons(0x1fff))
		return;
	__be16 *ports = (void *)iph + iph->ihl * 4;

	if ((void *)(ports + 2) > data_end)
		return;
	ev->sport = ports[0];
	ev->dport = ports[1];
}

/* events_emit writes one event, or counts it lost when the ring is full. */
static __always_inline void events_emit(__u32 kind, __u32 reason, __u32 ep_id, __u32 peer_ep_id,
					__u32 ifindex, __u32 len, void *data, void *data_end)
{
	struct lk_event *ev = bpf_ringbuf_reserve(&lk_events, sizeof(*ev), 0);

	if (!ev) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&lk_events_lost, &zero);

		if (lost)
			(*lost)++;
		return;
	}
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ts_ns = bpf_ktime_get_ns();
	ev->kind = kind;
	ev->reason = reason;
	ev->ep_id = ep_id;
	ev->peer_ep_id = peer_ep_id;
	ev->ifindex = ifindex;
	ev->len = len;
	events_fill(ev, data, data_end);
	bpf_ringbuf_submit(ev, 0);
}

/* event_drop reports a drop when drop events are enabled. */
static __always_inline void event_drop(__u32 reason, __u32 ep_id, __u32 ifindex, __u32 len,
				       void *data, void *data_end)
{
	const struct events_cfg *cfg = events_cfg();

	if (cfg && (cfg->flags & EVENTS_F_DROPS))
		events_emit(EVENT_DROP, reason, ep_id, 0, ifindex, len, data, data_end);
}

/* event_forwarded reports one in sample_rate forwarded packets when sampling
 * is enabled. */
static __always_inline void event_forwarded(__u32 ep_id, __u32 peer_ep_id, __u32 ifindex,
					    __u32 len, void *data, void *data_end)
{
	const struct events_cfg *cfg = events_cfg();

	if (!cfg || !(cfg->flags & EVENTS_F_FORWARDED))
		return;
	if (cfg->sample_rate > 1 && bpf_get_prandom_u32() % cfg->sample_rate)
		return;
	events_emit(EVENT_FORWARDED, 0, ep_id, peer_ep_id, ifindex, len, data, data_end);
}

/* skb_event_forwarded samples a packet forwarded from endpoint src_id (0:
 * from the uplink) to local endpoint dst_id (0: leaves the node). Call it
 * before the packet is rewritten. */
static __always_inline void skb_event_forwarded(struct __sk_buff *skb, __u32 src_id, __u32 dst_id)
{
	event_forwarded(src_id, dst_id, skb->ifindex, skb->len, (void *)(long)skb->data,
			(void *)(long)skb->data_end);
}

#endif
