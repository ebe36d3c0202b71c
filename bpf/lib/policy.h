/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Kubernetes NetworkPolicy enforcement over the identity-keyed form that
 * pkg/policy compiles (see its package comment for the semantics):
 *
 *   lk_policy_ipcache   endpoint IP (exact) -> identity, cluster-wide
 *   lk_policy_cidrs     ipBlock prefixes (LPM) -> CIDR identity; 0.0.0.0/0 -> world
 *   lk_policy_isolation identity -> which directions are default-deny
 *   lk_policy_rules     (subject, peer, direction, proto, port prefix) LPM -> policy
 *   lk_policy_verdicts  per-policy allowed/denied packet counters, per CPU
 *
 * A peer matches a rule by identity or by address, the union (Kubernetes:
 * podSelector/namespaceSelector select pods, an ipBlock every address in it,
 * pods' included). An IP resolves to its endpoint identity when it is a
 * known endpoint (exact hash hit), else to the CIDR identity of its longest
 * ipBlock prefix; when an endpoint's identity finds no rule, its CIDR
 * identity is tried too (policy.Compiled.LookupPeer). The fallback lives in
 * the lookup rather than in the rules (no /32 rule per pod an ipBlock
 * covers): rules keep growing with label sets and prefixes, not pods, a pod
 * entering or leaving a range changes no rule, and only a packet the identity
 * rules deny pays the extra LPM lookups. Two maps rather than one LPM trie
 * with /32 endpoint entries: pod-to-pod (the common case) costs one hash
 * lookup, the trie stays as small as the number of distinct ipBlock
 * prefixes, and each map is exactly one of Compiled's tables.
 *
 * A direction that is not isolated allows everything. An isolated one allows
 * what some rule allows; the rule lookup is the documented four LPM lookups
 * (peer as is, then IdentityAny; proto as is, then ProtoAny), in the order of
 * policy.Compiled.Lookup so that the same policy is credited.
 *
 * Only the local side(s) of a connection are checked here: egress where a
 * local endpoint sends, ingress where a local endpoint receives. Connection
 * state (replies, later packets) is the caller's business (conntrack). */
#ifndef LK_POLICY_H
#define LK_POLICY_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "ct.h"

/* Map sizes. The LPM tries and the ipcache are not preallocated: max_entries
 * is a cap, memory follows what the agent writes. */
#define LK_POLICY_MAX_IPCACHE 65536 /* cluster-wide endpoint IPs */
#define LK_POLICY_MAX_CIDRS 16384 /* distinct ipBlock prefixes (CIDR identities < 1<<16) */
#define LK_POLICY_MAX_IDENTITIES 65536 /* isolated identities */
#define LK_POLICY_MAX_RULES 524288 /* rule entries (port ranges split into prefixes) */
#define LK_POLICY_MAX_POLICIES 16384 /* policy indices with verdict counters */

/* Identities and wildcards (pkg/policy: IdentityAny, IdentityWorld, ProtoAny). */
#define LK_IDENTITY_ANY 0
#define LK_IDENTITY_WORLD 2
#define LK_IDENTITY_WORLD6 3 /* ::/0: an IPv6 address in no ipBlock (policy.IdentityWorld6) */
/* The node's own addresses (Loader.SetPolicyHostAddrs): Kubernetes does not
 * let a pod block its node (kubelet probes). Traffic from the node into a pod
 * never meets these programs; the pod's answers to it (see struct
 * policy_flow.answer) pass its egress. */
#define LK_IDENTITY_HOST 1
#define LK_POLICY_PROTO_ANY 0
/* struct policy_key.prefixlen with the whole port significant: subject 32 +
 * peer 32 + direction 8 + proto 8 + port 16 (policy.RuleKey.PrefixLen). */
#define LK_POLICY_KEY_FULL_BITS 96
/* No policy decided (the direction is not isolated). */
#define LK_POLICY_NONE 0xffffffff

/* Map key/value structs of policy (kept here rather than in structs.h, which
 * the service datapath edits concurrently; Go mirrors them via bpf2go). */

/* lk_policy_cidrs key: an LPM trie key, addr in network order. */
struct policy_cidr_key {
	__u32 prefixlen;
	__be32 addr;
};

/* lk_policy_rules key: an LPM trie key (policy.RuleKey). subject, peer,
 * direction and proto are always fully matched (prefixlen >= 80), so only
 * port's byte order matters: network order, so that a port prefix is its
 * high bits. */
struct policy_key {
	__u32 prefixlen; /* 80 + port prefix length */
	__u32 subject; /* identity the rule is for */
	__u32 peer; /* identity on the other side; LK_IDENTITY_ANY: all */
	__u8 direction; /* enum lk_policy_dir */
	__u8 proto; /* IPPROTO_TCP/UDP/SCTP; LK_POLICY_PROTO_ANY: all protocols */
	__be16 port; /* destination port (the receiver's) */
};

/* lk_policy_rules value: the policy (index into the agent's compiled
 * policies) whose rule allows. */
struct policy_value {
	__u32 policy;
};

/* lk_policy_isolation value: 1 + index of the first policy isolating the
 * identity in that direction; 0: not isolated (allow all). */
struct policy_isolation {
	__u32 policy_ingress;
	__u32 policy_egress;
};

/* lk_policy_verdicts value: packets a policy allowed (its rule matched a new
 * connection) and denied (it isolates the endpoint and no rule matched). */
struct policy_verdict {
	__u64 allowed;
	__u64 denied;
};

/* Endpoint IP -> identity (policy.Compiled.IPCache). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_POLICY_MAX_IPCACHE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __be32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_ipcache SEC(".maps");

/* ipBlock prefix -> CIDR identity (policy.Compiled.CIDRs). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LK_POLICY_MAX_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_cidr_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_cidrs SEC(".maps");

/* IPv6 twins of the two address maps: endpoint IPv6 address -> identity
 * (an endpoint's IPv6 address has the identity of its IPv4 one) and IPv6
 * ipBlock prefixes -> CIDR identity (::/0 -> LK_IDENTITY_WORLD6). */
struct policy_cidr6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_POLICY_MAX_IPCACHE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct in6_addr);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_ipcache6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LK_POLICY_MAX_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_cidr6_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_cidrs6 SEC(".maps");

