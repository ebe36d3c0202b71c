/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sock.h: socket-level service load balancing for the node's own processes
 * (and hostNetwork pods), which no packet hook of ours sees: cgroup sock_addr
 * programs rewrite the address a socket call carries, as Cilium's socket LB
 * (bpf_sock.c) does.
 *
 *   connect (TCP, connected UDP): a frontend address becomes a backend's,
 *     chosen once per socket by lb_select (lb_select.h: the packet path's
 *     Maglev tables and ClientIP affinity, on the same maps);
 *   sendmsg (unconnected UDP): the same, per datagram (stable per socket and
 *     frontend: the hash input is the socket cookie);
 *   recvmsg (UDP) and getpeername: the backend address the kernel reports
 *     becomes the frontend again, from lk_sock_revnat (socket cookie +
 *     backend -> frontend), written by the forward hooks.
 *
 * Frontends: ClusterIP; NodePort on one of the node's addresses (the
 * frontends pkg/service writes) or on loopback (127.0.0.0/8: a hostPort's
 * own loopback hostIP first, then looked up as sock_node_addr4). The flow hash's "client" is sock_node_addr4 (what a
 * backend sees as the source): ClientIP affinity treats all of the node's
 * processes as one client. No backend: the call fails with ECONNREFUSED
 * (bpf_set_retval), counted as SOCK_STAT_NO_BACKEND. A LoadBalancer ingress
 * IP with loadBalancerSourceRanges that leave the node out: EPERM, counted as
 * SOCK_STAT_SRC_RANGE (pods reach it through the packet path, lb4/lb6, which
 * checks their own address the same way).
 *
 * Only sockets of the node's network namespace are translated
 * (sock_netns_cookie; 0 translates nothing), whatever cgroup they sit in: a
 * process of another netns in the attached cgroup keeps its addresses.
 *
 * Address families: one code path over struct sock_ep (family + address +
 * port). An IPv6 socket naming an IPv4 service by its IPv4-mapped address
 * (::ffff:a.b.c.d, dual-stack sockets) is load-balanced in the IPv4 tables
 * and gets the backend the same way; one naming an IPv6 ClusterIP
 * (lb6_maps.h) gets an IPv6 backend (sock_pick6). Only the frontend and
 * backend lookups and the revnat check differ per family (sock_svc,
 * sock_pick, sock_frontend_ok). IPv6 NodePorts and external addresses are
 * looked up after ClusterIPs as for IPv4 (the node's IPv6 loopback does not
 * stand for its NodePorts); IPv6 ClientIP affinity has one client for the
 * whole node as for IPv4, keyed by the unspecified address. */
#ifndef LK_SOCK_H
#define LK_SOCK_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "lb_maps.h"
#include "lb6_maps.h"
#include "lb_select.h"

#define LK_AF_INET 2
#define LK_AF_INET6 10
#define LK_ECONNREFUSED 111
#define LK_EPERM 1
#define LK_SOCK_REVNAT 65536

/* Set at load time (pkg/datapath SockLB). */
volatile const __u64 sock_netns_cookie; /* the node's netns; 0: translate nothing */
volatile const __be32 sock_node_addr4; /* NodePort frontend for loopback; the LB "client" */

/* An address and port of either family, network byte order. */
struct sock_ep {
	__u32 family; /* LK_AF_INET, LK_AF_INET6 */
	union {
		__be32 v4;
		__be32 v6[4];
	};
	__be16 port;
	__u16 pad;
};

/* lk_sock_revnat key: a socket and the backend it was sent to. */
struct sock_revnat_key {
	__u64 cookie; /* bpf_get_socket_cookie */
	struct sock_ep backend;
};

/* lk_sock_revnat value: the frontend the socket asked for. */
struct sock_revnat_value {
	struct sock_ep frontend;
	__u32 frontend_id; /* checked against lk_lb_revnat: a replaced service is not reported */
	__u32 pad;
};

/* Backend -> frontend per socket, for recvmsg and getpeername. LRU: an entry
 * outlives its socket until evicted (cookies are never reused). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_SOCK_REVNAT);
	__type(key, struct sock_revnat_key);
	__type(value, struct sock_revnat_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_sock_revnat SEC(".maps");

/* Per-hook counters: [hook * SOCK_STAT_MAX + stat], per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SOCK_HOOK_MAX * SOCK_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_sock_stats SEC(".maps");

static __always_inline void sock_stat(__u32 hook, __u32 stat)
{
	__u32 k = hook * SOCK_STAT_MAX + stat;
	__u64 *v = bpf_map_lookup_elem(&lk_sock_stats, &k);

	if (v)
		(*v)++;
}

/* sock_ctx_get reads the call's address (connect/sendmsg: the destination;
 * recvmsg: the source; getpeername: the peer). family is a constant per
 * program, so only its branch is compiled in (the verifier refuses the other
 * family's ctx fields). */
