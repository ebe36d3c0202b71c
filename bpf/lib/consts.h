/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Constants shared with Go. The enums reach Go through BTF: bpf2go -type
 * generates pkg/datapath's numbers from them (see gen.go), so the two sides
 * cannot drift apart. */
#ifndef LK_CONSTS_H
#define LK_CONSTS_H

#define AF_INET 2
#define AF_INET6 10

/* From linux/if_arp.h, which drags in libc headers. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

/* 802.1Q / 802.1ad tag ethertypes (linux/if_ether.h ETH_P_8021Q/AD). */
#define LK_ETH_P_8021Q 0x8100
#define LK_ETH_P_8021AD 0x88A8

#define LK_MAX_ENDPOINTS 4096
#define LK_MAX_XSKS 1024
#define LK_EVENTS_RING_BYTES (256 * 1024) /* lk_events: ~5000 events */

/* Drop reasons: datapath.DropReason. */
enum lk_drop_reason {
	DROP_SPOOFED_MAC = 1,
	DROP_SPOOFED_IP = 2,
	DROP_UNKNOWN_EP = 3,
	DROP_MALFORMED = 4,
	DROP_TTL_EXCEEDED = 5,
	DROP_FIB_FAILED = 6,
	DROP_REDIRECT = 7,
	DROP_UNSUPPORTED_L3 = 8,
	DROP_NO_SOCKET = 9, /* VM frame, but no AF_XDP socket for its queue (backend down) */
	DROP_NOT_FOR_VM = 10, /* unicast frame for another MAC on a VM device */
	DROP_VLAN = 11, /* 802.1Q/802.1ad tagged frame from an endpoint */
	/* [LB] */
	DROP_NO_BACKEND = 12, /* service without a backend for new flows: TCP reset / ICMP unreachable sent */
	DROP_NAT_NO_PORT = 13, /* no free source port for a NodePort/hairpin SNAT or a masquerade */
	/* [/LB] */
	/* policy (bpf/lib/policy.h) */
	DROP_POLICY_INGRESS = 14, /* the receiving local endpoint's NetworkPolicy ingress denies it */
	DROP_POLICY_EGRESS = 15, /* the sending local endpoint's NetworkPolicy egress denies it */
	DROP_FRAG_NOT_FOUND = 16, /* a later IPv4 fragment whose first fragment was not seen (frag.h) */
	/* [LB] a traffic-policy Local frontend (externalTrafficPolicy or
	 * internalTrafficPolicy Local) with no ready endpoint on this node,
	 * while the Service has some elsewhere: dropped, no answer (kube-proxy) */
	DROP_NO_LOCAL_BACKEND = 17,
	/* IPv6 (bpf/lib/ipv6.h, ndp.h) */
	DROP_IPV6_EXT_HDRS = 18, /* IPv6 extension-header chain truncated or longer than LK_IP6_EXT_MAX */
	DROP_ROUTER_MSG = 19, /* router advertisement, ICMPv6 redirect or DHCPv6 server message from an endpoint */
	/* Retired: the first IPv6 slice refused IPv6 of endpoints a NetworkPolicy
	 * selects; policy6.h enforces it now. Kept so that no reason is renumbered. */
	DROP_POLICY_IPV6 = 20,
	/* Tunnel mode (bpf/lib/tunnel.h) */
	DROP_TUNNEL_PORT = 21, /* UDP from an endpoint to a node address's VXLAN tunnel port */
	DROP_TUNNEL_UNKNOWN_NODE = 22, /* from the tunnel: the outer source is no other node's underlay address */
	DROP_TUNNEL_FOREIGN_SRC = 23, /* from the tunnel: the inner source is not the sending node's (pod CIDR, claim, itself) */
	/* Bandwidth (bpf/lib/edt.h) */
	DROP_EDT_HORIZON = 24, /* the endpoint's egress limit would hold the packet past the horizon */
	/* [LB] a LoadBalancer ingress IP's frontend with loadBalancerSourceRanges
	 * (LB_SVC_F_SRC_RANGE): the source is in none of its ranges (lb_src_range_ok) */
	DROP_LB_SRC_RANGE = 25,
	/* a VM's DHCP message its link's server does not answer (dhcp.h): RELEASE,
	 * DECLINE, INFORM, a REQUEST naming another server, no message type */
	DROP_DHCP = 26,
};

/* Metric kinds: the "kind" half of struct metrics_key. */
enum lk_metric_kind {
	METRIC_FROM_EP = 0, /* packets the endpoint sent (that passed anti-spoofing) */
	METRIC_TO_EP = 1, /* packets delivered to the endpoint */
	METRIC_TO_STACK = 2, /* packets the endpoint sent that went to the host stack */
	METRIC_DROP_BASE = 0x100, /* + drop reason */
};

