/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb.h: service load balancing (Kubernetes ClusterIP and NodePort), as
 * Cilium's kube-proxy replacement does it, on the maps pkg/service fills
 * (service.Update; the structs below mirror its Go structs byte for byte).
 *
 * Forward path (lb_forward): a packet to a frontend (lk_lb_svc: VIP or node
 * address, port, protocol, scope) keeps the backend its conntrack "service"
 * entry (struct ct_key.flags CT_KEY_SERVICE, the client -> frontend tuple)
 * recorded while that backend ID is still in lk_lb_backends, whatever its
 * State (terminating backends keep their flows). A new flow, or one whose
 * backend is gone, takes the client's affinity entry (ClientIP affinity,
 * while fresh and the backend active) or Maglev[flow hash % size]. The
 * packet is DNATed to the backend (checksums patched incrementally) and a
 * flow entry on the translated tuple records how replies are translated
 * back: CT_F_REVNAT (source -> frontend via lk_lb_revnat) and, when this node
 * also rewrote the source, CT_F_SNAT (destination -> original client):
 *   - hairpin: the client is its own backend: source -> LB_HAIRPIN_IP
 *     (169.254.42.1, as Cilium), which the pod routes back to us;
 *   - NodePort (on the uplink) to a backend on another node: source -> the
 *     node address, so the reply comes back through this node
 *     (externalTrafficPolicy Cluster). To a local backend the client
 *     address is kept. A local pod reaching a NodePort on this node's
 *     address (from_pod looks NodePort frontends up after ClusterIP ones)
 *     keeps its address too: its replies come back here anyway.
 * SNAT source ports (hairpin: the client's first, if free): one of
 * LB_SNAT_TRIES hashed ports in the load-time range [lb_snat_port_min,
 * lb_snat_port_max] (default 61000-65535: above the NodePort range and the
 * node's ephemeral range) whose translated tuple is free; none free ->
 * DROP_NAT_NO_PORT.
 *
 * Reply path (lb_rev_nat): a packet that matches a flow entry in the reply
 * direction is translated back: on the uplink before the frontend lookup (a
 * reply to an SNAT port that equals a NodePort is a reply, not a new
 * connection), from pods for packets that are not for a frontend. Local client: the
 * backend's from_pod does it (or from_uplink when the backend is remote);
 * NodePort SNAT: from_uplink.
 *
 * ICMP errors about a load-balanced flow (lb_icmp_rev_nat) are translated
 * back the same way.
 *
 * No backend: TCP gets a reset, UDP an ICMP port unreachable, both sent back
 * where the packet came from and counted as DROP_NO_BACKEND. A traffic
 * policy Local frontend (LB_SVC_F_LOCAL: its table holds this node's
 * endpoints only) without one drops silently, DROP_NO_LOCAL_BACKEND.
 *
 * External addresses (externalIPs, LoadBalancer ingress IPs) are NodePort
 * scope frontends on that address and the service port (LB_SVC_F_EXTERNAL):
 * to a remote backend they are source-NATed to the node's own address
 * towards it (lb_node_src), not the external address. With
 * externalTrafficPolicy Local the NodePort scope frontend is Local and a
 * ClusterIP scope twin on the same address and port holds every endpoint:
 * pods (from_pod looks ClusterIP scope up first) and the node's processes
 * (the socket LB) reach the Service cluster-wide, as kube-proxy lets them;
 * only what arrives on the uplink is kept local, with its source address.
 *
 * loadBalancerSourceRanges: a LoadBalancer ingress IP's frontends (both
 * scopes) flagged LB_SVC_F_SRC_RANGE take packets only from the sources in
 * their lk_lb_src_range prefixes (lb_src_range_ok, lb_maps.h): checked on
 * every packet, from the wire and from pods, before the backend choice;
 * others are dropped silently, DROP_LB_SRC_RANGE (kube-proxy's firewall
 * chain drops them too). ClusterIPs, NodePorts and externalIPs are never
 * flagged (kube-proxy applies the ranges to LoadBalancer IPs only).
 *
 * Maglev tables: lk_lb_maglev is a hash of maps, frontend ID -> an array of
 * backend IDs of exactly that frontend's size (BPF_F_INNER_MAP lets the inner
 * arrays differ in size). Chosen over one big array with per-frontend
 * offsets because sizes vary per frontend (251 .. 100 x 2^k slots, see
 * service.MaglevSize): a big array would need an offset allocator with
 * fragmentation and a fixed, preallocated worst-case size (10,000 services
 * x a few backends is ~4 M slots, but one 1,000-backend service alone is
 * 100 k), while per-frontend arrays cost exactly their size and a table is
 * replaced atomically (fill a new array, swap it into the outer map), so a
 * lookup never sees half a table. The cost is one map creation per table
 * change (measured in pkg/datapath: see services_test.go). */
