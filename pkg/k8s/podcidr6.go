package k8s

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodePodCIDRv6 returns node's IPv6 pod CIDR from spec.podCIDRs ("" when
// the node has none: an IPv4-only node). Read once, after WaitPodCIDR: the
// node IPAM controller sets both families of a dual-stack node together.
func NodePodCIDRv6(ctx context.Context, client kubernetes.Interface, node string) (string, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s: %w", node, err)
	}
	return nodePodCIDRv6(n), nil
}

// nodePodCIDRv6 is a Node's IPv6 pod CIDR (spec.podCIDRs, else spec.podCIDR).
func nodePodCIDRv6(n *corev1.Node) string {
	for _, c := range append(slicesClone(n.Spec.PodCIDRs), n.Spec.PodCIDR) {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
			return p.String()
		}
	}
	return ""
}

// desiredRoutes6 are the IPv6 routes to every other node with an IPv6 pod
// CIDR and an IPv6 InternalIP, when this node (self) has an IPv6 pod CIDR
// itself: an IPv4-only node has no IPv6 underlay to route them over.
func desiredRoutes6(self string, nodes []*corev1.Node) []Route {
	var own netip.Prefix
	for _, n := range nodes {
		if n.Name == self {
			own, _ = netip.ParsePrefix(nodePodCIDRv6(n))
		}
	}
	if !own.IsValid() {
		return nil
	}
	var out []Route
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		dst, err := netip.ParsePrefix(nodePodCIDRv6(n))
		if err != nil || dst.Masked().Overlaps(own) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Is6() && !ip.Is4In6() {
				out = append(out, Route{Node: n.Name, Dst: dst.Masked(), Via: ip})
				break
			}
		}
	}
	return out
}
