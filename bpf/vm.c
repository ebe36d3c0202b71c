//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* vm.c: XDP on a VM's endpoint device (eth0 in the VM's pod netns), attached
 * in native (driver) mode. Every frame for the VM arrives through the host end's
 * transmit path (from_pod/from_uplink redirect there; the host stack routes
 * there), where GSO packets are segmented and partial checksums completed, so
 * the guest gets whole frames. Each frame goes to the AF_XDP socket bound to its
 * rx queue; the lanekit-vhost backend moves it into the guest's virtio queue. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

#include "lib/consts.h"
#include "lib/structs.h"
#include "lib/maps.h"
#include "lib/parse.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* AF_XDP sockets of every VM: slot = vm_info.xsk_base + rx queue. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, LK_MAX_XSKS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_xsks SEC(".maps");

/* VMs by the ifindex of their endpoint device. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LK_MAX_VMS);
	__type(key, __u32);
	__type(value, struct vm_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_vms SEC(".maps");

static __always_inline int xdp_drop(struct xdp_md *ctx, __u32 vm_id, __u32 reason)
{
	metrics_add(vm_id, METRIC_DROP_BASE + reason, ctx->data_end - ctx->data);
	return XDP_DROP;
}

SEC("xdp")
int steer_vm(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 ifindex = ctx->ingress_ifindex;
	struct vm_info *vm = bpf_map_lookup_elem(&lk_vms, &ifindex);
	struct ethhdr *eth = data;
	__u32 q, slot;

	if (!vm)
		return XDP_PASS; /* not a VM device (yet): leave it to the stack */
	if ((void *)(eth + 1) > data_end)
		return xdp_drop(ctx, vm->id, DROP_MALFORMED);
	/* Broadcast and multicast (ARP requests...) are the VM's too. */
	if (!(eth->h_dest[0] & 1) && !mac_equal(eth->h_dest, vm->mac))
		return xdp_drop(ctx, vm->id, DROP_NOT_FOR_VM);

	q = ctx->rx_queue_index;
	if (q >= vm->queues) /* a socket only takes frames of the queue it is bound to */
		return xdp_drop(ctx, vm->id, DROP_NO_SOCKET);
	slot = vm->xsk_base + q;
	trace_redirect(slot, REDIR_XSK);
	if (!bpf_map_lookup_elem(&lk_xsks, &slot))
		return xdp_drop(ctx, vm->id, DROP_NO_SOCKET);
	return bpf_redirect_map(&lk_xsks, slot, XDP_DROP);
}