/* Identity -> default-deny directions (policy.Compiled.Isolated). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_POLICY_MAX_IDENTITIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct policy_isolation);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_isolation SEC(".maps");

/* Allow rules (policy.Compiled.Rules). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LK_POLICY_MAX_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_rules SEC(".maps");

/* Per-policy verdict counters, indexed by policy index, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LK_POLICY_MAX_POLICIES);
	__type(key, __u32);
	__type(value, struct policy_verdict);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_policy_verdicts SEC(".maps");

/* The connection-relevant part of a packet, as policy sees it. */
struct policy_flow {
	__be32 saddr;
	__be32 daddr;
	__u16 dport; /* host order; 0 when the protocol has no ports */
	__u8 proto;
	__u8 answer; /* shaped like an answer: TCP other than a bare SYN, ICMP echo reply or error */
};

/* policy_flow_of fills f from the IPv4 packet p. TCP, UDP and SCTP carry
 * their destination port (ct_has_ports), so an SCTP rule admits SCTP to its
 * ports and nothing else; a later fragment (no L4 header) and every other protocol
 * get port 0, which only port-less rules ("all ports and protocols", or a
 * protocol without ports) match. */
#define LK_TCP_SYN 0x02
#define LK_TCP_ACK 0x10
static __always_inline void policy_flow_of(struct __sk_buff *skb, const struct pkt *p,
					   struct policy_flow *f)
{
	struct iphdr *iph = p->ip4;
	__be16 port;

	f->saddr = iph->saddr;
	f->daddr = iph->daddr;
	f->proto = iph->protocol;
	f->dport = 0;
	f->answer = 0;
	if (iph->frag_off & bpf_htons(0x1fff))
		return;
	if (iph->protocol == IPPROTO_ICMP) {
		__u8 type;

		if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + iph->ihl * 4, &type, 1) == 0)
			f->answer = type == 0 /* echo reply */ || type == 3 /* unreachable */ ||
				    type == 11 /* time exceeded */;
		return;
	}
	if (!ct_has_ports(iph->protocol))
		return;
	if (iph->protocol == IPPROTO_TCP) {
		__u8 flags;

		if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + iph->ihl * 4 + 13, &flags, 1) == 0)
			f->answer = (flags & (LK_TCP_SYN | LK_TCP_ACK)) != LK_TCP_SYN;
	}
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + iph->ihl * 4 + 2, &port, sizeof(port)) < 0)
		return;
	f->dport = bpf_ntohs(port);
}

