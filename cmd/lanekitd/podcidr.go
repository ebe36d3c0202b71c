package main

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/lanekit/lanekit/pkg/k8s"
)

// splitPodCIDRs sorts the --pod-cidr values into the node's IPv4 and IPv6
// pod CIDRs: at most one per family. IPv6 alone makes an IPv6-only node
// (pods get only an IPv6 address).
func splitPodCIDRs(vals []string) (v4, v6 string, err error) {
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return "", "", err
		}
		if p.Addr().Is4In6() {
			return "", "", fmt.Errorf("%s: an IPv4-mapped IPv6 prefix; give IPv4 as IPv4", v)
		}
		if p.Addr().Is4() {
			if v4 != "" {
				return "", "", fmt.Errorf("two IPv4 pod CIDRs (%s, %s): give one per family", v4, v)
			}
			v4 = p.String()
		} else {
			if v6 != "" {
				return "", "", fmt.Errorf("two IPv6 pod CIDRs (%s, %s): give one per family", v6, v)
			}
			v6 = p.String()
		}
	}
	return v4, v6, nil
}

// nodePodCIDR6 reads the node's IPv6 pod CIDR from its spec.podCIDRs; with
// --pod-cidr's IPv6 one (flag) too, they must agree.
func (f kubeFlags) nodePodCIDR6(ctx context.Context, kc *kubeClients, flag string) (string, error) {
	cidr, err := k8s.NodePodCIDRv6(ctx, kc.client, f.nodeName)
	if err != nil {
		return "", fmt.Errorf("IPv6 pod CIDR of node %s: %w", f.nodeName, err)
	}
	if flag != "" && flag != cidr {
		return "", fmt.Errorf("--pod-cidr %s differs from node %s's IPv6 spec.podCIDRs entry %q", flag, f.nodeName, cidr)
	}
	return cidr, nil
}

// nodeFamilies sorts the Node's spec.podCIDR (nodeCIDR) into the node's
// IPv4 pod CIDR, or, when it is IPv6, an IPv6-only node's IPv6 one (no IPv4
// pod CIDR: pods get only an IPv6 address); flag4 and flag6 are --pod-cidr's
// and must agree with it.
func nodeFamilies(node, nodeCIDR, flag4, flag6 string) (v4, v6 string, err error) {
	p, err := netip.ParsePrefix(nodeCIDR)
	if err != nil {
		return "", "", fmt.Errorf("node %s's spec.podCIDR %q: %w", node, nodeCIDR, err)
	}
	if p.Addr().Is4() {
		if flag4 != "" && flag4 != nodeCIDR {
			return "", "", fmt.Errorf("--pod-cidr %s differs from node %s's spec.podCIDR %s", flag4, node, nodeCIDR)
		}
		return nodeCIDR, flag6, nil
	}
	if flag4 != "" {
		return "", "", fmt.Errorf("--pod-cidr %s is IPv4 but node %s is IPv6-only (spec.podCIDR %s)", flag4, node, nodeCIDR)
	}
	if flag6 != "" && flag6 != nodeCIDR {
		return "", "", fmt.Errorf("--pod-cidr %s differs from node %s's spec.podCIDR %s", flag6, node, nodeCIDR)
	}
	return "", nodeCIDR, nil
}
