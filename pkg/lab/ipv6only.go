package lab

import "fmt"

// IPv6-only labs (`lab up --ip-family ipv6`, issue 25): the nodes keep their
// IPv4 underlay addresses (the raw hosts, the baseline bridge pods and the
// node-to-node rows of the bench use them) and get IPv6 ones beside them,
// but lanekit's agents get only an IPv6 pod CIDR: lanekit pods have only an
// IPv6 address (and no IPv4 route), and `lab check` probes them over IPv6
// (check6.go).

// checkIPv6Only validates an IPv6-only lab's configuration.
func checkIPv6Only(cfg Config) (string, error) {
	switch {
	case cfg.Kubelet:
		return "", fmt.Errorf("--ip-family ipv6 with --kubelet: not yet (real nodes run IPv4 or dual; --k8s with the lab kubelet runs IPv6-only Nodes)")
	case cfg.BaselineOnly:
		return "", fmt.Errorf("--ip-family ipv6 needs the agents (not --baseline-only)")
	case cfg.VM:
		return "", fmt.Errorf("--ip-family ipv6 with --vm: not yet (the lab's VM plumbing wants an IPv4 address; use dual for IPv6 VMs)")
	case cfg.routing() != RoutingNative:
		return "", fmt.Errorf("--ip-family ipv6 with --routing %s: not yet (the tunnel carries IPv4 pod CIDRs)", cfg.routing())
	}
	return IPFamilyIPv6, nil
}

// HasIPv6 reports whether the lab's nodes and lanekit pods have IPv6
// (dual-stack or IPv6-only).
func (s *State) HasIPv6() bool { return s.IPFamily == IPFamilyDual || s.IPFamily == IPFamilyIPv6 }

// labIPv6Only reports whether the lab of record (StateFile) is IPv6-only:
// agents (re)started and pods added later get only IPv6.
func labIPv6Only() bool {
	st, err := LoadState()
	return err == nil && st.IPFamily == IPFamilyIPv6
}
