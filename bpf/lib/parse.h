/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Header parsing with bounds checks the verifier accepts. */
#ifndef LK_PARSE_H
#define LK_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"

/* ARP for IPv4 over Ethernet (the fixed-size form of struct arphdr). */
struct arp_eth {
	__be16 ar_hrd;
	__be16 ar_pro;
	__u8 ar_hln;
	__u8 ar_pln;
	__be16 ar_op;
	__u8 ar_sha[ETH_ALEN];
	__be32 ar_sip;
	__u8 ar_tha[ETH_ALEN];
	__be32 ar_tip;
} __attribute__((packed));

/* A parsed packet: pointers into the linear data, valid until the packet
 * is changed by a helper that may move it. */
struct pkt {
	void *data;
	void *data_end;
	struct ethhdr *eth;
	struct iphdr *ip4; /* set when eth->h_proto is IPv4 and the header is sane */
	struct ipv6hdr *ip6; /* set when eth->h_proto is IPv6 and the fixed header is whole */
	struct arp_eth *arp; /* set for ARP */
};

/* parse_eth fills p from [data, data_end). Returns 0, or -1 when the frame is
 * too short or the IPv4 header (IPv6: the fixed header) is malformed. IPv6
 * extension headers are walked later (ip6_ext.h). */
static __always_inline int parse_eth(struct pkt *p, void *data, void *data_end)
{
	p->data = data;
	p->data_end = data_end;
	p->ip4 = 0;
	p->ip6 = 0;
	p->arp = 0;
	p->eth = data;
	if ((void *)(p->eth + 1) > data_end)
		return -1;

	if (p->eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(p->eth + 1);

		if ((void *)(iph + 1) > data_end)
			return -1;
		if (iph->version != 4 || iph->ihl < 5)
			return -1;
		p->ip4 = iph;
	} else if (p->eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(p->eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
			return -1;
		p->ip6 = ip6;
	} else if (p->eth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_eth *arp = (void *)(p->eth + 1);

		if ((void *)(arp + 1) > data_end)
			return -1;
		p->arp = arp;
	}
	return 0;
}

static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

/* is_multicast_ether: group bit set (broadcast is a multicast address too). */
static __always_inline int is_multicast_ether(const __u8 *mac)
{
	return mac[0] & 1;
}

/* is_multicast_or_bcast_ipv4: 224.0.0.0/4 or 255.255.255.255. */
static __always_inline int is_multicast_or_bcast_ipv4(__be32 addr)
{
	return (bpf_ntohl(addr) >> 28) == 0xe || addr == 0xffffffff;
}

static __always_inline int is_vlan_proto(__be16 proto)
{
	return proto == bpf_htons(LK_ETH_P_8021Q) || proto == bpf_htons(LK_ETH_P_8021AD);
}

static __always_inline void mac_copy(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, ETH_ALEN);
}

#endif
