package lab

import (
	"context"
	"fmt"
	"os"

	"github.com/lanekit/lanekit/pkg/bench"
)

// Routing modes of the lab's agents (Config.Routing, lab up --routing).
const (
	RoutingNative = "native" // today's lab: one bridged underlay, routes to every pod CIDR
	RoutingTunnel = "tunnel" // agents in tunnel mode on a routed underlay
)

// Underlays (Config.Underlay): a bridged one (every node on one subnet, with
// routes to each other's pod CIDRs) or a routed one, where every node (and
// raw host) has a /32 of its own, same addresses as the bridged one, and the
// router between them (the lk-wire namespace) knows only those host routes,
// nothing of pod CIDRs: native routing cannot work there.
const (
	UnderlayBridged = "bridged"
	UnderlayRouted  = "routed"
)

// TunnelPort is the agents' VXLAN port; FlannelPort the baseline's.
const (
	TunnelPort  = 8472
	FlannelPort = 8473
	// FlannelDevice is the baseline pods' kernel VXLAN device on a routed
	// underlay (flannel's vxlan backend: device + static FDB, neighbour and
	// route per node).
	FlannelDevice = "lk-flannel"
	// tunnelOverhead: pods on a tunnel get the uplink MTU minus this.
	tunnelOverhead = 50
)

// RoutingEnv sets the routing mode of a Config that names none (the lab's
// tests: LANEKIT_LAB_ROUTING=tunnel go test ./pkg/lab runs the Services and
// policy tests over the tunnel). The CLI always names one.
const RoutingEnv = "LANEKIT_LAB_ROUTING"

// routing returns the configured routing mode (default: $LANEKIT_LAB_ROUTING,
// else native).
func (c Config) routing() string {
	if c.Routing != "" {
		return c.Routing
	}
	if r := os.Getenv(RoutingEnv); r != "" {
		return r
	}
	return RoutingNative
}

// underlay returns the configured underlay: routed with the tunnel,
// bridged otherwise, unless set.
func (c Config) underlay() string {
	switch {
	case c.Underlay != "":
		return c.Underlay
	case c.routing() == RoutingTunnel:
		return UnderlayRouted
	}
	return UnderlayBridged
}

// checkRouting validates Routing and Underlay.
func (c Config) checkRouting() error {
	switch c.routing() {
	case RoutingNative, RoutingTunnel:
	default:
		return fmt.Errorf("--routing %q: want native or tunnel", c.Routing)
	}
	switch c.underlay() {
	case UnderlayBridged, UnderlayRouted:
	default:
		return fmt.Errorf("--underlay %q: want bridged or routed", c.Underlay)
	}
	if c.routing() == RoutingTunnel && c.underlay() != UnderlayRouted {
		return fmt.Errorf("--routing tunnel runs on the routed underlay")
	}
	if _, rival, _ := rivalFor(c.CNI, c.routing()); c.Kubelet && !rival && c.routing() == RoutingTunnel && c.install() == InstallHelm {
		return fmt.Errorf("--routing tunnel with --kubelet installs lanekit with kustomize (the ConfigMap's routing-mode); --install helm runs %s's commands as written, native", InstallDoc)
	}
	if c.Nodes > 200 {
		return fmt.Errorf("routed underlay: at most 200 nodes")
	}
	return nil
}

