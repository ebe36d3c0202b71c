//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* uplink.c: programs on the node uplink (the "wire").
 *   from_uplink (tcx ingress): untagged IPv4 and IPv6 for a local pod goes straight
 *     into the pod's netns with bpf_redirect_peer; everything else (VLAN
 *     tagged frames included) continues to the host stack. In tunnel mode
 *     another node's VXLAN packet for a local pod is decapsulated here
 *     first (lib/tunnel.h: tunnel_uplink_decap).
 *   to_uplink (tcx egress): replies of the node's own stack to service flows
 *     it was the backend of get the frontend's address back.
 *   from_tunnel (tcx ingress of the VXLAN device, tunnel routing mode): the
 *     same for what another node sent through the tunnel about its own pods
 *     (outer and inner source checked), with the sender's identity from the
 *     VNI (lib/tunnel.h).
 *   to_tunnel (tcx egress of the VXLAN device): what the node's own stack
 *     sends into the tunnel (its routes to other nodes' pod CIDRs point
 *     there) gets its tunnel key; what the datapath redirected has one. */
#include <linux/bpf.h>
#include <linux/if_packet.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "lib/consts.h"
#include "lib/structs.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/fib.h"
#include "lib/lb.h" /* [LB] */
#include "lib/policy.h"
#include "lib/ipv6.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* from_wire is what enters the node for its pods: from the uplink, or
 * decapsulated from the tunnel (src_hint: the sender's identity the VNI
 * carried, 0: resolve its address). */
static __always_inline int from_wire(struct __sk_buff *skb, __u32 src_hint)
{
	struct lb_pending *pend = lb_pending_get();
	struct endpoint_info *dst;
	struct pkt p;
	__u32 reason;

	/* A VLAN-tagged frame (tag in metadata, or still in the frame: then it
	 * does not parse as IPv4 below) belongs to whatever VLAN device the
	 * host has, never straight into a pod: the host stack decides. */
	if (skb->vlan_present)
		return TC_ACT_OK;
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0)
		return TC_ACT_OK; /* not ours to judge: the stack drops what is broken */
	if (p.ip6) {
		bpf_tail_call(skb, &lk_uplink6_progs, 0); /* from_uplink6, below */
		return TC_ACT_OK; /* not installed: the stack's */
	}
	if (!p.ip4)
		return TC_ACT_OK;
	/* [LB]: NodePort frontends on this node's addresses are load-balanced;
	 * replies of flows this node load-balanced (its pods' service flows,
	 * NodePort flows it source-NATed) are translated back. */
	{
		int changed, v = lb4(skb, &p, LB_SCOPE_NODEPORT, 0, &changed, pend);

		if (v != LB_CONTINUE)
			return v;
		if (changed) {
			if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4)
				return TC_ACT_SHOT;
			if (!bpf_map_lookup_elem(&lk_endpoints, &p.ip4->daddr)) {
				/* Translated for another node (NodePort to a
				 * remote backend, or its reply to the client):
				 * that node's policy judges it. */
				lb_commit(pend);
				if (p.ip4->ttl <= 1 || p.ip4->ihl > 5)
					return TC_ACT_OK;
				return route_ipv4(skb, &p, 0);
			}
		}
	}
	/* [/LB] */
	dst = bpf_map_lookup_elem(&lk_endpoints, &p.ip4->daddr);
	if (!dst) {
		lb_commit(pend); /* nothing pending: LB changed nothing */
		return TC_ACT_OK;
	}
	/* [policy] the receiver's ingress, before any path into it (the host
	 * stack's included). */
	if (!pend || !pend->allowed_reply) { /* a reply LB translated back: allowed */
		reason = policy_to_endpoint(skb, &p, dst, 0, src_hint);
		if (reason)
			return drop(skb, dst->id, reason);
	}
	/* [/policy] */
	lb_commit(pend); /* [LB] the new flow's state, now that it is allowed */
	if (p.ip4->ttl <= 1 || p.ip4->ihl > 5)
		return TC_ACT_OK; /* ICMP time exceeded; IP options are the stack's to process */
	return deliver_local(skb, &p, 0, dst);
}

