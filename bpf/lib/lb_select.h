/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_select.h: choosing a service backend (affinity, then Maglev over a flow
 * hash) on the maps in lb_maps.h. Shared by the packet path (lb.h) and the
 * socket path (sock.h), so both pick backends the same way from the same
 * state. Needs no packet and no conntrack map. */
#ifndef LK_LB_SELECT_H
#define LK_LB_SELECT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "consts.h"
#include "structs.h"
#include "lb_maps.h"

static __always_inline void lb_stat(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&lk_lb_stats, &which);

	if (v)
		(*v)++;
}

/* jhash_3words (Bob Jenkins, as in the kernel's jhash.h). */
static __always_inline __u32 lb_rol32(__u32 w, int s)
{
	return (w << s) | (w >> (32 - s));
}

static __always_inline __u32 lb_flow_hash(const struct ct_key *t)
{
	__u32 a = t->saddr, b = t->daddr, c = ((__u32)t->sport << 16) | t->dport;

	a += 0xdeadbeef + 12 + t->proto;
	b += 0xdeadbeef + 12;
	c += 0xdeadbeef + 12;
	c ^= b; c -= lb_rol32(b, 14);
	a ^= c; a -= lb_rol32(c, 11);
	b ^= a; b -= lb_rol32(a, 25);
	c ^= b; c -= lb_rol32(b, 16);
	a ^= c; a -= lb_rol32(c, 4);
	b ^= a; b -= lb_rol32(a, 14);
	c ^= b; c -= lb_rol32(b, 24);
	return c;
}

/* lb_backend returns backend id if it exists and belongs to the frontend. */
static __always_inline struct lb_backend_value *lb_backend(__u32 id, __u32 frontend_id)
{
	struct lb_backend_value *be = bpf_map_lookup_elem(&lk_lb_backends, &id);

	if (be && be->frontend_id != frontend_id)
		return 0;
	return be;
}

/* lb_maglev_pick returns the backend ID in slot hash % size of frontend
 * svc's Maglev table (0: none), for either family (lb6.h). */
static __always_inline __u32 lb_maglev_pick(const struct lb_svc_value *svc, __u32 hash)
{
	__u32 slot, *idp;
	void *table;

	if (!svc->maglev_size)
		return 0;
	table = bpf_map_lookup_elem(&lk_lb_maglev, &svc->frontend_id);
	if (!table)
		return 0;
	slot = hash % svc->maglev_size;
	idp = bpf_map_lookup_elem(table, &slot);
	if (!idp) {
		/* A smaller table was swapped in and the service value (its
		 * size) is not updated yet: every table has at least
		 * LB_MAGLEV_FLOOR slots (service.MaglevFloor). */
		slot = hash % LB_MAGLEV_FLOOR;
		idp = bpf_map_lookup_elem(table, &slot);
		if (!idp)
			return 0;
	}
	return *idp;
}

/* lb_select chooses a backend for a new flow: the client's affinity entry
 * (fresh, active backend) or Maglev. Returns the backend ID, 0 for none. */
static __always_inline __u32 lb_select(const struct lb_svc_value *svc, const struct ct_key *t,
				       struct lb_backend_value **out)
{
	struct lb_affinity_key ak = { .client = t->saddr, .frontend_id = svc->frontend_id };
	struct lb_affinity_value *av = 0;
	struct lb_backend_value *be;
	__u64 now = bpf_ktime_get_ns();
	__u32 id;

	if (svc->flags & LB_SVC_F_AFFINITY) {
		av = bpf_map_lookup_elem(&lk_lb_affinity, &ak);
		if (av && now - av->last_used <= (__u64)svc->affinity_seconds * 1000000000ULL) {
			id = av->backend_id;
			be = lb_backend(id, svc->frontend_id);
			if (be && be->state == LB_BACKEND_ACTIVE) {
				av->last_used = now;
				lb_stat(LB_STAT_AFFINITY);
				*out = be;
				return id;
			}
		}
	}
	id = lb_maglev_pick(svc, lb_flow_hash(t));
	if (!id)
		return 0;
	be = lb_backend(id, svc->frontend_id);
	if (!be)
		return 0;
	if (svc->flags & LB_SVC_F_AFFINITY) {
		struct lb_affinity_value nv = { .last_used = now, .backend_id = id };

		bpf_map_update_elem(&lk_lb_affinity, &ak, &nv, BPF_ANY);
	}
	*out = be;
	return id;
}

#endif
