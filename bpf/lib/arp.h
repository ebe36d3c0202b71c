/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ARP responder for the endpoint's gateway, so pods need no bridge. */
#ifndef LK_ARP_H
#define LK_ARP_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include "fib.h"
#include "parse.h"

/* The gateway address pods route through (169.254.1.1 by default), in
 * network byte order. Set at load time. */
const volatile __be32 gateway_ip = 0;

/* handle_arp answers the endpoint's ARP request for the gateway with the
 * host-side MAC, by turning the request into a reply in place and handing it
 * back to the endpoint (to_endpoint: straight into a pod's netns, through the
 * device to a VM). Other ARP (replies to the host's own
 * requests, probes) goes to the host stack. A sender that claims another
 * MAC or IP is dropped as spoofed. An L3 endpoint (netkit L3: IFF_NOARP,
 * all-zero MACs) never ARPs: whatever ARP it sends is crafted, and dropped. */
static __always_inline int handle_arp(struct __sk_buff *skb, struct pkt *p,
				      const struct endpoint_info *ep)
{
	struct arp_eth *arp = p->arp;

	if (ep->flags & EP_F_L3) /* an L3 device has no link-layer addresses to resolve */
		return drop(skb, ep->id, DROP_UNSUPPORTED_L3);
	if (arp->ar_hrd != bpf_htons(ARPHRD_ETHER) || arp->ar_pro != bpf_htons(ETH_P_IP) ||
	    arp->ar_hln != ETH_ALEN || arp->ar_pln != 4)
		return drop(skb, ep->id, DROP_MALFORMED);
	if (!mac_equal(arp->ar_sha, ep->mac) || !mac_equal(p->eth->h_source, ep->mac))
		return drop(skb, ep->id, DROP_SPOOFED_MAC);
	if (arp->ar_sip != ep->ip && arp->ar_sip != 0)
		return drop(skb, ep->id, DROP_SPOOFED_IP);
	if (arp->ar_op != bpf_htons(ARPOP_REQUEST) || arp->ar_tip != gateway_ip)
		return TC_ACT_OK;

	__be32 sip = arp->ar_sip;

	arp->ar_op = bpf_htons(ARPOP_REPLY);
	mac_copy(arp->ar_tha, arp->ar_sha);
	arp->ar_tip = sip;
	mac_copy(arp->ar_sha, ep->host_mac);
	arp->ar_sip = gateway_ip;
	mac_copy(p->eth->h_dest, p->eth->h_source);
	mac_copy(p->eth->h_source, ep->host_mac);
	return to_endpoint(skb, ep);
}

#endif