// buildRouter makes the underlay namespace a router: forwarding on, no
// bridge, only the subnets of the ports buildRoutedPort adds.
func buildRouter(ctx context.Context) error {
	if err := addNetns(ctx, WireNS); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	if err := ip(ctx, "-n", WireNS, "link", "set", "lo", "up"); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	if err := sysctl(ctx, WireNS, "net.ipv4.ip_forward", "1"); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// RouterIP is the router's address on every port of the routed underlay.
const RouterIP = "10.77.0.254"

// routedPort connects ns to the router with a veth (Uplink in ns, port on
// the router): ns has addr as a /32 of its own (a subnet of one address,
// as cloud VPCs hand out), the router a host route to it on that port and
// RouterIP on every port; ns reaches the rest of the underlay (10.77.0.0/24)
// through the router, which forwards by those host routes only.
func routedPort(ctx context.Context, ns, port, addr string) error {
	for _, args := range [][]string{
		{"link", "add", "name", Uplink, "netns", ns, "type", "veth", "peer", "name", port, "netns", WireNS},
		{"-n", WireNS, "addr", "add", RouterIP + "/32", "dev", port},
		{"-n", WireNS, "link", "set", port, "up"},
		{"-n", WireNS, "route", "add", addr + "/32", "dev", port, "scope", "link"},
		{"-n", ns, "addr", "add", addr + "/32", "dev", Uplink},
		{"-n", ns, "link", "set", Uplink, "up"},
		{"-n", ns, "route", "add", RouterIP, "dev", Uplink, "scope", "link"},
		{"-n", ns, "route", "add", "10.77.0.0/24", "via", RouterIP, "dev", Uplink},
	} {
		if err := ip(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// buildRoutedNode creates node i (of n) on the routed underlay: its own
// /32, no route to any pod CIDR (the agents tunnel), the baseline pods
// joined by a flannel-style kernel VXLAN (device, FDB, neighbour and route
// per other node), forwarding, bridge netfilter and the kube-proxy rules.
func buildRoutedNode(ctx context.Context, i, n int, standIns bool) error {
	ns := NodeNS(i)
	if err := addNetns(ctx, ns); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	if err := routedPort(ctx, ns, fmt.Sprintf("lk-w%d", i), UnderlayIP(i)); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	if !standIns {
		// Real nodes (lab up --kubelet): a real flanneld makes its own
		// flannel.1; the node gets forwarding and bridge netfilter only.
		return nodeSysctls(ctx, ns)
	}
	steps := [][]string{
		{"-n", ns, "link", "add", FlannelDevice, "type", "vxlan", "id", "1", "dstport", fmt.Sprint(FlannelPort),
			"local", UnderlayIP(i), "dev", Uplink, "nolearning"},
		{"-n", ns, "link", "set", FlannelDevice, "address", flannelMAC(i), "mtu", fmt.Sprint(1500 - tunnelOverhead), "up"},
		{"-n", ns, "addr", "add", flannelGW(i) + "/32", "dev", FlannelDevice},
	}
	for j := 1; j <= n; j++ {
		if j == i {
			continue
		}
		steps = append(steps,
			[]string{"-n", ns, "neigh", "add", flannelGW(j), "lladdr", flannelMAC(j), "dev", FlannelDevice, "nud", "permanent"},
			[]string{"-n", ns, "route", "add", BaseCIDR(j), "via", flannelGW(j), "dev", FlannelDevice, "onlink"},
		)
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("node %s: %w", ns, err)
		}
	}
	for j := 1; j <= n; j++ {
		if j == i {
			continue
		}
		cmd := nsCommand(ctx, ns, "bridge", "fdb", "append", flannelMAC(j), "dev", FlannelDevice, "dst", UnderlayIP(j))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: bridge fdb: %w: %s", ns, err, out)
		}
	}
	if err := nodeSysctls(ctx, ns); err != nil {
		return err
	}
	if err := installKubeProxyRules(ctx, ns, n); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	return nil
}

// flannelMAC and flannelGW are node i's baseline VXLAN device address and
// its per-node gateway (flannel: the .0 of the node's range).
func flannelMAC(i int) string { return fmt.Sprintf("02:4c:4b:46:%02x:%02x", i>>8, i&0xff) }
func flannelGW(i int) string  { return fmt.Sprintf("10.245.%d.0", i) }

// buildRoutedRawHost creates raw host i on a subnet of its own behind the
// router.
func buildRoutedRawHost(ctx context.Context, i int) error {
	ns := RawNS(i)
	if err := addNetns(ctx, ns); err != nil {
		return fmt.Errorf("raw host %s: %w", ns, err)
	}
	if err := routedPort(ctx, ns, fmt.Sprintf("lk-wr%d", i), RawIP(i)); err != nil {
		return fmt.Errorf("raw host %s: %w", ns, err)
	}
	return nil
}

// routingAgentArgs are lanekitd's routing flags for node i of the lab in
// st: in tunnel mode, every other node's pod CIDR and underlay address.
func routingAgentArgs(st *State, i int) []string {
	if st == nil || st.Routing != RoutingTunnel {
		return nil
	}
	args := []string{"--routing-mode", RoutingTunnel, "--tunnel-port", fmt.Sprint(TunnelPort)}
	if st.K8s {
		return args // the node map comes from the Node objects
	}
	for _, n := range st.Nodes {
		if n.Index == i {
			continue
		}
		args = append(args, "--tunnel-node", n.PodCIDR+"="+n.UnderlayIP)
	}
	return args
}

// labRoutingArgs reads the lab state for routingAgentArgs (no state: native).
func labRoutingArgs(i int) []string {
	st, err := LoadState()
	if err != nil {
		return nil
	}
	return routingAgentArgs(st, i)
}

// baselineMTU is the baseline pods' MTU in the lab in st: on a routed
// underlay they sit behind the flannel-style VXLAN.
func baselineMTU() int {
	if st, err := LoadState(); err == nil && st.Underlay == UnderlayRouted {
		return 1500 - tunnelOverhead
	}
	return 0
}

// Bench rows of a tunnel lab: named apart from the native lab's so that
// reports of both can stand side by side.
const (
	BenchLanekitTunnel = "lanekit-pod-tunnel"
	BenchFlannelVXLAN  = "flannel-vxlan"
)

var (
	IncludesLanekitTunnel = bench.Includes{BPF: true,
		Detail: "tcx from_pod: VXLAN encap (bpf_skb_set_tunnel_key, collect_md device) through the router; from_tunnel: redirect_peer"}
	IncludesFlannel = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "pod veth, Linux bridge, node forwarding + kube-proxy rules, kernel VXLAN device with static FDB/routes (a flannel-vxlan stand-in: no flanneld; the real one is lab bench --cni kube-proxy-iptables --routing tunnel), the router"}
	IncludesRawRouted = bench.Includes{Detail: "raw hosts through the router, no rules: the physical limit of the routed underlay"}
)

// routingRows renames and relabels the rows of a lab on the routed
// underlay.
func (s *State) routingRows(paths []bench.Path) []bench.Path {
	if s.Underlay != UnderlayRouted {
		return paths
	}
	for i := range paths {
		switch paths[i].Name {
		case "lanekit-pod":
			if s.Routing == RoutingTunnel {
				paths[i].Name, paths[i].Includes = BenchLanekitTunnel, IncludesLanekitTunnel
			}
		case "bridge-iptables":
			paths[i].Name, paths[i].Includes = BenchFlannelVXLAN, IncludesFlannel
		case bench.RawPath:
			paths[i].Includes = IncludesRawRouted
		}
	}
	return paths
}
