/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* edt.h: a pod's egress bandwidth limit (kubernetes.io/egress-bandwidth)
 * by Earliest Departure Time, as Cilium's bandwidth manager does: from_pod
 * stamps each packet of a limited endpoint with the time it may leave
 * (skb->tstamp, monotonic delivery time), spacing them at the endpoint's
 * rate, and the fq qdisc on the uplink holds each packet until then. A
 * packet that would leave more than the horizon from now is dropped
 * (DROP_EDT_HORIZON): TCP's small queues keep a sender far below that, so
 * drops mean a sender that ignores back-pressure. Traffic that leaves by no
 * fq (to a pod on the same node) is stamped but not paced. */
#ifndef LK_EDT_H
#define LK_EDT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"

#define LK_NSEC_PER_SEC 1000000000ULL

/* datapath.EgressRate (key: the endpoint ID). */
struct edt_info {
	__u64 bytes_per_sec; /* 0: no limit */
	__u64 t_last; /* departure time of the endpoint's last stamped packet */
	__u64 horizon_ns; /* drop what would leave later than now + this */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct edt_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_edt SEC(".maps");

/* edt_sched_departure stamps skb for endpoint ep_id. Returns 0 or
 * DROP_EDT_HORIZON. Concurrent packets of one endpoint on two CPUs may
 * read the same t_last (as in Cilium): the rate then errs on the high side
 * by a packet, never low. */
static __always_inline __u32 edt_sched_departure(struct __sk_buff *skb, __u32 ep_id)
{
	struct edt_info *info = bpf_map_lookup_elem(&lk_edt, &ep_id);
	__u64 now, t, t_next, delay;

	if (!info || !info->bytes_per_sec)
		return 0;
	now = bpf_ktime_get_ns();
	t = skb->tstamp;
	if (t < now)
		t = now;
	delay = (__u64)skb->len * LK_NSEC_PER_SEC / info->bytes_per_sec;
	t_next = *(volatile __u64 *)&info->t_last + delay;
	if (t_next <= t) {
		*(volatile __u64 *)&info->t_last = t;
		return 0;
	}
	if (t_next - now >= info->horizon_ns)
		return DROP_EDT_HORIZON;
	*(volatile __u64 *)&info->t_last = t_next;
	bpf_skb_set_tstamp(skb, t_next, BPF_SKB_TSTAMP_DELIVERY_MONO);
	return 0;
}

#endif