/* policy_endpoint_identity returns ip's endpoint identity, 0 when ip is no
 * known endpoint. */
static __always_inline __u32 policy_endpoint_identity(__be32 ip)
{
	__u32 *id = bpf_map_lookup_elem(&lk_policy_ipcache, &ip);

	return id ? *id : 0;
}

/* policy_cidr_identity resolves ip by address only, as
 * policy.Compiled.CIDRIdentityOf: its longest ipBlock prefix's identity. */
static __always_inline __u32 policy_cidr_identity(__be32 ip)
{
	struct policy_cidr_key k = { .prefixlen = 32, .addr = ip };
	__u32 *cid = bpf_map_lookup_elem(&lk_policy_cidrs, &k);

	return cid ? *cid : LK_IDENTITY_WORLD;
}

/* The family-parameterised forms: an IPv4 address (ip6 0) or the 16 bytes
 * at ip6. Callers pass a constant 0 for IPv4, so each call site keeps only
 * its family's lookups. */
static __always_inline __u32 policy_endpoint_identity_af(__be32 ip4, const void *ip6)
{
	__u32 *id;

	if (!ip6)
		return policy_endpoint_identity(ip4);
	id = bpf_map_lookup_elem(&lk_policy_ipcache6, ip6);
	return id ? *id : 0;
}

static __always_inline __u32 policy_cidr_identity_af(__be32 ip4, const void *ip6)
{
	struct policy_cidr6_key k = { .prefixlen = 128 };
	__u32 *cid;

	if (!ip6)
		return policy_cidr_identity(ip4);
	__builtin_memcpy(k.addr, ip6, 16);
	cid = bpf_map_lookup_elem(&lk_policy_cidrs6, &k);
	return cid ? *cid : LK_IDENTITY_WORLD6;
}

static __always_inline void policy_count(__u32 policy, int allowed)
{
	struct policy_verdict *v = bpf_map_lookup_elem(&lk_policy_verdicts, &policy);

	if (!v)
		return; /* an index beyond the counters (the agent refuses those) */
	if (allowed)
		v->allowed++;
	else
		v->denied++;
}

static __always_inline struct policy_value *policy_rule(struct policy_key *k, __u32 peer, __u8 proto)
{
	k->peer = peer;
	k->proto = proto;
	return bpf_map_lookup_elem(&lk_policy_rules, k);
}

/* policy_isolation_of returns identity id's isolation (all zero: none, or
 * id 0: not an endpoint). By value: the callers test fields, not pointers
 * (clang would OR two pointers for "neither", which the verifier refuses). */
static __always_inline struct policy_isolation policy_isolation_of(__u32 id)
{
	struct policy_isolation none = {}, *iso;

	if (!id)
		return none;
	iso = bpf_map_lookup_elem(&lk_policy_isolation, &id);
	return iso ? *iso : none;
}

/* policy_decide judges one direction of a new connection for the local
 * endpoint identity subject with isolation iso against the peer at peer_ip (resolved only when the
 * direction is isolated). Returns 1 (allowed) or 0 (denied), counting the
 * verdict against the deciding policy: the rule's on allow, the first
 * isolating one on deny. A direction that is not isolated is not counted.
 * answer: the packet is shaped like an answer: egress to the node passes
 * it, returning 2 (allowed for this packet only: no connection state).
 * from_stack: the packet comes from this node's stack (to_pod): ingress from
 * the node's own addresses passes, as Kubernetes requires (traffic from the
 * node where a pod runs is always allowed: kubelet's probes), as a tracked
 * connection so the pod's replies pass too. Packets from the wire never get
 * this (an address of the node in their source is a spoof there).
 * peer_hint: the peer's identity as the tunnel carried it (tunnel.h; 0:
 * resolve the peer's address: peer_ip, or the IPv6 address at peer_ip6 when
 * that is not 0). */