#ifndef LK_LB_H
#define LK_LB_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "ct.h"
#include "events.h"
#include "fib.h"
#include "lb_maps.h"
#include "lb_select.h"
#include "lb_reply.h"

/* lb_rewrite4 rewrites the source (src=1) or destination address and port of
 * a TCP/UDP packet, patching the IPv4 and L4 checksums incrementally. l4off
 * 0: a later fragment (frag.h), which has no L4 header: only the address
 * and the IPv4 checksum (its first fragment carried ports and L4 checksum). */
static __always_inline int lb_rewrite4(struct __sk_buff *skb, __u32 l4off, __u8 proto, int src,
				       __be32 old_addr, __be32 new_addr, __be16 old_port, __be16 new_port)
{
	__u32 addr_off = ETH_HLEN + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));
	__u32 port_off = l4off + (src ? 0 : 2);
	__u32 csum_off = l4off + (proto == IPPROTO_TCP ? 16 : 6);
	__u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (old_addr != new_addr) {
		if (l4off && bpf_l4_csum_replace(skb, csum_off, old_addr, new_addr, BPF_F_PSEUDO_HDR | mangled | 4) < 0)
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_addr, new_addr, 4) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &new_addr, 4, 0) < 0)
			return -1;
	}
	if (l4off && old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, new_port, mangled | 2) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0) < 0)
			return -1;
	}
	return 0;
}

/* lb_icmp_echo_rewrite rewrites the source (src=1) or destination address
 * and the identifier of an ICMP echo request or reply (masq.h): the ICMP
 * checksum covers no pseudo-header, only the identifier changes it. */
static __always_inline int lb_icmp_echo_rewrite(struct __sk_buff *skb, __u32 l4off, int src, __be32 old_addr,
						__be32 new_addr, __be16 old_id, __be16 new_id)
{
	__u32 addr_off = ETH_HLEN + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));

	if (old_addr != new_addr &&
	    (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_addr, new_addr, 4) < 0 ||
	     bpf_skb_store_bytes(skb, addr_off, &new_addr, 4, 0) < 0))
		return -1;
	if (old_id != new_id &&
	    (bpf_l4_csum_replace(skb, l4off + 2, old_id, new_id, 2) < 0 ||
	     bpf_skb_store_bytes(skb, l4off + 4, &new_id, 2, 0) < 0))
		return -1;
	return 0;
}

/* lb_snat_flow_in creates the flow entry of a source-NATed flow with a free
 * source port, for either family: ft is the translated tuple (a struct
 * ct_key, or a ct6_key when v6) and sport its source port field. keep
 * (network order; 0: none) is tried first if its tuple is free, else one of
 * LB_SNAT_TRIES ports in [lb_snat_port_min, lb_snat_port_max] picked from
 * the original flow's hash h; mirror (NULL: none) takes each too: an ICMP
 * echo's identifier is both ports of its tuple (masq.h). Each is checked against the live entries
 * (ct_create_in BPF_NOEXIST), so two flows never share a translated tuple.
 * NodePort SNAT to the node's address keeps no client port: it may be in the
 * node's ephemeral range, whose sockets conntrack does not see (hairpin's
 * address is no address of the node's sockets: the client's port is kept
 * there). Returns the port (network order), 0 if none was free. */
static __always_inline __be16 lb_snat_flow_in(__u8 v6, void *ft, __be16 *sport, __be16 *mirror,
					      const struct ct_entry *fe, __u32 h, __be16 keep)
{
	__u32 lo = lb_snat_port_min, hi = lb_snat_port_max;
	__u32 span = hi >= lo ? hi - lo + 1 : 1;

	*sport = keep;
	if (keep && !ct_create_in(v6, ft, fe, BPF_NOEXIST))
		return keep;
	for (int i = 0; i < LB_SNAT_TRIES; i++) {
		__u32 p = lo + (h + i * 7919) % span;

		*sport = bpf_htons(p);
		if (mirror)
			*mirror = *sport;
		if (!ct_create_in(v6, ft, fe, BPF_NOEXIST))
			return *sport;
	}
	return 0;
}

