/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Checksum helpers. */
#ifndef LK_CSUM_H
#define LK_CSUM_H

#include <linux/ip.h>
#include <bpf/bpf_endian.h>

/* Decrement the IPv4 TTL and patch the header checksum incrementally
 * (RFC 1624), as the kernel's ip_decrease_ttl does. */
static __always_inline void ipv4_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	iph->ttl--;
}

#endif