static __always_inline void sock_ctx_get(const struct bpf_sock_addr *ctx, __u32 family, struct sock_ep *ep)
{
	ep->family = family;
	if (family == LK_AF_INET) {
		ep->v4 = ctx->user_ip4;
	} else {
		ep->v6[0] = ctx->user_ip6[0];
		ep->v6[1] = ctx->user_ip6[1];
		ep->v6[2] = ctx->user_ip6[2];
		ep->v6[3] = ctx->user_ip6[3];
	}
	ep->port = (__be16)ctx->user_port;
}

static __always_inline void sock_ctx_set(struct bpf_sock_addr *ctx, __u32 family, const struct sock_ep *ep)
{
	if (family == LK_AF_INET) {
		ctx->user_ip4 = ep->v4;
	} else {
		ctx->user_ip6[0] = ep->v6[0];
		ctx->user_ip6[1] = ep->v6[1];
		ctx->user_ip6[2] = ep->v6[2];
		ctx->user_ip6[3] = ep->v6[3];
	}
	ctx->user_port = ep->port;
}

/* sock_ep_v4 returns ep's IPv4 address (IPv4, or IPv4-mapped IPv6) in *v4;
 * 0 when it has none. */
static __always_inline int sock_ep_v4(const struct sock_ep *ep, __be32 *v4)
{
	if (ep->family == LK_AF_INET) {
		*v4 = ep->v4;
		return 1;
	}
	if (ep->v6[0] || ep->v6[1] || ep->v6[2] != bpf_htonl(0xffff))
		return 0;
	*v4 = ep->v6[3];
	return 1;
}

/* sock_ep_set_v4 makes ep the IPv4 address v4 in family (IPv6: mapped). */
static __always_inline void sock_ep_set_v4(struct sock_ep *ep, __u32 family, __be32 v4, __be16 port)
{
	ep->family = family;
	if (family == LK_AF_INET) {
		ep->v4 = v4;
	} else {
		ep->v6[0] = 0;
		ep->v6[1] = 0;
		ep->v6[2] = bpf_htonl(0xffff);
		ep->v6[3] = v4;
	}
	ep->port = port;
}

/* sock_mine says whether the socket is a TCP/UDP socket of the node's netns. */
static __always_inline int sock_mine(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 0;
	return sock_netns_cookie && bpf_get_netns_cookie(ctx) == sock_netns_cookie;
}

/* sock_svc finds the frontend ep names: a ClusterIP, else a NodePort on the
 * node's address (loopback: sock_node_addr4); for an IPv6 address that is
 * not IPv4-mapped, the same in the IPv6 table (*v4 stays 0). */
static __always_inline struct lb_svc_value *sock_svc(const struct sock_ep *ep, __u8 proto, __be32 *v4)
{
	struct lb_svc_key k = {};
	struct lb_svc_value *svc;

	if (!sock_ep_v4(ep, v4)) {
		struct lb_svc6_key k6 = {};

		__builtin_memcpy(k6.addr, ep->v6, 16);
		k6.port = bpf_ntohs(ep->port);
		k6.proto = proto;
		k6.scope = LB_SCOPE_CLUSTERIP;
		svc = bpf_map_lookup_elem(&lk_lb_svc6, &k6);
		if (svc)
			return svc;
		k6.scope = LB_SCOPE_NODEPORT; /* a NodePort or external address, as for IPv4 */
		return bpf_map_lookup_elem(&lk_lb_svc6, &k6);
	}
	k.addr = *v4;
	k.port = bpf_ntohs(ep->port);
	k.proto = proto;
	k.scope = LB_SCOPE_CLUSTERIP;
	svc = bpf_map_lookup_elem(&lk_lb_svc, &k);
	if (svc)
		return svc;
	k.scope = LB_SCOPE_NODEPORT;
	if ((bpf_ntohl(*v4) >> 24) == 127) {
		/* A hostPort on a loopback hostIP is its own frontend; any
		 * other loopback address stands for the node's NodePorts. */
		svc = bpf_map_lookup_elem(&lk_lb_svc, &k);
		if (svc)
			return svc;
		k.addr = sock_node_addr4;
	}
	return bpf_map_lookup_elem(&lk_lb_svc, &k);
}

