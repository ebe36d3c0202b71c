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
 * An IP resolves to its endpoint identity when it is a known endpoint (exact
 * hash hit, so an endpoint wins even against a /32 ipBlock, as
 * policy.Compiled.IdentityOf), else to the CIDR identity of its longest
 * ipBlock prefix. Two maps rather than one LPM trie with /32 endpoint
 * entries: pod-to-pod (the common case) costs one hash lookup, the trie stays
 * as small as the number of distinct ipBlock prefixes, and an endpoint IP
 * that is also an ipBlock /32 needs no shadowing logic: each map is exactly
 * one of Compiled's tables.
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
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"

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
	__u8 proto; /* IPPROTO_TCP/UDP; LK_POLICY_PROTO_ANY: all protocols */
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
};

/* policy_flow_of fills f from the IPv4 packet p. TCP and UDP carry their
 * destination port; a later fragment (no L4 header) and every other protocol
 * get port 0, which only port-less rules ("all ports and protocols", or a
 * protocol without ports) match. */
static __always_inline void policy_flow_of(struct __sk_buff *skb, const struct pkt *p,
					   struct policy_flow *f)
{
	struct iphdr *iph = p->ip4;
	__be16 port;

	f->saddr = iph->saddr;
	f->daddr = iph->daddr;
	f->proto = iph->protocol;
	f->dport = 0;
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return;
	if (iph->frag_off & bpf_htons(0x1fff))
		return;
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

/* policy_identity resolves ip as policy.Compiled.IdentityOf does. */
static __always_inline __u32 policy_identity(__be32 ip)
{
	struct policy_cidr_key k = { .prefixlen = 32, .addr = ip };
	__u32 id = policy_endpoint_identity(ip);
	__u32 *cid;

	if (id)
		return id;
	cid = bpf_map_lookup_elem(&lk_policy_cidrs, &k);
	return cid ? *cid : LK_IDENTITY_WORLD;
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

/* policy_decide judges one direction of a new connection for the local
 * endpoint identity subject (0: not an endpoint, nothing to enforce) against
 * the peer at peer_ip (resolved only when the direction is isolated). Returns 1 (allowed) or 0 (denied), counting the verdict against the
 * deciding policy: the rule's on allow, the first isolating one on deny.
 * *policy gets that index, or LK_POLICY_NONE when the direction is not
 * isolated. */
static __always_inline int policy_decide(__u32 subject, __u8 dir, __be32 peer_ip, __u8 proto,
					 __u16 port, __u32 *policy)
{
	struct policy_isolation *iso;
	struct policy_value *v;
	__u32 isolating, peer;

	*policy = LK_POLICY_NONE;
	if (!subject)
		return 1;
	iso = bpf_map_lookup_elem(&lk_policy_isolation, &subject);
	if (!iso)
		return 1;
	isolating = dir == POLICY_DIR_EGRESS ? iso->policy_egress : iso->policy_ingress;
	if (!isolating)
		return 1;

	peer = policy_identity(peer_ip);
	struct policy_key k = {
		.prefixlen = LK_POLICY_KEY_FULL_BITS,
		.subject = subject,
		.direction = dir,
		.port = bpf_htons(port),
	};
	v = policy_rule(&k, peer, proto);
	if (!v)
		v = policy_rule(&k, peer, LK_POLICY_PROTO_ANY);
	if (!v)
		v = policy_rule(&k, LK_IDENTITY_ANY, proto);
	if (!v)
		v = policy_rule(&k, LK_IDENTITY_ANY, LK_POLICY_PROTO_ANY);
	if (v) {
		*policy = v->policy;
		policy_count(v->policy, 1);
		return 1;
	}
	*policy = isolating - 1;
	policy_count(isolating - 1, 0);
	return 0;
}

/* policy_check_egress judges a new connection the local endpoint at
 * f->saddr sends: 0 or DROP_POLICY_EGRESS. */
static __always_inline __u32 policy_check_egress(const struct policy_flow *f)
{
	__u32 policy;

	if (!policy_decide(policy_endpoint_identity(f->saddr), POLICY_DIR_EGRESS, f->daddr,
			   f->proto, f->dport, &policy))
		return DROP_POLICY_EGRESS;
	return 0;
}

/* policy_check_ingress judges a new connection to the local endpoint at
 * f->daddr: 0 or DROP_POLICY_INGRESS. */
static __always_inline __u32 policy_check_ingress(const struct policy_flow *f)
{
	__u32 policy;

	if (!policy_decide(policy_endpoint_identity(f->daddr), POLICY_DIR_INGRESS, f->saddr,
			   f->proto, f->dport, &policy))
		return DROP_POLICY_INGRESS;
	return 0;
}

/* policy_from_endpoint judges an IPv4 packet the local endpoint src_id sent
 * (after load balancing: the destination is the chosen backend): the
 * sender's egress, then, when the destination is a local endpoint, its
 * ingress. Returns 0 or a drop reason; *charge is the endpoint the drop
 * counts against (the sender for egress, the receiver for ingress). */
static __always_inline __u32 policy_from_endpoint(struct __sk_buff *skb, const struct pkt *p,
						  __u32 src_id, __u32 *charge)
{
	struct endpoint_info *dst;
	struct policy_flow f;
	__u32 reason;

	policy_flow_of(skb, p, &f);
	*charge = src_id;
	reason = policy_check_egress(&f);
	if (reason)
		return reason;
	dst = bpf_map_lookup_elem(&lk_endpoints, &f.daddr);
	if (dst) {
		*charge = dst->id;
		reason = policy_check_ingress(&f);
		if (reason)
			return reason;
	}
	return 0;
}

/* policy_to_endpoint judges an IPv4 packet from outside the node for the
 * local endpoint at its destination: that endpoint's ingress. Returns 0 or
 * DROP_POLICY_INGRESS. */
static __always_inline __u32 policy_to_endpoint(struct __sk_buff *skb, const struct pkt *p)
{
	struct policy_flow f;

	policy_flow_of(skb, p, &f);
	return policy_check_ingress(&f);
}

#endif
