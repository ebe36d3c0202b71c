package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// printRouting prints the routing mode, the tunnel's node map and counters,
// and the encryption facilities (`lanekit status`).
func printRouting(out io.Writer, r *apiv1.RoutingStatus) {
	if r == nil {
		return
	}
	switch r.GetMode() {
	case "tunnel":
		fmt.Fprintf(out, "routing:      tunnel (VXLAN %s, UDP %d), pod MTU %d\n", r.GetTunnelDevice(), r.GetTunnelPort(), r.GetPodMtu())
		for _, n := range r.GetTunnelNodes() {
			if n.GetSelf() {
				fmt.Fprintf(out, "  node:       %s (this node)\n", n.GetPodCidr())
				continue
			}
			fmt.Fprintf(out, "  node:       %s via %s\n", n.GetPodCidr(), n.GetUnderlay())
		}
		var names []string
		for k := range r.GetTunnelCounters() {
			names = append(names, k)
		}
		sort.Strings(names)
		var parts []string
		for _, k := range names {
			parts = append(parts, fmt.Sprintf("%s=%d", k, r.GetTunnelCounters()[k]))
		}
		if len(parts) > 0 {
			fmt.Fprintf(out, "  counters:   %s\n", strings.Join(parts, " "))
		}
	default:
		fmt.Fprintf(out, "routing:      %s, pod MTU %d\n", r.GetMode(), r.GetPodMtu())
	}
	if e := r.GetError(); e != "" {
		fmt.Fprintf(out, "  error:      %s\n", e)
	}
	if b := r.GetBigTcp(); b != nil {
		size := func(n uint32) string {
			if n == 0 {
				return "64 KiB (off)"
			}
			return fmt.Sprintf("%d KiB", n/1024)
		}
		fmt.Fprintf(out, "BIG TCP:      IPv4 %s, IPv6 %s: %s\n", size(b.GetIpv4MaxSize()), size(b.GetIpv6MaxSize()), b.GetDetail())
	}
	if b := r.GetBandwidth(); b != "" {
		fmt.Fprintf(out, "bandwidth:    %s\n", b)
	}
	enc := func(name string, f *apiv1.Feature) string {
		if f.GetSupported() {
			return name + " available in the kernel (not implemented by lanekit)"
		}
		return name + " unavailable (" + f.GetDetail() + ")"
	}
	fmt.Fprintf(out, "encryption:   none; %s; %s\n", enc("IPsec/ESP", r.GetIpsec()), enc("WireGuard", r.GetWireguard()))
}
