/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb6_maps.h: the IPv6 service tables (lb6.h explains them), apart so that
 * the socket load balancer (sock.h) shares them without the packet path.
 * The structs mirror pkg/service's *6 types 1:1. */
#ifndef LK_LB6_MAPS_H
#define LK_LB6_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "lb_maps.h"

/* service.ServiceKey6 */
struct lb_svc6_key {
	__u8 addr[16];
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 scope; /* LB_SCOPE_* */
};

/* service.BackendValue6 (key: the backend ID, __u32) */
struct lb_backend6_value {
	__u8 addr[16];
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 state; /* service.BackendState */
	__u32 frontend_id;
};

/* service.RevNatValue6 (key: the frontend ID, __u32) */
struct lb_revnat6_value {
	__u8 addr[16];
	__u16 port; /* host byte order */
	__u16 pad;
};

struct lb_affinity6_key {
	__u8 client[16];
	__u32 frontend_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_FRONTENDS);
	__type(key, struct lb_svc6_key);
	__type(value, struct lb_svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_svc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend6_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_backends6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_LB_FRONTENDS);
	__type(key, __u32);
	__type(value, struct lb_revnat6_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_revnat6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LK_LB_AFFINITY);
	__type(key, struct lb_affinity6_key);
	__type(value, struct lb_affinity_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_lb_affinity6 SEC(".maps");

#endif
