/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_maps.h: the service load balancer's map keys, values and maps. The
 * structs mirror pkg/service's map-shaped types (service.ServiceKey, ...)
 * 1:1; lb.h explains the layout choices (Maglev as a map of per-frontend
 * arrays). */
#ifndef LK_LB_MAPS_H
#define LK_LB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"

#define LK_LB_FRONTENDS 65536
#define LK_LB_BACKENDS 262144
#define LK_LB_AFFINITY 65536
#define LK_LB_SRC_RANGES 65536
#define LB_HAIRPIN_IP 0xa9fe2a01 /* 169.254.42.1, host order */
#define LB_SNAT_TRIES 16
#define LB_CONTINUE -1
#define LB_MAGLEV_FLOOR 251 /* service.MaglevFloor: the smallest table */

/* Load-time settings (datapath.Config.SNATPortMin/Max, lanekitd
 * --nodeport-snat-ports): the source ports NodePort and hairpin SNAT
 * allocate from. Not the node's ephemeral range (ip_local_port_range,
 * 32768-60999 by default): the node's own sockets are invisible to lk_ct4,
 * so the range must be reserved (net.ipv4.ip_local_reserved_ports). */
const volatile __u16 lb_snat_port_min = 61000;
const volatile __u16 lb_snat_port_max = 65535;

/* service.ServiceKey */
struct lb_svc_key {
	__be32 addr;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 scope; /* LB_SCOPE_* */
};

#define LB_SCOPE_CLUSTERIP 0
#define LB_SCOPE_NODEPORT 1
#define LB_SVC_F_AFFINITY 1
#define LB_SVC_F_NODEPORT 2
/* A traffic policy Local frontend (service.ServiceFlagLocal): its Maglev
 * table holds this node's endpoints only; none -> DROP_NO_LOCAL_BACKEND,
 * silently (the Service has endpoints on other nodes). */
#define LB_SVC_F_LOCAL 4
/* An external address (spec.externalIPs, status.loadBalancer.ingress[].ip;
 * service.ServiceFlagExternal): not a node address, so a flow to a remote
 * backend is source-NATed to the node's address towards that backend. */
#define LB_SVC_F_EXTERNAL 8
/* loadBalancerSourceRanges (service.ServiceFlagSrcRange): a LoadBalancer
 * ingress IP's frontend that only the sources in its lk_lb_src_range
 * prefixes reach; any other packet to it is dropped (DROP_LB_SRC_RANGE). */
#define LB_SVC_F_SRC_RANGE 16
#define LB_BACKEND_ACTIVE 0

/* service.ServiceValue */
struct lb_svc_value {
	__u32 frontend_id;
	__u32 maglev_size; /* 0: no backend takes new flows */
	__u32 affinity_seconds;
	__u8 flags;
	__u8 pad[3];
};

/* service.BackendValue (key: the backend ID, __u32) */
struct lb_backend_value {
	__be32 addr;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 state; /* service.BackendState: 0 active, 1 terminating, 2 not ready */
	__u32 frontend_id;
};

/* service.RevNatValue (key: the frontend ID, __u32) */
struct lb_revnat_value {
	__be32 addr;
	__u16 port; /* host byte order */
	__u16 pad;
};

struct lb_affinity_key {
	__be32 client;
	__u32 frontend_id;
};

struct lb_affinity_value {
	__u64 last_used; /* bpf_ktime_get_ns */
	__u32 backend_id;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_FRONTENDS);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_FRONTENDS);
	__type(key, __u32);
	__type(value, struct lb_revnat_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_revnat SEC(".maps");

struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 251); /* a template: each frontend's array has its own size */
	/* INNER_MAP: each frontend's array has its own size; MMAPABLE: the
	 * agent fills a new array with one memcpy, not a syscall per slot. */
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32); /* backend ID */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, LK_LB_FRONTENDS);
	__type(key, __u32); /* frontend ID */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb_maglev_inner);
} lk_lb_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_LB_AFFINITY);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_stats SEC(".maps");

/* service.SrcRangeKey: one allowed source prefix of a frontend, an LPM
 * trie key for both families: IPv4 prefixes as IPv4-mapped IPv6
 * (::ffff:a.b.c.d, 96 + their length), so a frontend ID and a source
 * address of either family make one key. prefixlen counts the frontend
 * ID's 32 bits too: an entry matches its own frontend only. */
struct lb_src_range_key {
	__u32 prefixlen;
	__u32 frontend_id;
	__u8 addr[16];
};

/* (frontend ID, source prefix) -> 1: loadBalancerSourceRanges of the
 * frontends flagged LB_SVC_F_SRC_RANGE. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LK_LB_SRC_RANGES);
	__type(key, struct lb_src_range_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_src_range SEC(".maps");

/* lb_src_range_ok says whether a packet (or socket call) from saddr (v6:
 * 16 bytes; else an IPv4 address, 4 bytes) may reach frontend svc: always,
 * unless the frontend has source ranges and none holds saddr. Both
 * families, every packet (not only new flows: a range taken away stops
 * established flows too, as kube-proxy's firewall chain does). */
static __always_inline int lb_src_range_ok(const struct lb_svc_value *svc, int v6, const void *saddr)
{
	struct lb_src_range_key k = { .prefixlen = 32 + 128, .frontend_id = svc->frontend_id };

	if (!(svc->flags & LB_SVC_F_SRC_RANGE))
		return 1;
	if (v6) {
		__builtin_memcpy(k.addr, saddr, 16);
	} else {
		k.addr[10] = 0xff;
		k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], saddr, 4);
	}
	return bpf_map_lookup_elem(&lk_lb_src_range, &k) != 0;
}

#endif
