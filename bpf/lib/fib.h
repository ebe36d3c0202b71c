/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Routing: local endpoints first, then the kernel FIB. */
#ifndef LK_FIB_H
#define LK_FIB_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "csum.h"
#include "events.h"
#include "maps.h"
#include "deliver.h"
#include "parse.h"
#include "tunnel.h"
#include "vm_rss.h"

/* route_ipv4 forwards an IPv4 packet that entered on skb->ifindex.
 * ep_id is the sending endpoint (for drop accounting). The TTL must have been
 * checked (> 1) by the caller. */
static __always_inline int route_ipv4(struct __sk_buff *skb, struct pkt *p, __u32 ep_id)
{
	struct iphdr *iph = p->ip4;
	struct endpoint_info *dst = bpf_map_lookup_elem(&lk_endpoints, &iph->daddr);

	if (dst)
		return deliver_local(skb, p, ep_id, dst);
	{
		int v = tunnel_route(skb, p, ep_id); /* tunnel mode: another node's pod */

		if (v >= 0)
			return v;
	}

	/* tot_len 0: no MTU check on the IP length inside the lookup (it would
	 * fail every GSO packet); fits_mtu below does the GSO-aware one. */
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.tos = iph->tos,
		.l4_protocol = iph->protocol,
		.tot_len = 0,
		.ipv4_src = iph->saddr,
		.ipv4_dst = iph->daddr,
		.ifindex = skb->ifindex,
	};
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);

	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		/* Route and neighbour known: rewrite and transmit directly. */
		if (!fits_mtu(skb, iph, fib.ifindex))
			return to_stack(skb, ep_id); /* ICMP frag needed, or fragment */
		skb_event_forwarded(skb, ep_id, 0);
		ipv4_decrease_ttl(iph);
		mac_copy(p->eth->h_dest, fib.dmac);
		mac_copy(p->eth->h_source, fib.smac);
		trace_redirect(fib.ifindex, REDIR_PLAIN, skb->queue_mapping);
		return bpf_redirect(fib.ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH: {
		/* Route known, neighbour not resolved yet: let the kernel's
		 * neighbour subsystem resolve and fill in the MACs. */
		struct bpf_redir_neigh nh = {
			.nh_family = AF_INET,
			.ipv4_nh = fib.ipv4_dst,
		};

		if (!fits_mtu(skb, iph, fib.ifindex))
			return to_stack(skb, ep_id);
		skb_event_forwarded(skb, ep_id, 0);
		ipv4_decrease_ttl(iph);
		trace_redirect(fib.ifindex, REDIR_NEIGH, skb->queue_mapping);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	case BPF_FIB_LKUP_RET_BLACKHOLE:
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		return drop(skb, ep_id, DROP_FIB_FAILED);
	default:
		/* NOT_FWDED (for the host itself, broadcast), FWD_DISABLED,
		 * FRAG_NEEDED, UNSUPP_LWT: the host stack knows what to do
		 * (deliver locally, send ICMP). */
		return to_stack(skb, ep_id);
	}
}

#endif
