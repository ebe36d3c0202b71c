//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pod.c: programs on the host side of a pod device (tcx ingress of the veth
 * host end, or the netkit peer). The pipeline is a chain of small steps:
 *   parse -> identify endpoint -> anti-spoof -> [LB] -> [policy] -> route
 * The bracketed steps are service load balancing and network policy.
 * to_pod (at the end) judges what the host stack sends into the pod. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "lib/consts.h"
#include "lib/structs.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/fib.h"
#include "lib/arp.h"
#include "lib/dhcp.h"
#include "lib/lb.h" /* [LB] */
#include "lib/masq.h"
#include "lib/policy.h"
#include "lib/ipv6.h"
#include "lib/edt.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* antispoof checks that an IPv4 packet carries the endpoint's own source MAC
 * and IP. Returns 0 or a drop reason. An L3 device (netkit L3) has no MAC:
 * the kernel fills both Ethernet addresses with its all-zero address, and
 * the frame never leaves with them (they are rewritten on every path), so
 * there the source IP is the identity. */
static __always_inline __u32 antispoof(const struct pkt *p, const struct endpoint_info *ep)
{
	if (!(ep->flags & EP_F_L3) && !mac_equal(p->eth->h_source, ep->mac))
		return DROP_SPOOFED_MAC;
	/* 0.0.0.0 is nobody's: an endpoint without IPv4 (an IPv6-only node's)
	 * is written with 0, and what it sends from there is spoofed too. */
	if (p->ip4->saddr != ep->ip || !p->ip4->saddr)
		return DROP_SPOOFED_IP;
	return 0;
}

SEC("tc")
int from_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&lk_ep_by_ifindex, &ifindex);
	struct lb_pending *pend = lb_pending_get();
	struct pkt p;
	__u32 reason, charge;

	if (!ep)
		return drop(skb, 0, DROP_UNKNOWN_EP);
	/* 802.1Q/802.1ad: an endpoint with CAP_NET_RAW could put frames for
	 * any VLAN on the underlay. The kernel has moved the (outer) tag into
	 * skb metadata before tc runs; an inner tag (QinQ) or one the device
	 * did not offload is still in the frame. */
	if (skb->vlan_present)
		return drop(skb, ep->id, DROP_VLAN);
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0)
		return drop(skb, ep->id, DROP_MALFORMED);
	if (is_vlan_proto(p.eth->h_proto))
		return drop(skb, ep->id, DROP_VLAN);
	if (p.arp)
		return handle_arp(skb, &p, ep);
	if (p.ip6) {
		bpf_tail_call(skb, &lk_pod6_progs, 0); /* from_pod6, below */
		return drop(skb, ep->id, DROP_UNSUPPORTED_L3); /* not installed */
	}
	if (!p.ip4)
		return drop(skb, ep->id, DROP_UNSUPPORTED_L3);
	if (ep->flags & EP_F_VM) { /* a guest asking for its address (lib/dhcp.h) */
		int v;

		if (dhcp_serve(skb, &p, ep, &v))
			return v;
	}

	reason = antispoof(&p, ep);
	if (reason)
		return drop(skb, ep->id, reason);
	metrics_add(ep->id, METRIC_FROM_EP, skb->len);

	/* [LB]: service frontends (ClusterIP) are load-balanced; replies of
	 * flows this node load-balanced are translated back. */
	{
		int changed, v = lb4(skb, &p, LB_SCOPE_CLUSTERIP, ep, &changed, pend);

		if (v != LB_CONTINUE)
			return v;
		if (changed && parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0)
			return drop(skb, ep->id, DROP_MALFORMED);
		if (changed && !p.ip4)
			return drop(skb, ep->id, DROP_MALFORMED);
	}
	/* [/LB] */

	/* Tunnel mode: no VXLAN of the endpoint's own making reaches a node
	 * (lib/tunnel.h), whatever policy allows. */
	reason = tunnel_port_guard(skb, p.ip4->protocol,
				   frag4_later(p.ip4) ? 0 : sizeof(struct ethhdr) + p.ip4->ihl * 4, p.ip4->daddr, 0);
	if (reason)
		return drop(skb, ep->id, reason);

	/* [policy] (bpf/lib/policy.h): the sender's egress and a local
	 * receiver's ingress, on the packet as load balancing left it; a
	 * reply it translated back belongs to a connection policy allowed. */
	if (!pend || !pend->allowed_reply) {
		reason = policy_from_endpoint(skb, &p, ep, &charge);
		if (reason)
			return drop(skb, charge, reason);
	}
	/* [/policy] */
	lb_commit(pend); /* [LB] the new flow's state, now that it is allowed */

	reason = edt_sched_departure(skb, ep->id); /* its egress bandwidth limit (edt.h) */
	if (reason)
		return drop(skb, ep->id, reason);

	/* Broadcast and multicast are not routed: the host stack takes them. */
	if (is_multicast_ether(p.eth->h_dest) || is_multicast_or_bcast_ipv4(p.ip4->daddr))
		return to_stack(skb, ep->id);
	if (p.ip4->ttl <= 1)
		return to_stack(skb, ep->id); /* the host stack sends ICMP time exceeded */
	/* IP options (record route, timestamps, source routing, which the
	 * kernel refuses unless accept_source_route) are the stack's to process. */
	if (p.ip4->ihl > 5)
		return to_stack(skb, ep->id);
	/* Tunnel mode: what leaves the cluster leaves with the node's address
	 * (lib/masq.h). */
	{
		int changed;

		reason = masq4(skb, &p, ep, &changed);
		if (reason)
			return drop(skb, ep->id, reason);
		if (changed && (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4))
			return drop(skb, ep->id, DROP_MALFORMED);
	}
	return route_ipv4(skb, &p, ep->id);
}

