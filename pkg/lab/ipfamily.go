package lab

import (
	"context"
	"fmt"
	"strings"
)

// IP families of a lab (`lab up --ip-family`).
const (
	IPFamilyIPv4 = "ipv4" // the default in this slice of issue 25
	IPFamilyIPv6 = "ipv6" // IPv6-only: lanekit pods get only an IPv6 address (ipv6only.go)
	IPFamilyDual = "dual" // both: nodes and lanekit pods get an address of each family
)

// IPFamilies are the --ip-family values.
var IPFamilies = []string{IPFamilyIPv4, IPFamilyIPv6, IPFamilyDual}

// checkIPFamily validates cfg.IPFamily ("" is ipv4) and returns it.
func checkIPFamily(cfg Config) (string, error) {
	switch cfg.IPFamily {
	case "", IPFamilyIPv4:
		return IPFamilyIPv4, nil
	case IPFamilyDual:
		if cfg.BaselineOnly {
			return "", fmt.Errorf("--ip-family dual needs the agents (not --baseline-only): the baseline pods are IPv4 only")
		}
		return IPFamilyDual, nil
	case IPFamilyIPv6:
		return checkIPv6Only(cfg) // ipv6only.go
	}
	return "", fmt.Errorf("--ip-family %q: want one of %s", cfg.IPFamily, strings.Join(IPFamilies, ", "))
}

// Dual reports whether the lab carries IPv6 beside IPv4.
func (s *State) Dual() bool { return s.IPFamily == IPFamilyDual }

// UnderlayIP6 is node i's IPv6 address on the wire.
func UnderlayIP6(i int) string { return fmt.Sprintf("fd00:77::%x", i) }

// PodCIDR6 is node i's IPv6 lanekit pod range.
func PodCIDR6(i int) string { return fmt.Sprintf("fd00:10:244:%x::/64", i) }

// buildNodeIPv6 gives node i (of n) its IPv6 underlay address, native routes
// to the other nodes' IPv6 pod ranges (not with k8s: the agents route from
// the Nodes' spec.podCIDRs) and IPv6 forwarding.
func buildNodeIPv6(ctx context.Context, i, n int, k8s bool) error {
	ns := NodeNS(i)
	for _, kv := range [][2]string{
		{"net.ipv6.conf.all.disable_ipv6", "0"},
		{"net.ipv6.conf." + Uplink + ".disable_ipv6", "0"},
		{"net.ipv6.conf.all.forwarding", "1"},
	} {
		if err := sysctl(ctx, ns, kv[0], kv[1]); err != nil {
			return fmt.Errorf("node %s: %w", ns, err)
		}
	}
	steps := [][]string{{"-n", ns, "-6", "addr", "add", UnderlayIP6(i) + "/64", "dev", Uplink, "nodad"}}
	for j := 1; j <= n; j++ {
		if j != i && !k8s {
			steps = append(steps, []string{"-n", ns, "-6", "route", "add", PodCIDR6(j), "via", UnderlayIP6(j), "dev", Uplink})
		}
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("node %s: %w", ns, err)
		}
	}
	return nil
}

// labIPv6AgentArgs is node i's IPv6 --pod-cidr when the lab of record
// (StateFile) is dual-stack: agents restarted later (tests, `lab agent
// restart`) keep the family set they started with.
func labIPv6AgentArgs(i int) []string {
	st, err := LoadState()
	if err != nil || !st.HasIPv6() {
		return nil
	}
	return []string{"--pod-cidr", PodCIDR6(i)}
}

// podIP6 reads the global IPv6 address of a pod's eth0 ("" if none).
func podIP6(ctx context.Context, ns string) string {
	out, err := run(ctx, "ip", "-n", ns, "-6", "-o", "addr", "show", "dev", PodIfName, "scope", "global")
	if err != nil {
		return ""
	}
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "inet6" {
			addr, _, _ := strings.Cut(f[i+1], "/")
			return addr
		}
	}
	return ""
}