SEC("tc")
int from_uplink(struct __sk_buff *skb)
{
	long ident = TUNNEL_UPLINK_PASS;

	if (skb->pkt_type != PACKET_HOST)
		return TC_ACT_OK;
	/* Tunnel mode: another node's VXLAN packet for a local endpoint is
	 * decapsulated here (lib/tunnel.h), the rest goes on as it came. */
	if (tunnel_ifindex)
		ident = tunnel_uplink_decap(skb);
	return from_wire(skb, ident == TUNNEL_UPLINK_PASS ? 0 : (__u32)ident);
}

/* to_uplink (tcx egress of the uplink): what the node's own stack sends
 * (ingress_ifindex 0; what the datapath or the stack forwards is not
 * looked at) may answer a NodePort or ClusterIP flow whose backend is the
 * node itself, a hostNetwork endpoint: it leaves with the frontend's address
 * and port, as the remote client connected to (lb4_reply; IPv6: lb6_reply). */
SEC("tc")
int to_uplink(struct __sk_buff *skb)
{
	struct pkt p;

	if (skb->ingress_ifindex)
		return TC_ACT_OK;
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0)
		return TC_ACT_OK;
	if (p.ip6)
		return lb6_reply(skb, &p, lb6_pending_get()) < 0 ? TC_ACT_SHOT : TC_ACT_OK;
	if (!p.ip4)
		return TC_ACT_OK;
	if (lb4_reply(skb, &p, 0) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* from_host (tcx ingress of a DPU's host-facing PF representor, lanekitd
 * --mode dpu --dpu-host-pf): the host's own traffic (its processes,
 * hostNetwork pods) on its way through the DPU. ClusterIP frontends are
 * load-balanced as for a pod, without SNAT: the backend answers the host's
 * address, which the DPU stands in front of, and from_uplink (or to_pod,
 * for a backend behind this DPU) translates the reply back. Everything else
 * continues to the DPU's stack. IPv4. */
SEC("tc")
int from_host(struct __sk_buff *skb)
{
	struct lb_pending *pend = lb_pending_get();
	struct pkt p;
	int changed, v;

	if (skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return TC_ACT_OK;
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4)
		return TC_ACT_OK;
	v = lb4(skb, &p, LB_SCOPE_CLUSTERIP, 0, &changed, pend);
	if (v != LB_CONTINUE)
		return v;
	lb_commit(pend);
	return TC_ACT_OK;
}

/* from_uplink6 is from_wire for IPv6 (lib/ipv6.h), entered from it by a
 * tail call (lk_uplink6_progs): the IPv4 pipeline fills from_wire's stack. */
SEC("tc")
int from_uplink6(struct __sk_buff *skb)
{
	struct pkt p;

	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip6)
		return TC_ACT_OK;
	return from_uplink_ipv6(skb, &p);
}

SEC("tc")
int from_tunnel(struct __sk_buff *skb)
{
	__u32 ident = 0, reason;

	tunnel_count(TUNNEL_STAT_DECAP);
	/* The VNI speaks for the sender only when another node sent it, about
	 * its own pods (lib/tunnel.h). Charged to no endpoint: the node's. */
	reason = tunnel_rx_check(skb, &ident);
	if (reason)
		return drop(skb, 0, reason);
	if (ident)
		tunnel_count(TUNNEL_STAT_VNI_IDENTITY);
	return from_wire(skb, ident);
}

SEC("tc")
int to_tunnel(struct __sk_buff *skb)
{
	struct pkt p;

	if (tunnel_has_key(skb))
		return TC_ACT_OK; /* encapsulated by tunnel_route */
	if (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4)
		return TC_ACT_SHOT; /* ARP and the like: the device is NOARP */
	if (!skb->ingress_ifindex) {
		/* The node's own reply to a service flow it was the backend
		 * of, as to_uplink does. */
		int r = lb4_reply(skb, &p, 0);

		if (r < 0)
			return TC_ACT_SHOT;
		if (r && (parse_eth(&p, (void *)(long)skb->data, (void *)(long)skb->data_end) < 0 || !p.ip4))
			return TC_ACT_SHOT;
	}
	return tunnel_host_key(skb, &p);
}
