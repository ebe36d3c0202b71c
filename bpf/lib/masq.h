/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* masq.h: masquerading in tunnel mode. There the network routes no pod
 * CIDR: a reply to a pod's address from outside the cluster (the API server
 * on a control-plane host that runs no agent, a registry, the internet)
 * has no way back. So a TCP, UDP or ICMP echo packet an endpoint sends to a destination
 * outside the cluster — in no pod CIDR or VM claim of lk_tunnel_nodes and
 * no other node's underlay address (lk_tunnel_peers) — leaves with the
 * node's address towards it (the kernel's route's source, lb_node_src) and
 * a source port from the SNAT range ([lb_snat_port_min, lb_snat_port_max],
 * outside the node's own ephemeral ports), as flannel's --ip-masq and
 * Cilium's masquerading do. Two conntrack entries (ct.h), as a load-balanced
 * flow's:
 *   - the masquerade entry, on the endpoint's tuple (key flags CT_KEY_MASQ):
 *     the source used (nat_addr:nat_port);
 *   - the flow entry, on the translated tuple (CT_F_SNAT | CT_F_MASQ, the
 *     endpoint's address and port in nat_addr:nat_port): the reply, which
 *     arrives on the uplink, matches it reversed, and lb_rev_nat restores its
 *     destination (then, for a Service's flow to a backend outside the
 *     cluster, the frontend as its source).
 * It runs last in from_pod, after load balancing and policy (which judge
 * the endpoint's own tuple), right before routing. Traffic to the node's
 * own addresses (no forwarding route) is left alone, as are ICMP other
 * than echo requests (an echo's identifier is translated as its port;
 * replies come back through lb_icmp_echo_unmasq; ICMP errors about a
 * masqueraded flow through lb_icmp_rev_nat) and untrackable packets.
 * Native routing: off (tunnel_ifindex 0; the network routes pod CIDRs
 * back). IPv4 only. */
#ifndef LK_MASQ_H
#define LK_MASQ_H

#include "lb.h"
#include "tunnel.h"

/* masq_outside reports whether dst is outside the cluster (see above). */
static __always_inline int masq_outside(__be32 dst)
{
	struct tunnel_node_key k = { .prefixlen = 32, .addr = dst };

	if (bpf_map_lookup_elem(&lk_tunnel_nodes, &k))
		return 0;
	return !bpf_map_lookup_elem(&lk_tunnel_peers, &dst);
}

/* masq4 masquerades p, which endpoint ep sent (see above). Only a packet
 * from the endpoint's own address: one load balancing translated back (a
 * local backend's reply to a NodePort or hostPort client outside the
 * cluster, from the node's address and that port now) is a reply, and
 * leaves as it is. Returns 0 to go on, or a drop reason; *changed is set
 * when it rewrote the packet (the caller parses it again: its packet
 * pointers are gone). */
static __always_inline __u32 masq4(struct __sk_buff *skb, struct pkt *p, const struct endpoint_info *ep, int *changed)
{
	struct ct_entry *se = 0, *fe = 0;
	struct ct_key t, sk, ft;
	__be32 node = 0;
	__be16 port = 0;
	__u32 l4off;
	__u8 tcpf;

	*changed = 0;
	if (!tunnel_ifindex || p->ip4->saddr != ep->ip || !masq_outside(p->ip4->daddr))
		return 0;
	if (ct_tuple4(skb, p->ip4, &t, &tcpf) < 0)
		return 0;
	l4off = frag4_later(p->ip4) ? 0 : ETH_HLEN + p->ip4->ihl * 4;
	if (t.proto == IPPROTO_ICMP) {
		__u8 type;

		/* Echo requests (ct_tuple4: the identifier as both ports);
		 * an echo reply from an endpoint answers no one outside. */
		if (bpf_skb_load_bytes(skb, l4off, &type, 1) < 0 || type != LK_ICMP_ECHO)
			return 0;
	} else if (t.proto != IPPROTO_TCP && t.proto != IPPROTO_UDP) {
		return 0;
	}
	sk = t;
	sk.flags = CT_KEY_MASQ;
	ft = t;
	if (ct_lookup4(&sk, tcpf, &se) == CT_ESTABLISHED && se) {
		node = se->nat_addr;
		port = se->nat_port;
		ft.saddr = node;
		ft.sport = port;
		if (t.proto == IPPROTO_ICMP)
			ft.dport = port;
		/* The flow entry takes this direction's TCP state; an LRU
		 * eviction of it alone is repaired. */
		if (ct_lookup4(&ft, tcpf, &fe) == CT_NEW) {
			struct ct_entry nf = { .nat_addr = t.saddr, .nat_port = t.sport, .flags = CT_F_SNAT | CT_F_MASQ };

			ct_create4(&ft, &nf);
		} else if (fe) {
			/* The masquerade entry sees no replies: it lives as long
			 * as its flow. */
			se->flags = (se->flags & ~(CT_F_SEEN_REPLY | CT_F_CLOSING)) |
				    (fe->flags & (CT_F_SEEN_REPLY | CT_F_CLOSING));
		}
	} else {
		struct ct_entry nf = { .nat_addr = t.saddr, .nat_port = t.sport, .flags = CT_F_SNAT | CT_F_MASQ };
		struct ct_entry ne = { .flags = CT_F_MASQ };
		struct bpf_fib_lookup fib;

		if (lb_node_src(skb, &fib, 0, &t.daddr, &node) < 0)
			return 0; /* the node's own address, or no route: as it is */
		ft.saddr = node;
		port = lb_snat_flow_in(0, &ft, &ft.sport, t.proto == IPPROTO_ICMP ? &ft.dport : 0, &nf, lb_flow_hash(&t), 0);
		if (!port)
			return DROP_NAT_NO_PORT;
		ne.nat_addr = node;
		ne.nat_port = port;
		ct_create4(&sk, &ne);
		lb_stat(LB_STAT_MASQ);
	}
	*changed = 1;
	if (t.proto == IPPROTO_ICMP ? lb_icmp_echo_rewrite(skb, l4off, 1, t.saddr, node, t.sport, port) < 0
				    : lb_rewrite4(skb, l4off, t.proto, 1, t.saddr, node, t.sport, port) < 0)
		return DROP_MALFORMED;
	lb_stat(LB_STAT_MASQ_PKT);
	return 0;
}

#endif
