package lab

import (
	"context"
	"fmt"

	"github.com/lanekit/lanekit/pkg/bench"
)

// The IPv6 rows of `lab bench` (issue 25) in a lab with IPv6 (dual or
// ipv6): host-raw-ipv6 between the raw hosts' IPv6 addresses (the IPv6
// physical limit, the reference of the IPv6 rows) and lanekit-pod-ipv6
// between lanekit pods' IPv6 addresses, measured by the same harness in
// the same repetitions as the IPv4 rows.

// Row names of the IPv6 rows (the bench JSON's "path").
const (
	BenchRawIPv6        = bench.RawPath6     // "host-raw-ipv6"
	BenchLanekitPodIPv6 = "lanekit-pod-ipv6" // lanekit pod -> lanekit pod over IPv6
)

// RawIP6 is raw host i's IPv6 underlay address.
func RawIP6(i int) string { return fmt.Sprintf("fd00:77::f%x", i) }

// buildRawHostIPv6 gives raw host i its IPv6 address on the wire.
func buildRawHostIPv6(ctx context.Context, i int) error {
	ns := RawNS(i)
	for _, kv := range [][2]string{{"net.ipv6.conf.all.disable_ipv6", "0"}, {"net.ipv6.conf." + Uplink + ".disable_ipv6", "0"}} {
		if err := sysctl(ctx, ns, kv[0], kv[1]); err != nil {
			return fmt.Errorf("raw host %s: %w", ns, err)
		}
	}
	if err := ip(ctx, "-n", ns, "-6", "addr", "add", RawIP6(i)+"/64", "dev", Uplink, "nodad"); err != nil {
		return fmt.Errorf("raw host %s: %w", ns, err)
	}
	return nil
}

// ipv6BenchPaths are the IPv6 rows between nodes n1 and n2, and the rows
// skipped with the reason.
func (s *State) ipv6BenchPaths(n1, n2 Node) ([]bench.Path, []string) {
	if !s.HasIPv6() {
		return nil, nil
	}
	var paths []bench.Path
	var skipped []string
	if n1.RawIP6 != "" && n2.RawIP6 != "" {
		paths = append(paths, bench.Path{Name: BenchRawIPv6, ClientNS: n1.RawNS, ServerNS: n2.RawNS, ServerIP: n2.RawIP6,
			Includes: IncludesRaw6})
	} else {
		skipped = append(skipped, BenchRawIPv6+": the raw hosts have no IPv6 addresses (a lab brought up by an older lanekit)")
	}
	c, okc := firstPod6(n1)
	sv, oks := firstPod6(n2)
	if okc && oks {
		paths = append(paths, bench.Path{Name: BenchLanekitPodIPv6, ClientNS: c.NS, ServerNS: sv.NS, ServerIP: sv.IP6,
			Includes: IncludesLanekitPod6})
	} else {
		skipped = append(skipped, fmt.Sprintf("%s: no lanekit pods with IPv6 on %s and %s", BenchLanekitPodIPv6, n1.NS, n2.NS))
	}
	// The baseline (bridge + host-local) pods are IPv4 only in the lab.
	skipped = append(skipped, "bridge-iptables-ipv6: the lab's bridge + host-local baseline pods have IPv4 only")
	return paths, skipped
}

// Labels of the IPv6 rows.
var (
	IncludesRaw6        = bench.Includes{Detail: "raw hosts on the wire bridge over IPv6, no rules: the IPv6 physical limit"}
	IncludesLanekitPod6 = bench.Includes{BPF: true,
		Detail: "lanekit pods over IPv6: tcx from_pod6 bpf_fib_lookup(AF_INET6) + redirect, from_uplink6 redirect_peer"}
)

func firstPod6(n Node) (Pod, bool) {
	for _, p := range n.Pods {
		if p.Kind == KindLanekit && p.IP6 != "" {
			return p, true
		}
	}
	return Pod{}, false
}
