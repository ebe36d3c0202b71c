package lab

import (
	"context"
	"fmt"
	"io"

	"github.com/lanekit/lanekit/pkg/bench"
)

// RoutingBenchGroups returns one bench group per routing mode (lab bench
// --routing native,tunnel): each brings up a two-node lab with one pod of
// each kind per node in that mode (native: the bridged underlay; tunnel:
// the routed one, whose baseline is the flannel-style kernel VXLAN), offers
// its rows (host-raw, host, the baseline, lanekit) and takes the lab down
// again. bench.RunGroups interleaves them per repetition. out gets the
// labs' progress lines (nil: none).
func RoutingBenchGroups(bins Bins, routings []string, out io.Writer) ([]bench.Group, error) {
	if len(routings) == 0 {
		return nil, fmt.Errorf("--routing: name at least one mode")
	}
	seen := map[string]bool{}
	var groups []bench.Group
	for _, r := range routings {
		if r != RoutingNative && r != RoutingTunnel {
			return nil, fmt.Errorf("--routing %q: want native or tunnel", r)
		}
		if seen[r] {
			return nil, fmt.Errorf("--routing %s named twice", r)
		}
		seen[r] = true
		cfg := Config{Nodes: 2, PodsPerNode: 1, Routing: r, Bins: bins, Out: out}
		groups = append(groups, bench.Group{Name: r,
			Up: func(ctx context.Context) ([]bench.Path, []string, error) {
				st, err := Up(ctx, cfg)
				if err != nil {
					return nil, nil, err
				}
				paths, skipped := st.BenchPaths()
				return paths, skipped, nil
			},
			Down: func(ctx context.Context) error { return Down(ctx, DownOptions{Bins: bins}) },
		})
	}
	return groups, nil
}

// RoutingCross are the cross-row ratios of a --routing run: the tunnel's
// rows against the native lab's (same repetition), and lanekit's tunnel
// against the kernel's own VXLAN (same lab).
var RoutingCross = []bench.CrossRef{
	{Path: BenchLanekitTunnel, Group: RoutingTunnel, Ref: "lanekit-pod", RefGroup: RoutingNative},
	{Path: BenchLanekitTunnel, Group: RoutingTunnel, Ref: BenchFlannelVXLAN, RefGroup: RoutingTunnel},
	{Path: BenchFlannelVXLAN, Group: RoutingTunnel, Ref: "bridge-iptables", RefGroup: RoutingNative},
	{Path: bench.RawPath, Group: RoutingTunnel, Ref: bench.RawPath, RefGroup: RoutingNative},
}
