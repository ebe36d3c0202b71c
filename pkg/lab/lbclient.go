package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/lanekit/lanekit/pkg/lbipam"
)

// The lab's LoadBalancer clients sit outside the cluster's network, as a
// bare-metal cluster's clients reach it through a router: the underlay
// namespace (where the e2e runner and hand-run clients live) reaches the
// LoadBalancer pool from ExternalClientIP, an address of ExternalClientNet,
// which no node has on a link and every node routes to the router. A pod
// behind an externalTrafficPolicy Local Service then sees a client outside
// the nodes' subnet, as the upstream tests require (source IP preserved,
// told apart from a node's address).
const (
	ExternalClientIP  = "10.78.0.254"
	ExternalClientNet = "10.78.0.0/24"
)

// routeLBClients adds ExternalClientIP to the underlay namespace, a route
// for each CIDR of the pool's IPv4 ranges from it, and on every node
// namespace the route back through the router (APIAddress, the underlay
// namespace's own address). IPv6 pool ranges stay reached from the
// underlay's own address.
func routeLBClients(ctx context.Context, pool string) error {
	var prefixes []netip.Prefix
	for _, part := range strings.Split(pool, ",") {
		r, err := lbipam.ParseRange(part)
		if err != nil {
			return fmt.Errorf("--lb-pool: %w", err)
		}
		if r.First.Is4() {
			prefixes = append(prefixes, r.Prefixes()...)
		}
	}
	if len(prefixes) == 0 {
		return nil
	}
	steps := [][]string{{"-n", WireNS, "addr", "replace", ExternalClientIP + "/32", "dev", "lo"}}
	for _, p := range prefixes {
		steps = append(steps, []string{"-n", WireNS, "route", "replace", p.String(), "dev", WireBridge, "src", ExternalClientIP})
	}
	for i := 1; netnsExists(NodeNS(i)); i++ {
		steps = append(steps, []string{"-n", NodeNS(i), "route", "replace", ExternalClientNet, "via", APIAddress, "dev", Uplink})
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("LoadBalancer clients' routes: %w", err)
		}
	}
	return nil
}
