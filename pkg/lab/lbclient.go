package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/lanekit/lanekit/pkg/lbipam"
)

// The lab's LoadBalancer clients sit outside the cluster's network, as a
// bare-metal cluster's clients reach it through a router: the underlay
// namespace (where the e2e runner and hand-run clients live) reaches the
// LoadBalancer pool from ExternalClientIP (IPv4 ranges) or ExternalClientIP6
// (IPv6 ranges, a dual-stack lab), addresses of ExternalClientNet(6), which
// no node has on a link and every node routes to the router. A pod behind an
// externalTrafficPolicy Local Service then sees a client outside the nodes'
// subnet, as the upstream tests require (source IP preserved, told apart
// from a node's address).
const (
	ExternalClientIP   = "10.78.0.254"
	ExternalClientNet  = "10.78.0.0/24"
	ExternalClientIP6  = "fd00:78::fe"
	ExternalClientNet6 = "fd00:78::/64"
)

// LabLBPool is the LoadBalancer pool `make conformance` and the real-node
// tests give the lab (lab up --lb-pool), on the underlay's IPv4 subnet;
// LabLBPool6 the IPv6 range a dual-stack lab adds (on the underlay's IPv6
// subnet, answered by NDP).
const (
	LabLBPool  = "10.77.0.200-10.77.0.239"
	LabLBPool6 = "fd00:77::c8-fd00:77::ef"
)

// lbPoolRanges parses a --lb-pool value: ranges (a CIDR or FIRST-LAST)
// separated by commas.
func lbPoolRanges(pool string) ([]lbipam.Range, error) {
	var out []lbipam.Range
	for _, part := range strings.Split(pool, ",") {
		r, err := lbipam.ParseRange(part)
		if err != nil {
			return nil, fmt.Errorf("--lb-pool: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// routeLBClients adds the external client addresses to the underlay
// namespace, a route for each CIDR of the pool's ranges from the client of
// its family, and on every node namespace the route back through the
// router (APIAddress or WireIP6, the underlay namespace's own addresses).
func routeLBClients(ctx context.Context, ranges []lbipam.Range) error {
	var steps [][]string
	for _, fam := range []struct {
		v6          bool
		client, net string
	}{{false, ExternalClientIP, ExternalClientNet}, {true, ExternalClientIP6, ExternalClientNet6}} {
		var prefixes []netip.Prefix
		for _, r := range ranges {
			if r.First.Is6() == fam.v6 {
				prefixes = append(prefixes, r.Prefixes()...)
			}
		}
		if len(prefixes) == 0 {
			continue
		}
		plen, f := "/32", "-4"
		if fam.v6 {
			plen, f = "/128", "-6"
		}
		addr := []string{"-n", WireNS, f, "addr", "replace", fam.client + plen, "dev", "lo"}
		if fam.v6 {
			addr = append(addr, "nodad") // no tentative window (a tentative address is no route's src)
		}
		steps = append(steps, addr)
		for _, p := range prefixes {
			steps = append(steps, []string{"-n", WireNS, f, "route", "replace", p.String(), "dev", WireBridge, "src", fam.client})
		}
		for i := 1; netnsExists(NodeNS(i)); i++ {
			steps = append(steps, routeViaRouter(NodeNS(i), netip.MustParsePrefix(fam.net)))
		}
	}
	for _, args := range steps {
		if err := ipSrcRoute(ctx, args...); err != nil {
			return fmt.Errorf("LoadBalancer clients' routes: %w", err)
		}
	}
	return nil
}

// routeViaRouter is the `ip` arguments of node namespace ns's route for p
// through the underlay's router, the underlay namespace's own address of p's
// family (APIAddress or WireIP6).
func routeViaRouter(ns string, p netip.Prefix) []string {
	if p.Addr().Is6() {
		return []string{"-n", ns, "-6", "route", "replace", p.String(), "via", WireIP6, "dev", Uplink}
	}
	return []string{"-n", ns, "-4", "route", "replace", p.String(), "via", APIAddress, "dev", Uplink}
}

// ipSrcRoute runs ip and, while the kernel refuses a route's src as
// "Invalid source address", tries again for up to 3 s: an IPv6 address is
// no route's source until it leaves the tentative state, which the kernel
// settles in a work item after the address is added or replaced (CI saw
// the refusal once, on a reinstall that replaced the address).
func ipSrcRoute(ctx context.Context, args ...string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := ip(ctx, args...)
		if err == nil || !strings.Contains(err.Error(), "Invalid source address") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
