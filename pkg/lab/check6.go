package lab

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// EchoPort6 is the TCP echo port of the IPv6 probes (a server on [::],
// beside the IPv4 one on EchoPort).
const EchoPort6 = 7778

// ipv6CheckGroups are a dual-stack lab's IPv6 probes: every lanekit pod
// reaches every other lanekit pod (same node and across nodes), every
// node's IPv6 underlay address and every fast-lane VM, by ICMPv6 and by a
// TCP echo over IPv6; the nodes reach every VM; and every VM (through its
// console) reaches every lanekit pod, every node and every other VM.
func ipv6CheckGroups(st *State) []checkGroup {
	if !st.HasIPv6() {
		return nil
	}
	var pods, nodes []endpoint
	for _, n := range st.Nodes {
		if n.UnderlayIP6 != "" {
			nodes = append(nodes, endpoint{Name: n.NS, NS: n.NS, IP: n.UnderlayIP6})
		}
		for _, p := range n.Pods {
			if p.Kind == KindLanekit && p.IP6 != "" {
				pods = append(pods, endpoint{Name: p.NS, NS: p.NS, IP: p.IP6})
			}
		}
	}
	if len(pods) == 0 {
		return nil
	}
	vms := vmIPv6Targets(st) // vm6.go
	title := "lanekit pods over IPv6: ICMPv6 + TCP echo to every other lanekit pod and every node's IPv6 underlay address"
	if len(vms) > 0 {
		title += " and every lanekit VM's IPv6 address"
	}
	groups := []checkGroup{{
		title: title, sources: pods, targets: append(append(append([]endpoint{}, pods...), nodes...), vms...), port: EchoPort6,
	}}
	if len(vms) == 0 {
		return groups
	}
	byNS := map[string]LabVM{}
	for _, v := range st.VMs {
		byNS[vmNS(v.Name)] = v
	}
	return append(groups,
		checkGroup{title: "nodes over IPv6: ICMPv6 + TCP echo to every lanekit VM's IPv6 address", sources: nodes, targets: vms, port: EchoPort6},
		checkGroup{
			title:   "lanekit VMs over IPv6 (commands through the guest console): ICMPv6 + TCP echo to every lanekit pod, every node and every other VM",
			sources: vms, targets: append(append(append([]endpoint{}, pods...), nodes...), vms...), vms: byNS, port: EchoPort6,
		})
}

// IP6OutForwDatagrams reads the kernel's IPv6 forwarded-datagram counter of
// ns (Ip6OutForwDatagrams in /proc/net/snmp6): what ip6_forward carried.
func IP6OutForwDatagrams(ctx context.Context, ns string) (uint64, error) {
	out, err := run(ctx, "nsenter", "--net="+netnsPath(ns), "cat", "/proc/net/snmp6")
	if err != nil {
		return 0, fmt.Errorf("read snmp6 of %s: %w", ns, err)
	}
	return snmp6Value(out, "Ip6OutForwDatagrams")
}

// snmp6Value finds a counter in /proc/net/snmp6 text ("Name value" lines).
func snmp6Value(snmp6, name string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(snmp6))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("snmp6 %s: %w", name, err)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("snmp6 has no %s", name)
}
