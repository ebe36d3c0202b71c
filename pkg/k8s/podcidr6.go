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