/* lb_snat_kind decides whether a new flow to a backend is source-NATed, the
 * same for both families (lb_forward, lb6_forward): self, the client is its
 * own backend; from_ep, the client is a local endpoint (NULL: the wire);
 * be_on_node, the backend is a local endpoint or the node's own address
 * (asked only for a NodePort flow from the wire). Returns the CT_F_* flags
 * of the SNAT, 0 for none, and counts the choice.
 *   - hairpin (a local endpoint reaching itself: its reply comes back
 *     through its own device). A client from the wire that is also the
 *     backend (a node reaching another node's NodePort whose endpoint it
 *     hosts) is NodePort SNATed: the hairpin address would not route back.
 *   - NodePort from the wire to a remote backend: the reply must come back
 *     through this node. To a local endpoint the client address is kept; to
 *     the node's own address (a hostNetwork endpoint) SNAT would make a
 *     martian: its stack's reply is translated back on the way out. A local
 *     endpoint's replies come back here anyway. */
static __always_inline __u16 lb_snat_kind(int self, __u8 scope, const struct endpoint_info *from_ep, int be_on_node)
{
	if (self && from_ep) {
		lb_stat(LB_STAT_HAIRPIN);
		return CT_F_SNAT | CT_F_HAIRPIN;
	}
	if (scope != LB_SCOPE_NODEPORT || from_ep)
		return 0;
	if (be_on_node) {
		lb_stat(LB_STAT_NODEPORT_LOCAL);
		return 0;
	}
	lb_stat(LB_STAT_NODEPORT_SNAT);
	return CT_F_SNAT | CT_F_NODEPORT;
}

static __always_inline __be16 lb_snat_flow(struct ct_key *ft, const struct ct_entry *fe, __u32 h, __be16 keep)
{
	return lb_snat_flow_in(0, ft, &ft->sport, 0, fe, h, keep);
}

/* lb_node_src returns in src (4 or 16 bytes) the node's source address
 * towards dst (the kernel's route to it: preferred source, else the
 * outgoing device's address); -1 when there is none. fib is scratch space
 * (IPv6 passes per-CPU memory: from_pod6's stack has no room). An external
 * address is no node address: a flow to it source-NATed to a remote backend
 * takes this one, so the backend's node routes the reply back here. */
static __always_inline int lb_node_src(struct __sk_buff *skb, struct bpf_fib_lookup *fib, __u8 v6, const void *dst,
				       void *src)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = v6 ? AF_INET6 : AF_INET;
	fib->ifindex = skb->ifindex;
	if (v6)
		__builtin_memcpy(fib->ipv6_dst, dst, 16);
	else
		__builtin_memcpy(&fib->ipv4_dst, dst, 4);
	if (bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH) !=
	    BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
	if (v6)
		__builtin_memcpy(src, fib->ipv6_src, 16);
	else
		__builtin_memcpy(src, &fib->ipv4_src, 4);
	return 0;
}

/* lb_pending holds the conntrack entries a new load-balanced flow needs
 * until the caller's policy has allowed the packet; lb_commit then creates
 * them. A packet policy drops leaves no state, so a denied pod spraying SYNs
 * at a ClusterIP cannot churn the shared LRU table and evict other pods' NAT
 * state. Source-NATed flows (hairpin, NodePort to a remote backend) create
 * theirs at once: their source port is allocated by creating the entry. */
struct lb_pending {
	struct ct_key sk; /* the service entry */
	struct ct_entry se;
	struct ct_key ft; /* the flow entry on the translated tuple */
	struct ct_entry fe;
	__u8 svc;
	__u8 flow;
	/* The packet is a reply lb_rev_nat translated back, of a flow policy
	 * allowed (CT_F_POLICY): policy judged the connection on the
	 * translated tuple, which the reply no longer carries. */
	__u8 allowed_reply;
};

/* Where a program keeps its lb_pending: too big for the BPF stack beside
 * the rest of from_pod, and a program runs to completion on its CPU. Not
 * pinned: scratch, not state. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_pending);
} lk_lb_pending SEC(".maps");

/* lb_pending_get returns this CPU's lb_pending, emptied (NULL should the
 * lookup fail: lb4 then creates entries at once, as without policy). */
