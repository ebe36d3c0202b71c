package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/lanekit/lanekit/pkg/bench"
)

// The service rows' baseline nodes: one node netns per (kube-proxy mode,
// service count), so each holds exactly one ruleset, wired onto the lab's
// underlay like a node, with one client pod behind a veth. The backends are
// the lab's baseline pods on node 2, which routes the client ranges back.
const (
	// SvcClusterCIDR is the cluster CIDR the kube-proxy rules are given:
	// the lab's pod ranges (10.244-10.245) and the service clients'
	// (10.246), so pod clients are not masqueraded.
	SvcClusterCIDR = "10.244.0.0/14"
	svcNodeFirstIP = 220 // underlay 10.77.0.221 and up
	maxSvcNodes    = 30
)

// SvcNodeNS and SvcClientNS are baseline service node k's namespaces, named
// like pods of a node 0 the lab never has, so that `lab down` removes them
// with the rest if a bench was killed before its cleanup.
func SvcNodeNS(k int) string   { return fmt.Sprintf("lk-n0-s%d", k) }
func SvcClientNS(k int) string { return fmt.Sprintf("lk-n0-c%d", k) }

func svcClientNet(k int) string    { return fmt.Sprintf("10.246.%d.0/24", k) }
func svcClientGW(k int) string     { return fmt.Sprintf("10.246.%d.1", k) }
func svcClientIP(k int) string     { return fmt.Sprintf("10.246.%d.2", k) }
func svcNodeUnderlay(k int) string { return fmt.Sprintf("10.77.0.%d", svcNodeFirstIP+k) }

// Labels of the service rows.
var (
	IncludesSvcIptables = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "client pod veth -> node netns with only kube-proxy iptables-mode rules (iptables-nft; a stand-in: rules rendered by pkg/bench, not kube-proxy; the real one: lab bench --cni): KUBE-SERVICES walk, statistic, DNAT; forwarded to node 2's bridge pods"}
	IncludesSvcNftables = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "client pod veth -> node netns with only kube-proxy nftables-mode rules (a stand-in: rendered by pkg/bench, not kube-proxy; the real one: lab bench --cni): service-ips vmap, numgen vmap, dnat; forwarded to node 2's bridge pods"}
)

// SvcBench describes the service rows the lab offers.
type SvcBench struct {
	Counts []int    // service counts, e.g. 10, 1000, 10000
	Modes  []string // bench.SvcMode*
}

// ServiceRows builds the namespaces of the baseline service rows and
// returns every row (baselines first) with a cleanup that removes what it
// built; it removes leftovers of an earlier run first. On error nothing it
// built stays. The second value lists rows skipped and why.
func (s *State) ServiceRows(ctx context.Context, b SvcBench) ([]bench.SvcPath, []string, func(), error) {
	if len(s.Nodes) < 2 {
		return nil, nil, func() {}, errors.New("services bench: the lab has fewer than 2 nodes")
	}
	cleanSvcNodes(ctx, s.Nodes[1].NS)
	var built []int
	var paths []bench.SvcPath
	cleanup := func() {
		for _, k := range built {
			removeSvcNode(context.WithoutCancel(ctx), s.Nodes[1].NS, k)
		}
		for _, p := range paths {
			for _, prog := range []bench.SvcProgrammer{p.Prog, p.Datapath} {
				if c, ok := prog.(interface{ Close() }); ok {
					c.Close()
				}
			}
		}
	}
	cidr := netip.MustParsePrefix(SvcClusterCIDR)
	var skipped []string
	var agentProg *AgentProgrammer // the lanekit rows' (pod and host clients)
	k := 0
	for _, mode := range b.Modes {
		base, host := bench.SvcBaseMode(mode)
		if base == bench.SvcModeLanekit {
			if agentProg == nil {
				agentProg = &AgentProgrammer{Socket: AgentSocket(s.Nodes[0].Index)}
			}
			rows, why := s.lanekitSvcRows(b.Counts, cidr, host, agentProg)
			paths = append(paths, rows...)
			if why != "" {
				skipped = append(skipped, why)
			}
			continue
		}
		inc := IncludesSvcIptables
		if base == bench.SvcModeNftables {
			inc = IncludesSvcNftables
		} else if base != bench.SvcModeIptables {
			cleanup()
			return nil, nil, func() {}, fmt.Errorf("services bench: unknown mode %q", mode)
		}
		if host {
			inc.Detail = hostClientDetail(inc.Detail)
		}
		backends := svcBackends(s.Nodes[1], KindBaseline)
		if len(backends) == 0 {
			skipped = append(skipped, fmt.Sprintf("%s: no baseline pods on %s", mode, s.Nodes[1].NS))
			continue
		}
		for _, n := range b.Counts {
			k++
			if k > maxSvcNodes {
				cleanup()
				return nil, nil, func() {}, fmt.Errorf("services bench: more than %d baseline rows", maxSvcNodes)
			}
			built = append(built, k)
			if err := buildSvcNode(ctx, s.Nodes[1], k); err != nil {
				cleanup()
				return nil, nil, func() {}, err
			}
			client := SvcClientNS(k)
			if host {
				client = SvcNodeNS(k) // a process of the node: nat OUTPUT
			}
			paths = append(paths, bench.SvcPath{Mode: mode, Services: n, ClientNS: client, NodeNS: SvcNodeNS(k),
				Backends: backends, ClusterCIDR: cidr, Includes: inc, Raw: s.svcRaw(),
				Prog: bench.RuleProgrammer{NS: SvcNodeNS(k), Mode: base}})
		}
	}
	return paths, skipped, cleanup, nil
}

