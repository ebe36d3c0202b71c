//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sock.c: cgroup sock_addr programs, the socket-level load balancer for the
 * node's own processes and hostNetwork pods (lib/sock.h explains it). The
 * agent attaches them to its cgroup2 root (--cgroup-root) with pinned links.
 *   lk_sock_connect4:     connect(): frontend -> backend (TCP, UDP)
 *   lk_sock_sendmsg4:     sendmsg() with an address (unconnected UDP)
 *   lk_sock_recvmsg4:     recvmsg() source: backend -> frontend (UDP)
 *   lk_sock_getpeername4: getpeername(): backend -> frontend
 *   lk_sock_*6:           the same for IPv6 sockets: IPv6 ClusterIPs, and
 *                         IPv4 services by their IPv4-mapped addresses
 *                         (dual-stack sockets) */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/consts.h"
#include "lib/sock.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("cgroup/connect4")
int lk_sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock_fwd(ctx, LK_AF_INET, SOCK_HOOK_CONNECT4);
}

SEC("cgroup/sendmsg4")
int lk_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_fwd(ctx, LK_AF_INET, SOCK_HOOK_SENDMSG4);
}

SEC("cgroup/recvmsg4")
int lk_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return sock_rev(ctx, LK_AF_INET, SOCK_HOOK_RECVMSG4);
}

SEC("cgroup/getpeername4")
int lk_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return sock_rev(ctx, LK_AF_INET, SOCK_HOOK_GETPEERNAME4);
}

SEC("cgroup/connect6")
int lk_sock_connect6(struct bpf_sock_addr *ctx)
{
	return sock_fwd(ctx, LK_AF_INET6, SOCK_HOOK_CONNECT6);
}

SEC("cgroup/sendmsg6")
int lk_sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock_fwd(ctx, LK_AF_INET6, SOCK_HOOK_SENDMSG6);
}

SEC("cgroup/recvmsg6")
int lk_sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return sock_rev(ctx, LK_AF_INET6, SOCK_HOOK_RECVMSG6);
}

SEC("cgroup/getpeername6")
int lk_sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return sock_rev(ctx, LK_AF_INET6, SOCK_HOOK_GETPEERNAME6);
}