static __always_inline struct lb_pending *lb_pending_get(void)
{
	__u32 zero = 0;
	struct lb_pending *p = bpf_map_lookup_elem(&lk_lb_pending, &zero);

	if (p) {
		p->svc = 0;
		p->flow = 0;
		p->allowed_reply = 0;
	}
	return p;
}

/* lb_commit creates what lb4 left pending in p, after the packet passed
 * policy. A flow entry policy created meanwhile for the same tuple (a new
 * connection it tracks, CT_F_POLICY) gets what replies need added. */
static __always_inline void lb_commit(const struct lb_pending *p)
{
	struct ct_entry *fe;

	if (!p)
		return;
	if (p->svc)
		ct_create4(&p->sk, &p->se);
	if (!p->flow)
		return;
	fe = bpf_map_lookup_elem(&lk_ct4, &p->ft);
	if (fe && !ct_expired(fe, p->ft.proto, ct_now())) {
		fe->rev_nat_id = p->fe.rev_nat_id;
		fe->nat_addr = p->fe.nat_addr;
		fe->nat_port = p->fe.nat_port;
		fe->flags |= p->fe.flags;
		return;
	}
	ct_create4(&p->ft, &p->fe);
}

/* lb_forward load-balances a packet to frontend svc (tuple t). Returns
 * LB_CONTINUE with the packet translated, or a TC verdict. A new flow's
 * entries go to pend (when given) for lb_commit. */
