/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Checksum helpers. */
#ifndef LK_CSUM_H
#define LK_CSUM_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* Decrement the IPv4 TTL and patch the header checksum incrementally
 * (RFC 1624), as the kernel's ip_decrease_ttl does. */
static __always_inline void ipv4_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	iph->ttl--;
}

/* csum_fold folds a bpf_csum_diff sum into a header checksum. */
static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* ipv4_csum is the header checksum over the 20-byte IPv4 header (no
 * options) at iph, checksum field included: what to store with the field 0,
 * and 0 over a header whose checksum is valid. */
static __always_inline __u16 ipv4_csum(void *iph)
{
	return csum_fold(bpf_csum_diff(0, 0, (__be32 *)iph, sizeof(struct iphdr), 0));
}

#endif