static __always_inline int sock_v6_equal(const __u8 *a, const __be32 *b)
{
	__be32 w[4];

	__builtin_memcpy(w, a, 16);
	return w[0] == b[0] && w[1] == b[1] && w[2] == b[2] && w[3] == b[3];
}

/* sock_pick6 chooses the backend of IPv6 frontend svc for hash t (lb6.h's
 * choice: the node's affinity entry, else Maglev) and makes *be_ep it.
 * Returns 0 when there is none. */
static __always_inline int sock_pick6(const struct lb_svc_value *svc, const struct ct_key *t, struct sock_ep *be_ep)
{
	struct lb_affinity6_key ak = { .frontend_id = svc->frontend_id }; /* client: the node (::) */
	struct lb_backend6_value *be = 0;
	struct lb_affinity_value *av;
	__u64 now = bpf_ktime_get_ns();
	__u32 id = 0;

	if (svc->flags & LB_SVC_F_AFFINITY) {
		av = bpf_map_lookup_elem(&lk_lb_affinity6, &ak);
		if (av && now - av->last_used <= (__u64)svc->affinity_seconds * 1000000000ULL) {
			id = av->backend_id;
			be = bpf_map_lookup_elem(&lk_lb_backends6, &id);
			if (be && (be->frontend_id != svc->frontend_id || be->state != LB_BACKEND_ACTIVE))
				be = 0;
			if (be) {
				av->last_used = now;
				lb_stat(LB_STAT_AFFINITY);
			}
		}
	}
	if (!be) {
		id = lb_maglev_pick(svc, lb_flow_hash(t));
		be = id ? bpf_map_lookup_elem(&lk_lb_backends6, &id) : 0;
		if (!be || be->frontend_id != svc->frontend_id)
			return 0;
		if (svc->flags & LB_SVC_F_AFFINITY) {
			struct lb_affinity_value nv = { .last_used = now, .backend_id = id };

			bpf_map_update_elem(&lk_lb_affinity6, &ak, &nv, BPF_ANY);
		}
	}
	be_ep->family = LK_AF_INET6;
	__builtin_memcpy(be_ep->v6, be->addr, 16);
	be_ep->port = bpf_htons(be->port);
	return 1;
}

/* sock_fold16 folds a socket cookie into the flow hash's source port. */
static __always_inline __be16 sock_fold16(__u64 c)
{
	__u32 x = (__u32)c ^ (__u32)(c >> 32);

	return (__be16)(x ^ (x >> 16));
}

/* sock_fwd translates a connect/sendmsg to a frontend into its backend.
 * Returns 1 (allow: translated or not a frontend) or 0 (refuse, errno set). */