static __always_inline int policy_decide(__u32 subject, const struct policy_isolation *iso, __u8 dir,
					 __be32 peer_ip, const void *peer_ip6, __u32 peer_hint, __u8 proto, __u16 port, __u8 answer,
					 __u8 from_stack)
{
	struct policy_value *v;
	__u32 isolating;

	isolating = dir == POLICY_DIR_EGRESS ? iso->policy_egress : iso->policy_ingress;
	if (!isolating)
		return 1;

	struct policy_key k = {
		.prefixlen = LK_POLICY_KEY_FULL_BITS,
		.subject = subject,
		.direction = dir,
		.port = bpf_htons(port),
	};
	__u32 ep = peer_hint ? peer_hint : policy_endpoint_identity_af(peer_ip, peer_ip6);
	__u32 peer = ep ? ep : policy_cidr_identity_af(peer_ip, peer_ip6);

	if (peer == LK_IDENTITY_HOST && dir == POLICY_DIR_EGRESS && answer)
		return 2; /* passes, but opens nothing: the caller tracks no state */
	if (peer == LK_IDENTITY_HOST && dir == POLICY_DIR_INGRESS && from_stack)
		return 1;

	v = policy_rule(&k, peer, proto);
	if (!v)
		v = policy_rule(&k, peer, LK_POLICY_PROTO_ANY);
	if (!v)
		v = policy_rule(&k, LK_IDENTITY_ANY, proto);
	if (!v)
		v = policy_rule(&k, LK_IDENTITY_ANY, LK_POLICY_PROTO_ANY);
	if (!v && ep) {
		/* An endpoint (or the node) matches by address too: the ipBlocks
		 * covering it (IdentityAny was tried above). */
		peer = policy_cidr_identity_af(peer_ip, peer_ip6);
		v = policy_rule(&k, peer, proto);
		if (!v)
			v = policy_rule(&k, peer, LK_POLICY_PROTO_ANY);
	}
	if (v) {
		policy_count(v->policy, 1);
		return 1;
	}
	policy_count(isolating - 1, 0);
	return 0;
}

/* The head of an ICMP error: type, code, checksum, 4 bytes, then the
 * quoted IPv4 header and the first L4 bytes (the ports). */
struct policy_icmp_err {
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 rest;
	struct iphdr in;
	__be16 sport;
	__be16 dport;
};

/* policy_related reports whether packet p is an ICMP error (destination
 * unreachable, time exceeded) about a connection policy allowed, quoted in
 * either direction: such errors (fragmentation needed, port unreachable)
 * belong to the connection and pass with it. */
static __always_inline int policy_related(struct __sk_buff *skb, const struct iphdr *ip4)
{
	struct policy_icmp_err h;
	struct ct_key k = {}, r;
	struct ct_entry *e;

	if (ip4->protocol != IPPROTO_ICMP || (ip4->frag_off & bpf_htons(0x3fff)))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + ip4->ihl * 4, &h, sizeof(h)) < 0)
		return 0;
	if (h.type != LK_ICMP_DEST_UNREACH && h.type != 11 /* time exceeded */)
		return 0;
	if (h.in.ihl != 5 || !ct_has_ports(h.in.protocol))
		return 0;
	k.saddr = h.in.saddr;
	k.daddr = h.in.daddr;
	k.sport = h.sport;
	k.dport = h.dport;
	k.proto = h.in.protocol;
	e = bpf_map_lookup_elem(&lk_ct4, &k);
	if (!e) {
		ct_key_reverse(&k, &r);
		e = bpf_map_lookup_elem(&lk_ct4, &r);
	}
	return e && (e->flags & CT_F_POLICY);
}

/* policy_enforce judges packet p between a local sender (src_id: its
 * identity, src_iso: its isolation; zero when the sender is not local) and
 * a local receiver (dst_id, dst_iso likewise). Returns 0 or
 * DROP_POLICY_EGRESS / DROP_POLICY_INGRESS.
 *
 * Connection state (bpf/lib/ct.h, lk_ct4): a packet of a connection policy
 * allowed (an entry with CT_F_POLICY, in either direction: later packets and
 * replies) passes without evaluation. Otherwise the packet is judged as a
 * new connection and, when allowed, its flow entry is created with
 * CT_F_POLICY (or the flag is set on the flow entry load balancing created
 * for it). Only connections touching an endpoint some policy selects (an
 * isolation entry in any direction, so that replies into an ingress-isolated
 * sender find their entry) are tracked: the rest of the traffic pays two
 * hash lookups. ICMP errors pass with the connection they quote
 * (policy_related). Other packets conntrack cannot key (later fragments,
 * other ICMP, other protocols) are judged on their own, every time. */
