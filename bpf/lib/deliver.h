/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Verdicts and local delivery shared by routing (fib.h) and the tunnel
 * (tunnel.h): drop and count, hand to the host stack, deliver to a local
 * endpoint, and the kernel's forwarding MTU test. */
#ifndef LK_DELIVER_H
#define LK_DELIVER_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "csum.h"
#include "events.h"
#include "maps.h"
#include "parse.h"
#include "vm_rss.h"

static __always_inline int drop(struct __sk_buff *skb, __u32 ep_id, __u32 reason)
{
	metrics_add(ep_id, METRIC_DROP_BASE + reason, skb->len);
	event_drop(reason, ep_id, skb->ifindex, skb->len, (void *)(long)skb->data,
		   (void *)(long)skb->data_end);
	return TC_ACT_SHOT;
}

/* to_stack hands a packet endpoint ep_id sent to the host stack (it knows
 * what to do: deliver locally, send ICMP, fragment) and counts it, so the
 * share of traffic that does not take the BPF path is visible. */
static __always_inline int to_stack(struct __sk_buff *skb, __u32 ep_id)
{
	metrics_add(ep_id, METRIC_TO_STACK, skb->len);
	return TC_ACT_OK;
}

/* to_endpoint hands a frame to endpoint ep. A pod gets it in its netns
 * directly (bpf_redirect_peer: no second pass through the backlog queue). A
 * VM gets it through its host device's transmit path (bpf_redirect): there the
 * kernel segments GSO packets and completes partial checksums, which AF_XDP
 * copy mode would otherwise hand to a guest unfinished, and the veth carries
 * it to the native XDP program in front of the VM's sockets. */
static __always_inline int to_endpoint(struct __sk_buff *skb, const struct endpoint_info *ep)
{
	if (ep->flags & EP_F_VM) {
		trace_redirect(ep->ifindex, REDIR_PLAIN, skb->queue_mapping);
		return bpf_redirect(ep->ifindex, 0);
	}
	trace_redirect(ep->ifindex, REDIR_PEER, skb->queue_mapping);
	return bpf_redirect_peer(ep->ifindex, 0);
}

/* deliver_local_l3 rewrites the frame for a local endpoint and hands it
 * over. src_id is the sending endpoint (0: from the uplink); v6 (a constant
 * at each call site) says which of p's headers is set. */
static __always_inline int deliver_local_l3(struct __sk_buff *skb, struct pkt *p, __u32 src_id,
					    const struct endpoint_info *dst, const int v6)
{
	skb_event_forwarded(skb, src_id, dst->id);
	if (v6)
		p->ip6->hop_limit--; /* no header checksum in IPv6 */
	else
		ipv4_decrease_ttl(p->ip4);
	mac_copy(p->eth->h_dest, dst->mac);
	mac_copy(p->eth->h_source, dst->host_mac);
	metrics_add(dst->id, METRIC_TO_EP, skb->len);
	/* A multiqueue endpoint (a VM) receives each flow on one rx queue, chosen
	 * from its guest's RSS table or else the flow hash (lib/vm_rss.h): the
	 * queue its AF_XDP socket is bound to. The rx queue is recorded as
	 * queue_mapping - 1. */
	if (dst->queues > 1)
		skb->queue_mapping = lk_vm_rx_queue(skb, dst->id, dst->queues) + 1;
	return to_endpoint(skb, dst);
}

/* deliver_local is deliver_local_l3 for IPv4. */
static __always_inline int deliver_local(struct __sk_buff *skb, struct pkt *p, __u32 src_id,
					 const struct endpoint_info *dst)
{
	return deliver_local_l3(skb, p, src_id, dst, 0);
}

/* fits_mtu_l3 is the kernel's forwarding MTU test (ip_forward's and ip6_forward's
 * ip_exceeds_mtu): a packet fits the egress device when its length does, a
 * GSO packet when each of the segments it will be cut into does. GSO/TSO
 * packets (up to 64 KiB) are the bulk of TCP; judging them by their total
 * length would send every one of them to the host stack.
 *
 * For TCP (TSO, nearly all GSO traffic) the segment size is computed here:
 * L3 header(s) + TCP header + gso_size, what skb_gso_validate_network_len
 * computes. Other GSO packets (UDP GSO, tunnels) are left to the kernel's
 * BPF_MTU_CHK_SEGS. (The TCP case is done here rather than with
 * BPF_MTU_CHK_SEGS so that BPF_PROG_TEST_RUN fixtures, whose skbs carry
 * no transport header offset, can exercise it.) l3len is where the TCP
 * header starts after the Ethernet header; not_sent of those bytes are in
 * no segment (IPv6 BIG TCP's jumbo hop-by-hop header, ipv6.h). */
static __always_inline int fits_mtu_l3(struct __sk_buff *skb, __u32 l3len, __u32 not_sent, __u8 l4proto,
				       __u32 ifindex)
{
	__u32 mtu = 0; /* in: 0, judge the skb itself; out: the device MTU */
	__u32 gso_size = skb->gso_size;
	__u8 doff;

	if (!gso_size || l4proto != IPPROTO_TCP)
		return bpf_check_mtu(skb, ifindex, &mtu, 0, BPF_MTU_CHK_SEGS) == BPF_MTU_CHK_RET_SUCCESS;
	if (bpf_check_mtu(skb, ifindex, &mtu, 0, 0) != BPF_MTU_CHK_RET_SUCCESS)
		return 0;
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + l3len + 12, &doff, 1) < 0)
		return 0;
	return l3len - not_sent + (doff >> 4) * 4 + gso_size <= mtu;
}

/* fits_mtu is fits_mtu_l3 for an IPv4 packet (its header length from IHL;
 * IPv6 passes its header chain's length, ipv6.h). */
static __always_inline int fits_mtu(struct __sk_buff *skb, const struct iphdr *iph, __u32 ifindex)
{
	return fits_mtu_l3(skb, iph->ihl * 4, 0, iph->protocol, ifindex);
}

#endif /* LK_DELIVER_H */