static __always_inline int lb_forward(struct __sk_buff *skb, const struct ct_key *t, __u8 tcpf,
				      const struct lb_svc_value *svc, __u8 scope, __u32 l4off, __u16 tot_len,
				      __u32 ihl, const struct endpoint_info *ep, struct lb_pending *pend)
{
	struct ct_key sk = *t;
	struct ct_key ft = {};
	struct ct_entry *se = 0, *fe = 0;
	struct lb_backend_value *be = 0;
	__be32 snat_addr = 0;
	__be16 snat_port = 0;
	__u32 bid = 0;
	__u16 snat_flags = 0;
	int res;

	sk.flags = CT_KEY_SERVICE;
	res = ct_lookup4(&sk, tcpf, &se);
	if (res == CT_ESTABLISHED) {
		bid = se->backend_id;
		be = lb_backend(bid, svc->frontend_id);
		if (be) {
			lb_stat(LB_STAT_CT_HIT);
			if (se->flags & CT_F_SNAT) {
				snat_addr = se->nat_addr;
				snat_port = se->nat_port;
				snat_flags = se->flags & (CT_F_SNAT | CT_F_HAIRPIN | CT_F_NODEPORT);
			}
		} else {
			lb_stat(LB_STAT_RESELECT);
		}
	}
	if (!be) {
		struct ct_entry ne = {};

		bid = lb_select(svc, t, &be);
		if (!be) {
			res = lb_no_backend_drop(skb, svc, l4off, ep ? ep->id : 0);
			if (res != LB_CONTINUE)
				return res;
			return lb_no_backend(skb, t, l4off, tot_len, ihl, ep);
		}
		lb_stat(LB_STAT_NEW_FLOW);
		ft.saddr = t->saddr;
		ft.daddr = be->addr;
		ft.sport = t->sport;
		ft.dport = bpf_htons(be->port);
		ft.proto = t->proto;
		/* Hairpin (169.254.42.1) or NodePort SNAT (lb_snat_kind). */
		snat_flags = lb_snat_kind(be->addr == t->saddr, scope, ep,
					  scope == LB_SCOPE_NODEPORT && !ep &&
						  (bpf_map_lookup_elem(&lk_endpoints, &be->addr) || be->addr == t->daddr));
		if (snat_flags & CT_F_HAIRPIN) {
			snat_addr = bpf_htonl(LB_HAIRPIN_IP);
		} else if (snat_flags) {
			struct bpf_fib_lookup fib;

			snat_addr = t->daddr;
			if ((svc->flags & LB_SVC_F_EXTERNAL) && lb_node_src(skb, &fib, 0, &be->addr, &snat_addr) < 0) {
				lb_count_drop(skb, ep ? ep->id : 0, DROP_FIB_FAILED);
				return TC_ACT_SHOT;
			}
		}
		if (snat_flags) {
			struct ct_entry nf = {
				.rev_nat_id = svc->frontend_id,
				.nat_addr = t->saddr,
				.nat_port = t->sport,
				.flags = CT_F_REVNAT | snat_flags,
			};

			ft.saddr = snat_addr;
			snat_port = lb_snat_flow(&ft, &nf, lb_flow_hash(t),
						 (snat_flags & CT_F_HAIRPIN) ? t->sport : 0);
			if (!snat_port) {
				lb_count_drop(skb, ep ? ep->id : 0, DROP_NAT_NO_PORT);
				return TC_ACT_SHOT;
			}
		}
		ne.backend_id = bid;
		ne.rev_nat_id = svc->frontend_id;
		ne.nat_addr = snat_addr;
		ne.nat_port = snat_port;
		ne.flags = snat_flags;
		if (pend && !snat_flags) {
			pend->sk = sk;
			pend->se = ne;
			pend->svc = 1;
		} else {
			ct_create4(&sk, &ne);
		}
		se = 0;
	}
	/* The flow entry on the translated tuple (replies match it reversed). */
	ft.saddr = snat_flags ? snat_addr : t->saddr;
	ft.daddr = be->addr;
	ft.sport = snat_flags ? snat_port : t->sport;
	ft.dport = bpf_htons(be->port);
	ft.proto = t->proto;
	ft.flags = 0;
	ft.pad = 0;
	if (ct_lookup4(&ft, tcpf, &fe) == CT_NEW) {
		struct ct_entry nf = {
			.rev_nat_id = svc->frontend_id,
			.nat_addr = t->saddr,
			.nat_port = t->sport,
			.flags = CT_F_REVNAT | snat_flags,
		};

		if (pend) {
			pend->ft = ft;
			pend->fe = nf;
			pend->flow = 1;
		} else {
			ct_create4(&ft, &nf);
		}
	} else if (fe) {
		/* A flow entry policy created first: add what replies need. */
		if (!(fe->flags & CT_F_REVNAT) || fe->rev_nat_id != svc->frontend_id) {
			fe->rev_nat_id = svc->frontend_id;
			fe->flags |= CT_F_REVNAT;
		}
		/* The service entry lives as long as its flow: it sees no
		 * replies itself, so it takes the flow's TCP state. */
		if (se)
			se->flags = (se->flags & ~(CT_F_SEEN_REPLY | CT_F_CLOSING)) |
				    (fe->flags & (CT_F_SEEN_REPLY | CT_F_CLOSING));
	}
	if (lb_rewrite4(skb, l4off, t->proto, 0, t->daddr, be->addr, t->dport, bpf_htons(be->port)) < 0)
		return TC_ACT_SHOT;
	if (snat_flags && lb_rewrite4(skb, l4off, t->proto, 1, t->saddr, snat_addr, t->sport, snat_port) < 0)
		return TC_ACT_SHOT;
	return LB_CONTINUE;
}

/* lb_rev_nat translates a reply of a load-balanced flow back. Returns 1 when
 * the packet was rewritten, 0 when not, -1 on a failed rewrite. A rewritten
 * reply of a flow policy allowed sets pend->allowed_reply. */
static __always_inline int lb_rev_nat(struct __sk_buff *skb, const struct ct_key *t, __u8 tcpf, __u32 l4off,
				      struct lb_pending *pend)
{
	struct ct_entry *e = 0;
	struct lb_revnat_value *rn;
	struct ct_key inner;
	__u16 flags;
	__be32 nat_addr;
	__be16 nat_port;

