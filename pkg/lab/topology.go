package lab

import (
	"context"
	"fmt"
	"strings"

	"github.com/lanekit/lanekit/pkg/netdev"
)

// buildWire creates the underlay namespace and its bridge.
func buildWire(ctx context.Context) error {
	if err := addNetns(ctx, WireNS); err != nil {
		return fmt.Errorf("underlay: %w", err)
	}
	if err := ip(ctx, "-n", WireNS, "link", "add", WireBridge, "type", "bridge"); err != nil {
		return fmt.Errorf("underlay bridge: %w", err)
	}
	if err := ip(ctx, "-n", WireNS, "link", "set", WireBridge, "up"); err != nil {
		return fmt.Errorf("underlay bridge: %w", err)
	}
	return nil
}

// wireBIGTCP lets the wire bridge forward a node's BIG TCP packets whole
// out of port (the node's port: what the node sends leaves through the
// other nodes' ports). The bridge stands for a fabric of NICs with TSO, which
// never cut a 192 KiB GSO packet in software; a port left at 64 KiB makes
// the kernel segment every such packet into MTU-sized frames, which the
// receiving veth (no GRO without XDP) hands up one by one: node-to-node TCP
// fell from 21 to 4.4 Gbit/s with the agents' BIG TCP on.
func wireBIGTCP(port string) error {
	h, err := netdev.NewHost(netnsPath(WireNS))
	if err != nil {
		return err
	}
	defer h.Close()
	b, _, err := h.ProbeBIGTCP(port)
	if err != nil {
		return fmt.Errorf("wire port %s: %w", port, err)
	}
	return h.SetBIGTCP(port, b)
}

// buildNode creates node i (of n): namespace, uplink veth onto the wire
// bridge, underlay address, native routes to the other nodes' pod ranges,
// forwarding and bridge netfilter sysctls, and (kubeProxy) the kube-proxy rules.
//
// With k8s the routes to the other nodes' lanekit pod ranges are left to the
// agents (from the Node objects); the baseline ranges keep static routes.
func buildNode(ctx context.Context, i, n int, k8s, kubeProxy bool) error {
	ns := NodeNS(i)
	if err := addNetns(ctx, ns); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	wirePort := fmt.Sprintf("lk-w%d", i)
	steps := [][]string{
		{"link", "add", "name", Uplink, "netns", ns, "type", "veth", "peer", "name", wirePort, "netns", WireNS},
		{"-n", WireNS, "link", "set", wirePort, "master", WireBridge, "up"},
		{"-n", ns, "addr", "add", UnderlayIP(i) + "/24", "dev", Uplink},
		{"-n", ns, "link", "set", Uplink, "up"},
	}
	for j := 1; j <= n; j++ {
		if j == i {
			continue
		}
		if !k8s {
			steps = append(steps, []string{"-n", ns, "route", "add", PodCIDR(j), "via", UnderlayIP(j), "dev", Uplink})
		}
		steps = append(steps, []string{"-n", ns, "route", "add", BaseCIDR(j), "via", UnderlayIP(j), "dev", Uplink})
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("node %s: %w", ns, err)
		}
	}
	if err := wireBIGTCP(wirePort); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	if err := nodeSysctls(ctx, ns); err != nil {
		return err
	}
	if !kubeProxy {
		return nil // real nodes (lab up --kubelet): no kube-proxy
	}
	if err := installKubeProxyRules(ctx, ns, n); err != nil {
		return fmt.Errorf("node %s: %w", ns, err)
	}
	return nil
}

// nodeSysctls sets what every node needs of its netns: forwarding, and
// bridge netfilter (the same-node Service path of a bridge CNI).
func nodeSysctls(ctx context.Context, ns string) error {
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.bridge.bridge-nf-call-iptables", "1"},
	} {
		if err := sysctl(ctx, ns, kv[0], kv[1]); err != nil {
			return fmt.Errorf("node %s: %w", ns, err)
		}
	}
	return nil
}

// RawHosts is how many raw hosts the lab has (on nodes 1 and 2, the bench's
// client and server side).
const RawHosts = 2

// RawNS is the raw host namespace next to node i: plain veth onto the same
// wire bridge as the node's uplink, no routes beyond the underlay subnet, no
// netfilter rules, so no conntrack hooks either (the kernel registers them
// per netns only when a rule needs them). The host-raw bench row runs between
// two of them: the physical limit of the node-to-node link.
func RawNS(i int) string { return fmt.Sprintf("lk-n%d-r1", i) }