/* from_pod6 is from_pod for IPv6 (lib/ipv6.h), entered from it by a tail
 * call (lk_pod6_progs): the same endpoint, parsed again on a fresh stack. */
SEC("tc")
int from_pod6(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&lk_ep_by_ifindex, &ifindex);
	struct pkt p;

	if (!ep)
		return drop(skb, 0, DROP_UNKNOWN_EP);
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip6)
		return drop(skb, ep->id, DROP_MALFORMED);
	return from_pod_ipv6(skb, &p, ep);
}

/* to_pod runs where the host stack sends a packet into a pod: tcx egress of
 * the veth host end (netkit: the primary device's program). Deliveries by
 * bpf_redirect_peer (from_pod, from_uplink) never pass here; what does is
 * everything the stack routes to the pod: the node itself and hostNetwork
 * pods, a second NIC, a tunnel device, and the packets from_pod/from_uplink
 * hand to the stack (TTL 1, IP options, after their own policy check). The
 * pod's ingress policy judges it all, so no path into a pod skips it;
 * traffic from the node's own addresses passes (Kubernetes: a pod's node
 * always reaches it). A packet already judged on its way belongs to a
 * connection policy allowed and passes on its conntrack entry. Replies of
 * service flows whose backend is on the node's stack are translated back
 * here (lb4_reply). */
SEC("tc")
int to_pod(struct __sk_buff *skb)
{
	struct endpoint_info *dst;
	struct pkt p;
	__u32 reason;

	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0)
		return TC_ACT_OK;
	if (p.ip6)
		return to_pod_ipv6(skb, &p); /* lib/ipv6.h */
	if (!p.ip4)
		return TC_ACT_OK; /* the stack's own ARP */
	dst = bpf_map_lookup_elem(&lk_endpoints, &p.ip4->daddr);
	if (!dst)
		return TC_ACT_OK; /* broadcast, multicast: no endpoint's address */
	/* [LB] A reply from a backend on this node's stack (the node's own
	 * address or a hostNetwork pod behind a Service) goes back to the
	 * client pod with the frontend's address. */
	{
		struct lb_pending *pend = lb_pending_get();
		int r = lb4_reply(skb, &p, pend);

		if (r < 0)
			return drop(skb, dst->id, DROP_MALFORMED);
		if (r) {
			if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4)
				return drop(skb, dst->id, DROP_MALFORMED);
			if (pend && pend->allowed_reply)
				return TC_ACT_OK; /* a connection policy allowed */
		}
	}
	/* [/LB] */
	reason = policy_to_endpoint(skb, &p, dst, 1, 0);
	if (reason)
		return drop(skb, dst->id, reason);
	return TC_ACT_OK;
}
