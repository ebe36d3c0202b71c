/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Constants shared with Go (pkg/datapath/datapath.go keeps the same numbers). */
#ifndef LK_CONSTS_H
#define LK_CONSTS_H

#define AF_INET 2

/* From linux/if_arp.h, which drags in libc headers. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

#define LK_MAX_ENDPOINTS 4096
#define LK_MAX_XSKS 1024

/* Drop reasons: datapath.DropReason. */
#define DROP_SPOOFED_MAC 1
#define DROP_SPOOFED_IP 2
#define DROP_UNKNOWN_EP 3
#define DROP_MALFORMED 4
#define DROP_TTL_EXCEEDED 5
#define DROP_FIB_FAILED 6
#define DROP_REDIRECT 7
#define DROP_UNSUPPORTED_L3 8
#define DROP_NO_SOCKET 9 /* VM frame, but no AF_XDP socket for its queue (backend down) */
#define DROP_NOT_FOR_VM 10 /* unicast frame for another MAC on a VM device */

/* Metric kinds: the "kind" half of struct metrics_key. */
#define METRIC_FROM_EP 0 /* packets the endpoint sent */
#define METRIC_TO_EP 1 /* packets delivered to the endpoint */
#define METRIC_DROP_BASE 0x100 /* + drop reason */

/* Redirect kinds recorded by the test trace (struct redirect_trace). */
#define REDIR_PLAIN 1 /* bpf_redirect */
#define REDIR_PEER 2 /* bpf_redirect_peer */
#define REDIR_NEIGH 3 /* bpf_redirect_neigh */
#define REDIR_XSK 4 /* bpf_redirect_map into an XSKMAP */

/* endpoint_info.flags */
#define EP_F_VM 1 /* a VM's device: native XDP into AF_XDP on the far end */

#endif