// RawIP is raw host i's underlay address (nodes use .1–.200).
func RawIP(i int) string { return fmt.Sprintf("10.77.0.%d", 250+i) }

// buildRawHost creates raw host i, wired like node i's uplink.
func buildRawHost(ctx context.Context, i int) error {
	ns := RawNS(i)
	if err := addNetns(ctx, ns); err != nil {
		return fmt.Errorf("raw host %s: %w", ns, err)
	}
	wirePort := fmt.Sprintf("lk-wr%d", i)
	for _, args := range [][]string{
		{"link", "add", "name", Uplink, "netns", ns, "type", "veth", "peer", "name", wirePort, "netns", WireNS},
		{"-n", WireNS, "link", "set", wirePort, "master", WireBridge, "up"},
		{"-n", ns, "addr", "add", RawIP(i) + "/24", "dev", Uplink},
		{"-n", ns, "link", "set", Uplink, "up"},
	} {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("raw host %s: %w", ns, err)
		}
	}
	return nil
}

// kubeServices is how many ClusterIP services the node's rules carry.
const kubeServices = 32

// kubeProxyRules renders the iptables-restore input kube-proxy (iptables
// mode) would install on a node of an n-node cluster: the hook chains, the
// masquerade mark, conntrack accept, and ClusterIP services in 10.96.0.0/16
// with two endpoints each among the lab's pod ranges. Test traffic never
// matches a service but traverses every rule.
func kubeProxyRules(n int) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-NODEPORTS"} {
		w(":%s - [0:0]", c)
	}
	for s := 0; s < kubeServices; s++ {
		w(":KUBE-SVC-LK%04d - [0:0]", s)
		w(":KUBE-SEP-LK%04dA - [0:0]", s)
		w(":KUBE-SEP-LK%04dB - [0:0]", s)
	}
	w(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	w(`-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`)
	w(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`)
	w(`-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`)
	w(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	for s := 0; s < kubeServices; s++ {
		vip := fmt.Sprintf("10.96.%d.%d", s/200, 10+s%200)
		port := 8000 + s
		epNode := 1 + s%n
		epA := fmt.Sprintf("10.244.%d.%d", epNode, 200+s%50)
		epB := fmt.Sprintf("10.245.%d.%d", epNode, 200+s%50)
		svc := fmt.Sprintf("KUBE-SVC-LK%04d", s)
		w(`-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment "lab/svc-%d:http cluster IP" -m tcp --dport %d -j %s`, vip, s, port, svc)
		w(`-A %s ! -s 10.244.0.0/15 -d %s/32 -p tcp -m comment --comment "lab/svc-%d:http cluster IP" -m tcp --dport %d -j KUBE-MARK-MASQ`, svc, vip, s, port)
		w(`-A %s -m comment --comment "lab/svc-%d:http -> %s:8080" -m statistic --mode random --probability 0.5 -j %sA`, svc, s, epA, strings.Replace(svc, "SVC", "SEP", 1))
		w(`-A %s -m comment --comment "lab/svc-%d:http -> %s:8080" -j %sB`, svc, s, epB, strings.Replace(svc, "SVC", "SEP", 1))
		for _, ep := range []struct{ suffix, ip string }{{"A", epA}, {"B", epB}} {
			sep := fmt.Sprintf("KUBE-SEP-LK%04d%s", s, ep.suffix)
			w(`-A %s -s %s/32 -m comment --comment "lab/svc-%d:http" -j KUBE-MARK-MASQ`, sep, ep.ip, s)
			w(`-A %s -p tcp -m comment --comment "lab/svc-%d:http" -m tcp -j DNAT --to-destination %s:8080`, sep, s, ep.ip)
		}
	}
	w(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`)
	w("COMMIT")
	w("*filter")
	for _, c := range []string{"KUBE-FORWARD", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FIREWALL"} {
		w(":%s - [0:0]", c)
	}
	w(`-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`)
	w(`-A INPUT -j KUBE-FIREWALL`)
	w(`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
	w(`-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	w(`-A OUTPUT -j KUBE-FIREWALL`)
	w(`-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`)
	w(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP`)
	w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`)
	w(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	w("COMMIT")
	return b.String()
}

// installKubeProxyRules loads kubeProxyRules into ns with iptables-restore
// (--noflush keeps the chains the bridge plugin adds later).
func installKubeProxyRules(ctx context.Context, ns string, n int) error {
	cmd := nsCommand(ctx, ns, "iptables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(kubeProxyRules(n))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