/* Redirect kinds recorded by the test trace (struct redirect_trace). */
enum lk_redirect_kind {
	REDIR_PLAIN = 1, /* bpf_redirect */
	REDIR_PEER = 2, /* bpf_redirect_peer */
	REDIR_NEIGH = 3, /* bpf_redirect_neigh */
	REDIR_XSK = 4, /* bpf_redirect_map into an XSKMAP */
};

/* endpoint_info.flags */
enum lk_endpoint_flags {
	EP_F_VM = 1, /* a VM's device: native XDP into AF_XDP on the far end */
	EP_F_L3 = 2, /* an L3 device (netkit L3): no link-layer addresses, no ARP */
};

/* Flow event kinds: struct lk_event.kind. */
enum lk_event_kind {
	EVENT_DROP = 1, /* the datapath dropped the packet; reason set */
	EVENT_FORWARDED = 2, /* a sampled packet the datapath forwarded */
};

/* events_cfg.flags: which events the BPF programs emit. */
enum lk_events_flags {
	EVENTS_F_DROPS = 1,
	EVENTS_F_FORWARDED = 2, /* one in events_cfg.sample_rate forwarded packets */
};

/* [LB] Service load-balancing counters: index into lk_lb_stats (per CPU). */
enum lk_lb_stat {
	LB_STAT_NEW_FLOW = 0, /* a new flow to a frontend took a backend (Maglev or affinity) */
	LB_STAT_CT_HIT = 1, /* a packet of a tracked flow kept its backend */
	LB_STAT_RESELECT = 2, /* a tracked flow's backend was gone: chosen again */
	LB_STAT_AFFINITY = 3, /* a new flow followed its client's affinity entry */
	LB_STAT_REVNAT = 4, /* a reply was translated back (rev-NAT and/or un-SNAT) */
	LB_STAT_NO_BACKEND = 5, /* a new flow found no backend (reset / unreachable sent) */
	LB_STAT_HAIRPIN = 6, /* a new flow whose client is its own backend (SNAT to the hairpin address) */
	LB_STAT_NODEPORT_LOCAL = 7, /* a new NodePort flow to a local backend (client address kept) */
	LB_STAT_NODEPORT_SNAT = 8, /* a new NodePort flow to a remote backend (SNAT to the node address) */
	LB_STAT_MASQ = 9, /* a new flow from an endpoint to outside the cluster, masqueraded (masq.h) */
	LB_STAT_MASQ_PKT = 10, /* a packet masqueraded (masq.h) */
	LB_STAT_MAX = 11,
};
const enum lk_lb_stat *lk_unused_lb_stat __attribute__((unused));
/* [/LB] */
/* Socket LB (sock.c) hooks: the first index into lk_sock_stats. The IPv6
 * hooks have their numbers already, so the pinned map keeps its size when
 * they arrive. */
enum lk_sock_hook {
	SOCK_HOOK_CONNECT4 = 0,
	SOCK_HOOK_SENDMSG4 = 1,
	SOCK_HOOK_RECVMSG4 = 2,
	SOCK_HOOK_GETPEERNAME4 = 3,
	SOCK_HOOK_CONNECT6 = 4,
	SOCK_HOOK_SENDMSG6 = 5,
	SOCK_HOOK_RECVMSG6 = 6,
	SOCK_HOOK_GETPEERNAME6 = 7,
	SOCK_HOOK_MAX = 8,
};

/* Socket LB counters per hook: lk_sock_stats[hook * SOCK_STAT_MAX + stat]. */
enum lk_sock_stat {
	SOCK_STAT_TRANSLATED = 0, /* forward: service -> backend; reverse: backend -> service */
	SOCK_STAT_NO_BACKEND = 1, /* a frontend without a backend: the call fails (ECONNREFUSED) */
	SOCK_STAT_SRC_RANGE = 2, /* a frontend whose loadBalancerSourceRanges leave the node out: the call fails (EPERM) */
	SOCK_STAT_MAX = 3,
};
const enum lk_sock_hook *lk_unused_sock_hook __attribute__((unused));
const enum lk_sock_stat *lk_unused_sock_stat __attribute__((unused));
/* Direction of a policy rule, seen from its subject (policy.Direction). */
enum lk_policy_dir {
	POLICY_DIR_INGRESS = 0,
	POLICY_DIR_EGRESS = 1,
};

/* Keep the enums in BTF for bpf2go -type even where no code names the type. */
const enum lk_drop_reason *lk_unused_drop_reason __attribute__((unused));
const enum lk_metric_kind *lk_unused_metric_kind __attribute__((unused));
const enum lk_redirect_kind *lk_unused_redirect_kind __attribute__((unused));
const enum lk_endpoint_flags *lk_unused_endpoint_flags __attribute__((unused));
const enum lk_event_kind *lk_unused_event_kind __attribute__((unused));
const enum lk_events_flags *lk_unused_events_flags __attribute__((unused));
const enum lk_policy_dir *lk_unused_policy_dir __attribute__((unused));

#endif