	switch (ct_lookup4(t, tcpf, &e)) {
	case CT_REPLY:
		break;
	case CT_ESTABLISHED:
		/* A SYN straight to a backend on the very tuple a load-balanced
		 * flow used after DNAT: the client reused its port for a direct
		 * connection. That flow's reverse NAT must not apply to the new
		 * connection's replies (they would come "from the VIP" and be
		 * refused). A load-balanced SYN never gets here: its tuple is the
		 * frontend's and takes lb_forward. */
		if (e && (e->flags & CT_F_REVNAT) && t->proto == IPPROTO_TCP &&
		    (tcpf & (CT_TCP_SYN | CT_TCP_ACK)) == CT_TCP_SYN)
			e->flags &= ~CT_F_REVNAT;
		return 0;
	default:
		return 0;
	}
	if (!e)
		return 0;
	flags = e->flags;
	if (!(flags & (CT_F_REVNAT | CT_F_SNAT)))
		return 0;
	nat_addr = e->nat_addr;
	nat_port = e->nat_port;
	if (flags & CT_F_MASQ) {
		/* A masqueraded flow's reply (masq.h): its destination back to
		 * the endpoint. The tuple it then has may be the reply of a
		 * flow load balancing translated (a Service whose backend is
		 * outside the cluster): that flow's entry translates it on,
		 * below (its destination is restored already). */
		if (lb_rewrite4(skb, l4off, t->proto, 0, t->daddr, nat_addr, t->dport, nat_port) < 0)
			return -1;
		inner = *t;
		inner.daddr = nat_addr;
		inner.dport = nat_port;
		e = 0;
		if (ct_lookup4(&inner, tcpf, &e) != CT_REPLY || !e || !(e->flags & CT_F_REVNAT)) {
			lb_stat(LB_STAT_REVNAT);
			return 1;
		}
		t = &inner;
		flags = e->flags & ~CT_F_SNAT;
	}
	if (flags & CT_F_REVNAT) {
		rn = bpf_map_lookup_elem(&lk_lb_revnat, &e->rev_nat_id);
		if (rn && lb_rewrite4(skb, l4off, t->proto, 1, t->saddr, rn->addr, t->sport, bpf_htons(rn->port)) < 0)
			return -1;
	}
	if ((flags & CT_F_SNAT) && lb_rewrite4(skb, l4off, t->proto, 0, t->daddr, nat_addr, t->dport, nat_port) < 0)
		return -1;
	lb_stat(LB_STAT_REVNAT);
	if (pend && (flags & CT_F_POLICY))
		pend->allowed_reply = 1;
	return 1;
}

struct lb_icmp_err {
	__u8 type, code;
	__be16 check;
	__be32 unused;
	struct iphdr in; /* the quoted packet (what the client's flow carried) */
	__be16 sport, dport;
} __attribute__((packed));

#define LB_ICMP_TIME_EXCEEDED 11

/* lb_icmp_echo_unmasq translates an echo reply to a masqueraded echo
 * request (masq.h) back: to the endpoint's address and identifier. Returns
 * 1 when it did, 0 when the reply is no masquerade's, -1 to drop. */
static __always_inline int lb_icmp_echo_unmasq(struct __sk_buff *skb, __u32 l4off)
{
	struct ct_entry *e = 0;
	struct ct_key k = {};
	__be32 addrs[2];
	__u8 b[6];

	if (bpf_skb_load_bytes(skb, l4off, b, sizeof(b)) < 0 || b[0] != LK_ICMP_ECHOREPLY ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), addrs, sizeof(addrs)) < 0)
		return 0;
	k.saddr = addrs[0];
	k.daddr = addrs[1];
	__builtin_memcpy(&k.sport, &b[4], 2);
	k.dport = k.sport;
	k.proto = IPPROTO_ICMP;
	if (ct_lookup4(&k, 0, &e) != CT_REPLY || !e || !(e->flags & CT_F_MASQ))
		return 0;
	if (lb_icmp_echo_rewrite(skb, l4off, 0, addrs[1], e->nat_addr, k.sport, e->nat_port) < 0)
		return -1;
	lb_stat(LB_STAT_REVNAT);
	return 1;
}

/* lb_icmp_rev_nat translates an ICMP error (destination unreachable, time
 * exceeded) about a load-balanced flow back, as its replies are: the
 * quoted packet's destination becomes the frontend again (and its source
 * the client, for SNATed flows), the outer source the frontend when the
 * backend itself sent it. So a client learns "port unreachable" or "need to
 * fragment" for the address it used. The quoted L4 checksum is left alone
 * (receivers do not check it; for TCP it is not even quoted). An error about
 * a masqueraded flow (masq.h) gets only its quoted source and outer
 * destination back, and an echo reply to a masqueraded echo request its
 * destination and identifier (lb_icmp_echo_unmasq). Returns 1 when
 * rewritten, 0 when not, -1 on a failed rewrite. */