// hostClientDetail turns a pod-client row's description into its
// host-client row's.
func hostClientDetail(d string) string {
	_, rest, _ := strings.Cut(d, "->")
	return "client process in the node netns (the node, a hostNetwork pod) ->" + rest
}

// svcBackends are the pods of a kind on node n (the service's real
// endpoints).
func svcBackends(n Node, kind string) []bench.SvcBackend {
	var out []bench.SvcBackend
	for _, p := range n.Pods {
		if ip, err := netip.ParseAddr(p.IP); err == nil && p.Kind == kind {
			out = append(out, bench.SvcBackend{NS: p.NS, IP: ip})
		}
	}
	return out
}

// buildSvcNode creates baseline service node k and its client pod, and the
// route back on the backends' node.
func buildSvcNode(ctx context.Context, server Node, k int) error {
	node, client := SvcNodeNS(k), SvcClientNS(k)
	for _, ns := range []string{node, client} {
		if err := addNetns(ctx, ns); err != nil {
			return fmt.Errorf("services bench: %s: %w", ns, err)
		}
	}
	wirePort := fmt.Sprintf("lk-wsb%d", k)
	steps := [][]string{
		{"link", "add", "name", Uplink, "netns", node, "type", "veth", "peer", "name", wirePort, "netns", WireNS},
		{"-n", WireNS, "link", "set", wirePort, "master", WireBridge, "up"},
		{"-n", node, "addr", "add", svcNodeUnderlay(k) + "/24", "dev", Uplink},
		{"-n", node, "link", "set", Uplink, "up"},
		{"-n", node, "route", "add", server.BaseCIDR, "via", server.UnderlayIP, "dev", Uplink},
		// A default route, as real nodes have: a process of the node
		// (the -host rows) connecting to a VIP needs a route to it before
		// nat OUTPUT rewrites the destination (a pod's packet is DNATed in
		// PREROUTING, before routing, and needs none).
		{"-n", node, "route", "add", "default", "via", server.UnderlayIP, "dev", Uplink},
		{"link", "add", "name", PodIfName, "netns", client, "type", "veth", "peer", "name", "pod0", "netns", node},
		{"-n", node, "addr", "add", svcClientGW(k) + "/24", "dev", "pod0"},
		{"-n", node, "link", "set", "pod0", "up"},
		{"-n", client, "addr", "add", svcClientIP(k) + "/24", "dev", PodIfName},
		{"-n", client, "link", "set", PodIfName, "up"},
		{"-n", client, "route", "add", "default", "via", svcClientGW(k)},
		{"-n", server.NS, "route", "add", svcClientNet(k), "via", svcNodeUnderlay(k), "dev", Uplink},
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("services bench: node %s: %w", node, err)
		}
	}
	if err := sysctl(ctx, node, "net.ipv4.ip_forward", "1"); err != nil {
		return fmt.Errorf("services bench: node %s: %w", node, err)
	}
	return nil
}

// removeSvcNode deletes service node k's namespaces (its veths go with
// them) and the route back on the server node (best effort).
func removeSvcNode(ctx context.Context, serverNS string, k int) {
	_ = ip(ctx, "-n", serverNS, "route", "del", svcClientNet(k))
	for _, ns := range []string{SvcClientNS(k), SvcNodeNS(k)} {
		if netnsExists(ns) {
			_ = ip(ctx, "netns", "del", ns)
		}
	}
}

// cleanSvcNodes removes service nodes and routes an earlier run left.
func cleanSvcNodes(ctx context.Context, serverNS string) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "lk-n0-s") || strings.HasPrefix(e.Name(), "lk-n0-c") {
			_ = ip(ctx, "netns", "del", e.Name())
		}
	}
	out, err := run(ctx, "ip", "-n", serverNS, "-4", "route", "show", "root", "10.246.0.0/16")
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			_ = ip(ctx, "-n", serverNS, "route", "del", f[0])
		}
	}
}