static __always_inline int sock_fwd(struct bpf_sock_addr *ctx, __u32 family, __u32 hook)
{
	struct sock_revnat_key rk = {};
	struct sock_revnat_value rv = {};
	struct lb_backend_value *be = 0;
	struct lb_svc_value *svc;
	struct sock_ep dst = {};
	struct ct_key t = {};
	__be32 dst4 = 0;
	__u8 proto;

	if (!sock_mine(ctx))
		return 1;
	proto = ctx->protocol;
	sock_ctx_get(ctx, family, &dst);
	svc = sock_svc(&dst, proto, &dst4);
	if (!svc)
		return 1;
	/* loadBalancerSourceRanges: the node's processes come from the node,
	 * which pkg/service lets in by listing the ingress IP itself among
	 * the frontend's ranges when a range holds a node address (as
	 * kube-proxy's allowFromNode does); else the call fails. */
	if (svc->flags & LB_SVC_F_SRC_RANGE) {
		int v6 = !sock_ep_v4(&dst, &dst4);

		if (!lb_src_range_ok(svc, v6, v6 ? (const void *)dst.v6 : (const void *)&dst4)) {
			sock_stat(hook, SOCK_STAT_SRC_RANGE);
			bpf_set_retval(-LK_EPERM);
			return 0;
		}
	}
	rk.cookie = bpf_get_socket_cookie(ctx);
	t.saddr = sock_node_addr4;
	t.daddr = dst4;
	t.sport = sock_fold16(rk.cookie);
	t.dport = dst.port;
	t.proto = proto;
	if (family == LK_AF_INET6 && !sock_ep_v4(&dst, &dst4)) { /* an IPv6 frontend */
		t.daddr = dst.v6[0] ^ dst.v6[1] ^ dst.v6[2] ^ dst.v6[3];
		rv.frontend = dst;
		if (!sock_pick6(svc, &t, &rk.backend)) {
			sock_stat(hook, SOCK_STAT_NO_BACKEND);
			bpf_set_retval(-LK_ECONNREFUSED);
			return 0;
		}
		rv.frontend_id = svc->frontend_id;
		bpf_map_update_elem(&lk_sock_revnat, &rk, &rv, BPF_ANY);
		sock_ctx_set(ctx, family, &rk.backend);
		sock_stat(hook, SOCK_STAT_TRANSLATED);
		return 1;
	}
	lb_select(svc, &t, &be);
	if (!be) {
		sock_stat(hook, SOCK_STAT_NO_BACKEND);
		bpf_set_retval(-LK_ECONNREFUSED);
		return 0;
	}
	/* Keys and values hold IPv4 addresses as IPv4, whatever the socket's
	 * family: an IPv6 socket's datagram to a mapped address takes the
	 * IPv4 sendmsg hook, its replies the IPv6 recvmsg hook. */
	sock_ep_set_v4(&rk.backend, LK_AF_INET, be->addr, bpf_htons(be->port));
	sock_ep_set_v4(&rv.frontend, LK_AF_INET, dst4, dst.port);
	rv.frontend_id = svc->frontend_id;
	bpf_map_update_elem(&lk_sock_revnat, &rk, &rv, BPF_ANY);
	sock_ep_set_v4(&dst, family, be->addr, bpf_htons(be->port));
	sock_ctx_set(ctx, family, &dst);
	sock_stat(hook, SOCK_STAT_TRANSLATED);
	return 1;
}

/* sock_rev reports a backend address (recvmsg source, getpeername) as the
 * frontend the socket asked for. Always allows (these hooks cannot refuse). */
static __always_inline int sock_rev(struct bpf_sock_addr *ctx, __u32 family, __u32 hook)
{
	struct sock_revnat_key rk = {};
	struct sock_revnat_value *rv;
	struct lb_revnat_value *rn;
	struct sock_ep ep = {};
	__be32 be4 = 0, fe4 = 0;

	if (!sock_mine(ctx))
		return 1;
	sock_ctx_get(ctx, family, &ep);
	rk.cookie = bpf_get_socket_cookie(ctx);
	if (family == LK_AF_INET6 && !sock_ep_v4(&ep, &be4)) {
		/* An IPv6 backend: the frontend must still be the one asked for. */
		struct lb_revnat6_value *rn6;

		rk.backend = ep;
		rv = bpf_map_lookup_elem(&lk_sock_revnat, &rk);
		if (!rv)
			return 1;
		rn6 = bpf_map_lookup_elem(&lk_lb_revnat6, &rv->frontend_id);
		if (!rn6 || bpf_htons(rn6->port) != rv->frontend.port || !sock_v6_equal(rn6->addr, rv->frontend.v6)) {
			bpf_map_delete_elem(&lk_sock_revnat, &rk);
			return 1;
		}
		ep = rv->frontend;
		sock_ctx_set(ctx, family, &ep);
		sock_stat(hook, SOCK_STAT_TRANSLATED);
		return 1;
	}
	if (!sock_ep_v4(&ep, &be4))
		return 1;
	sock_ep_set_v4(&rk.backend, LK_AF_INET, be4, ep.port);
	rv = bpf_map_lookup_elem(&lk_sock_revnat, &rk);
	if (!rv)
		return 1;
	/* The frontend is still the one the socket asked for (IDs are reused
	 * once a service is deleted; a loopback NodePort's is the node's). */
	rn = bpf_map_lookup_elem(&lk_lb_revnat, &rv->frontend_id);
	if (!rn || bpf_htons(rn->port) != rv->frontend.port || !sock_ep_v4(&rv->frontend, &fe4) ||
	    (rn->addr != fe4 && rn->addr != sock_node_addr4)) {
		bpf_map_delete_elem(&lk_sock_revnat, &rk);
		return 1;
	}
	sock_ep_set_v4(&ep, family, fe4, rv->frontend.port);
	sock_ctx_set(ctx, family, &ep);
	sock_stat(hook, SOCK_STAT_TRANSLATED);
	return 1;
}

#endif