static __always_inline int lb_icmp_rev_nat(struct __sk_buff *skb, __u32 l4off)
{
	__u32 in_off = l4off + 8, csum_off = l4off + 2;
	struct lb_revnat_value *rn;
	struct lb_icmp_err h;
	struct ct_key k = {};
	struct ct_entry *e;
	__be32 outer_saddr;
	__be16 old_check, new_check, fport;

	if (tunnel_ifindex) { /* masquerading runs in tunnel mode only */
		int r = lb_icmp_echo_unmasq(skb, l4off);

		if (r)
			return r;
	}
	if (bpf_skb_load_bytes(skb, l4off, &h, sizeof(h)) < 0)
		return 0;
	if (h.type != LK_ICMP_DEST_UNREACH && h.type != LB_ICMP_TIME_EXCEEDED)
		return 0;
	if (h.in.ihl != 5 || (h.in.protocol != IPPROTO_TCP && h.in.protocol != IPPROTO_UDP))
		return 0;
	k.saddr = h.in.saddr;
	k.daddr = h.in.daddr;
	k.sport = h.sport;
	k.dport = h.dport;
	k.proto = h.in.protocol;
	e = bpf_map_lookup_elem(&lk_ct4, &k);
	/* A load-balanced flow's (CT_F_REVNAT), or a masqueraded one's
	 * (masq.h: only its source was translated). */
	if (!e || !(e->flags & (CT_F_REVNAT | CT_F_MASQ)))
		return 0;
	rn = 0;
	if (e->flags & CT_F_REVNAT) {
		rn = bpf_map_lookup_elem(&lk_lb_revnat, &e->rev_nat_id);
		if (!rn)
			return 0;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &outer_saddr, 4) < 0)
		return -1;
	old_check = h.in.check;
	/* Quoted destination -> the frontend. */
	if (rn) {
		if (bpf_l3_csum_replace(skb, in_off + offsetof(struct iphdr, check), h.in.daddr, rn->addr, 4) < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, h.in.daddr, rn->addr, 4) < 0 ||
		    bpf_skb_store_bytes(skb, in_off + offsetof(struct iphdr, daddr), &rn->addr, 4, 0) < 0)
			return -1;
		fport = bpf_htons(rn->port);
		if (bpf_l4_csum_replace(skb, csum_off, h.dport, fport, 2) < 0 ||
		    bpf_skb_store_bytes(skb, in_off + 22, &fport, 2, 0) < 0)
			return -1;
	}
	/* Quoted source -> the client, for a flow this node SNATed. */
	if (e->flags & CT_F_SNAT) {
		__be32 ca = e->nat_addr;
		__be16 cp = e->nat_port;

		if (bpf_l3_csum_replace(skb, in_off + offsetof(struct iphdr, check), h.in.saddr, ca, 4) < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, h.in.saddr, ca, 4) < 0 ||
		    bpf_skb_store_bytes(skb, in_off + offsetof(struct iphdr, saddr), &ca, 4, 0) < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, h.sport, cp, 2) < 0 ||
		    bpf_skb_store_bytes(skb, in_off + 20, &cp, 2, 0) < 0)
			return -1;
		/* Outer destination -> the client. */
		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), h.in.saddr, ca, 4) < 0 ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, daddr), &ca, 4, 0) < 0)
			return -1;
	}
	/* The quoted header's checksum changed: the ICMP checksum covers it. */
	if (bpf_skb_load_bytes(skb, in_off + offsetof(struct iphdr, check), &new_check, 2) < 0 ||
	    bpf_l4_csum_replace(skb, csum_off, old_check, new_check, 2) < 0)
		return -1;
	/* Sent by the backend itself: it comes from the frontend. */
	if (rn && outer_saddr == h.in.daddr) {
		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), outer_saddr, rn->addr, 4) < 0 ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &rn->addr, 4, 0) < 0)
			return -1;
	}
	lb_stat(LB_STAT_REVNAT);
	return 1;
}

/* lb4_reply translates back a reply of a flow this node load-balanced, on a
 * path that carries only replies: to_pod, where the node itself or a
 * hostNetwork pod was the backend and the host stack answers into the
 * client pod (the packet path's lb4 never sees that reply). Returns 1 when
 * the packet was rewritten, 0 when not, -1 on a failed rewrite. */