static __always_inline __u32 policy_enforce(struct __sk_buff *skb, const struct pkt *p, __u32 src_id,
					    const struct policy_isolation *src_iso, __u32 dst_id,
					    const struct policy_isolation *dst_iso, __u8 from_stack,
					    __u32 src_hint)
{
	struct ct_entry *e = 0;
	struct policy_flow f;
	struct ct_key key;
	int res = CT_NEW, tracked, egress;
	__u8 tcp_flags;

	if (!(src_iso->policy_ingress | src_iso->policy_egress | dst_iso->policy_ingress |
	      dst_iso->policy_egress))
		return 0;
	tracked = ct_tuple4(skb, p->ip4, &key, &tcp_flags);
	if (tracked == -2)
		return DROP_FRAG_NOT_FOUND; /* a later fragment, its first not seen (frag.h) */
	tracked = tracked == 0;
	if (tracked) {
		res = ct_lookup4(&key, tcp_flags, &e);
		if (res != CT_NEW && e && (e->flags & CT_F_POLICY))
			return 0;
	}
	if (!tracked && policy_related(skb, p->ip4))
		return 0;
	policy_flow_of(skb, p, &f);
	if (tracked && frag4_later(p->ip4) && ct_has_ports(f.proto))
		f.dport = bpf_ntohs(key.dport); /* its first fragment's port (frag.h) */
	egress = policy_decide(src_id, src_iso, POLICY_DIR_EGRESS, f.daddr, 0, 0, f.proto, f.dport, f.answer, 0);
	if (!egress)
		return DROP_POLICY_EGRESS;
	if (!policy_decide(dst_id, dst_iso, POLICY_DIR_INGRESS, f.saddr, 0, src_hint, f.proto, f.dport, 0,
			   from_stack))
		return DROP_POLICY_INGRESS;
	if (!tracked || egress == 2)
		return 0;
	if (res == CT_ESTABLISHED && e) {
		e->flags |= CT_F_POLICY; /* load balancing's flow entry */
	} else {
		struct ct_entry init = { .flags = CT_F_POLICY };

		ct_create4(&key, &init); /* a full table: the next packet is judged again */
	}
	return 0;
}

/* policy_from_endpoint judges an IPv4 packet the local endpoint ep sent
 * (after load balancing: the destination is the chosen backend): ep's
 * egress and, when the destination is a local endpoint, its ingress. The
 * sender's identity is that of its own address (a hairpin flow's source is
 * rewritten by then). Returns 0 or a drop reason; *charge is the endpoint the
 * drop counts against (the sender for egress, the receiver for ingress). */
static __always_inline __u32 policy_from_endpoint(struct __sk_buff *skb, const struct pkt *p,
						  const struct endpoint_info *ep, __u32 *charge)
{
	__u32 src_id = policy_endpoint_identity(ep->ip), dst_id = 0, dst_ep = 0, reason;
	struct endpoint_info *dst = bpf_map_lookup_elem(&lk_endpoints, &p->ip4->daddr);
	struct policy_isolation src_iso, dst_iso;

	if (dst) {
		dst_id = policy_endpoint_identity(dst->ip);
		dst_ep = dst->id;
	}
	src_iso = policy_isolation_of(src_id);
	dst_iso = policy_isolation_of(dst_id);
	reason = policy_enforce(skb, p, src_id, &src_iso, dst_id, &dst_iso, 0, 0);
	*charge = reason == DROP_POLICY_INGRESS ? dst_ep : ep->id;
	return reason;
}

/* policy_to_endpoint judges an IPv4 packet for the local endpoint dst that
 * comes from the wire (from_uplink) or from this node's stack (to_pod,
 * from_stack set): dst's ingress. src_hint: the sender's identity when the
 * tunnel carried it (0: resolve the source address). Returns 0,
 * DROP_POLICY_INGRESS or DROP_FRAG_NOT_FOUND. */
static __always_inline __u32 policy_to_endpoint(struct __sk_buff *skb, const struct pkt *p,
						const struct endpoint_info *dst, __u8 from_stack,
						__u32 src_hint)
{
	__u32 dst_id = policy_endpoint_identity(dst->ip);
	struct policy_isolation src_iso = {}, dst_iso = policy_isolation_of(dst_id);

	return policy_enforce(skb, p, 0, &src_iso, dst_id, &dst_iso, from_stack, src_hint);
}

#endif
