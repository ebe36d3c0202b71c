//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* vm.c: XDP on a VM's endpoint device (eth0 in the VM's pod netns), attached
 * in native (driver) mode. Every frame for the VM arrives through the host end's
 * transmit path (from_pod/from_uplink redirect there; the host stack routes
 * there), where GSO packets are segmented and partial checksums completed, so
 * the guest gets whole frames. Each frame goes to the AF_XDP socket bound to its
 * rx queue; the lanekit-vhost backend moves it into the guest's virtio queue.
 *
 * When the VM's guest configured hashing (RSS_CONFIG / HASH_CONFIG, written
 * by the backend into the VM's lk_rss_vms entry, see lib/vm_rss.h), each frame
 * carries struct lk_xsk_meta in front of it: the Toeplitz hash over the types
 * the guest enabled and its report type. AF_XDP copies the metadata area into
 * the UMEM headroom in front of the frame, where the backend reads it for
 * virtio_net_hdr_v1_hash. The rx queue itself was chosen before the device's
 * transmit (lib/fib.h deliver_local): a socket only takes frames of the queue
 * it is bound to, so this program cannot move a frame to another queue.
 *
 * One program instance per VM: the VM's identity is load-time settings, not a
 * map entry, so nothing is keyed by an ifindex (which is only unique within a
 * netns). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "lib/consts.h"
#include "lib/structs.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/events.h"
#include "lib/vm_rss.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* AF_XDP sockets of every VM: slot = vm_xsk_base + rx queue. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, LK_MAX_XSKS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lk_xsks SEC(".maps");

/* Load-time settings: the VM this instance serves. */
const volatile __u32 vm_id = 0; /* the VM's endpoint id (counters) */
const volatile __u32 vm_xsk_base = 0; /* its first slot in lk_xsks */
const volatile __u32 vm_queues = 0; /* its queue pairs: one socket each */
const volatile __u8 vm_mac[ETH_ALEN] = {}; /* unicast frames for other MACs are not its */

/* is_vm_mac compares with the load-time MAC. Each byte is read through the
 * volatile object: a cast to a plain pointer would let the compiler fold the
 * zero initializer in. */
static __always_inline int is_vm_mac(const __u8 *mac)
{
	for (int i = 0; i < ETH_ALEN; i++)
		if (mac[i] != vm_mac[i])
			return 0;
	return 1;
}

static __always_inline int xdp_drop(struct xdp_md *ctx, __u32 reason)
{
	metrics_add(vm_id, METRIC_DROP_BASE + reason, ctx->data_end - ctx->data);
	event_drop(reason, vm_id, ctx->ingress_ifindex, ctx->data_end - ctx->data,
		   (void *)(long)ctx->data, (void *)(long)ctx->data_end);
	return XDP_DROP;
}

/* put_meta writes the frame's hash in front of it (struct lk_xsk_meta) when
 * the guest configured hashing. A frame without metadata tells the backend
 * "no hash" (it checks the magic), so failing here only loses the report. */
static __always_inline void put_meta(struct xdp_md *ctx)
{
	struct lk_rss_input in = {};
	struct lk_xsk_meta *meta;
	struct lk_vm_rss_cfg *cfg;
	__u32 hash = 0, report = VIRTIO_NET_HASH_REPORT_NONE;
	void *data;

	cfg = lk_vm_rss_get(vm_id);
	if (!cfg)
		return;
	if (!lk_rss_input_xdp(ctx, cfg->hash_types, &in)) {
		hash = lk_toeplitz(&cfg->key, in.bytes, in.len);
		report = in.report;
	}
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)))
		return;
	meta = (void *)(long)ctx->data_meta;
	data = (void *)(long)ctx->data;
	if ((void *)(meta + 1) > data)
		return;
	meta->hash = hash;
	meta->report = report;
	meta->magic = LK_XSK_META_MAGIC;
}

SEC("xdp")
int steer_vm(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 q, slot;

	if (!vm_queues)
		return XDP_PASS; /* not configured for a VM */
	if ((void *)(eth + 1) > data_end)
		return xdp_drop(ctx, DROP_MALFORMED);
	/* Broadcast and multicast (ARP requests...) are the VM's too. */
	if (!(eth->h_dest[0] & 1) && !is_vm_mac(eth->h_dest))
		return xdp_drop(ctx, DROP_NOT_FOR_VM);

	q = ctx->rx_queue_index;
	if (q >= vm_queues) /* a socket only takes frames of the queue it is bound to */
		return xdp_drop(ctx, DROP_NO_SOCKET);
	slot = vm_xsk_base + q;
	trace_redirect(slot, REDIR_XSK, q);
	if (!bpf_map_lookup_elem(&lk_xsks, &slot))
		return xdp_drop(ctx, DROP_NO_SOCKET);
	put_meta(ctx);
	return bpf_redirect_map(&lk_xsks, slot, XDP_DROP);
}

/* vm_rx_drop: tcx ingress of the VM's device when its backend receives through
 * the kernel (lanekit-vhost --rx-gso kernel, datapath SetVMRx): there is no XDP
 * program then, so the veth keeps GSO, and the backend's AF_PACKET sockets (one
 * per queue, PACKET_FANOUT_QM) take every frame whole from the packet taps,
 * which run before tcx ingress. Everything is dropped here afterwards: the VM
 * netns' own stack must never answer for the VM (ARP, ICMP, TCP resets). */
SEC("tcx/ingress")
int vm_rx_drop(struct __sk_buff *skb)
{
	return TC_ACT_SHOT;
}