static __always_inline int lb4_reply(struct __sk_buff *skb, struct pkt *p, struct lb_pending *pend)
{
	struct ct_key t;
	__u32 l4off = ETH_HLEN + p->ip4->ihl * 4;
	__u8 tcpf;

	if (p->ip4->protocol == IPPROTO_ICMP && !(p->ip4->frag_off & bpf_htons(0x3fff)))
		return lb_icmp_rev_nat(skb, l4off);
	if (ct_tuple4(skb, p->ip4, &t, &tcpf) < 0)
		return 0;
	if (t.proto != IPPROTO_TCP && t.proto != IPPROTO_UDP)
		return 0;
	if (frag4_later(p->ip4))
		l4off = 0; /* its ports are the first fragment's: rewrite the IP header only */
	return lb_rev_nat(skb, &t, tcpf, l4off, pend);
}

/* lb4 is the [LB] step: frontends of scope `scope` are load-balanced,
 * replies of load-balanced flows translated back. ep is the sending
 * endpoint (NULL on the uplink). Returns LB_CONTINUE (*changed set when the
 * packet was rewritten: the caller re-parses) or a TC verdict. A new flow's
 * conntrack entries wait in *pend: the caller runs lb_commit(pend) once the
 * packet is on its way (after policy), never for a packet it drops. */
static __always_inline int lb4(struct __sk_buff *skb, struct pkt *p, __u8 scope,
			       const struct endpoint_info *ep, int *changed, struct lb_pending *pend)
{
	struct ct_key t;
	struct lb_svc_key k;
	struct lb_svc_value *svc;
	__u32 ihl = p->ip4->ihl * 4;
	__u32 l4off = ETH_HLEN + ihl;
	__u16 tot_len = bpf_ntohs(p->ip4->tot_len);
	__u8 tcpf;
	int r;

	*changed = 0;
	if (p->ip4->protocol == IPPROTO_ICMP && !(p->ip4->frag_off & bpf_htons(0x3fff))) {
		r = lb_icmp_rev_nat(skb, l4off);
		if (r < 0)
			return TC_ACT_SHOT;
		*changed = r;
		return LB_CONTINUE;
	}
	r = ct_tuple4(skb, p->ip4, &t, &tcpf);
	if (r == -2) {
		lb_count_drop(skb, ep ? ep->id : 0, DROP_FRAG_NOT_FOUND);
		return TC_ACT_SHOT;
	}
	if (r < 0)
		return LB_CONTINUE;
	if (t.proto != IPPROTO_TCP && t.proto != IPPROTO_UDP)
		return LB_CONTINUE;
	if (frag4_later(p->ip4))
		l4off = 0; /* its ports are the first fragment's: rewrite the IP header only */
	if (scope == LB_SCOPE_NODEPORT) {
		/* Arriving at the node: replies of flows it translated first. */
		r = lb_rev_nat(skb, &t, tcpf, l4off, pend);
		if (r < 0)
			return TC_ACT_SHOT;
		if (r) {
			*changed = 1;
			return LB_CONTINUE;
		}
	}
	k.addr = t.daddr;
	k.port = bpf_ntohs(t.dport);
	k.proto = t.proto;
	k.scope = scope;
	svc = bpf_map_lookup_elem(&lk_lb_svc, &k);
	if (!svc && scope == LB_SCOPE_CLUSTERIP) {
		/* A pod reaching a NodePort on this node's address. */
		k.scope = LB_SCOPE_NODEPORT;
		svc = bpf_map_lookup_elem(&lk_lb_svc, &k);
		if (svc)
			scope = LB_SCOPE_NODEPORT;
	}
	if (svc) {
		if (!lb_src_range_ok(svc, 0, &t.saddr)) {
			lb_count_drop(skb, ep ? ep->id : 0, DROP_LB_SRC_RANGE);
			return TC_ACT_SHOT;
		}
		r = lb_forward(skb, &t, tcpf, svc, scope, l4off, tot_len, ihl, ep, pend);
		if (r == LB_CONTINUE)
			*changed = 1;
		return r;
	}
	if (scope == LB_SCOPE_NODEPORT)
		return LB_CONTINUE; /* rev-NAT tried above */
	r = lb_rev_nat(skb, &t, tcpf, l4off, pend);
	if (r < 0)
		return TC_ACT_SHOT;
	*changed = r;
	return LB_CONTINUE;
}

#endif
