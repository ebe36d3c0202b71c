package k8s

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNodePodCIDRv6(t *testing.T) {
	for _, c := range []struct {
		spec corev1.NodeSpec
		want string
	}{
		{corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}, ""},
		{corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}}, "fd00:10:244:1::/64"},
		{corev1.NodeSpec{PodCIDR: "fd00:10:244:1::/64", PodCIDRs: []string{"fd00:10:244:1::/64", "10.244.1.0/24"}}, "fd00:10:244:1::/64"},
		{corev1.NodeSpec{PodCIDRs: []string{"garbage"}}, ""},
	} {
		if got := nodePodCIDRv6(&corev1.Node{Spec: c.spec}); got != c.want {
			t.Errorf("%+v: %q, want %q", c.spec, got, c.want)
		}
		if c.want != "" && nodePodCIDRv4(&corev1.Node{Spec: c.spec}) != "10.244.1.0/24" {
			t.Errorf("%+v: the IPv4 CIDR is no longer found", c.spec)
		}
	}
}
