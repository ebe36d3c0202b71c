package k8s

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/internal/testutil"
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

// TestNetlinkRoutesIPv6: SyncRoutes installs and removes IPv6 node routes
// beside IPv4 ones, and Routes lists both families.
func TestNetlinkRoutesIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fmt.Sprintf("lk-t-k8sroutes6-%d", os.Getpid())
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	run("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run("-n", ns, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
	run("-n", ns, "link", "set", "up1", "up")
	run("-n", ns, "addr", "add", "10.77.0.1/24", "dev", "up0")
	run("-n", ns, "-6", "addr", "add", "fd00:77::1/64", "dev", "up0", "nodad")
	run("-n", ns, "link", "set", "up0", "up")
	r, err := NewNetlinkRoutes("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rt := func(dst, via string) Route {
		return Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
	}
	both := []Route{rt("10.244.2.0/24", "10.77.0.2"), rt("fd00:10:244:2::/64", "fd00:77::2")}
	if err := r.SyncRoutes(both); err != nil {
		t.Fatal(err)
	}
	if show := run("-n", ns, "-6", "route", "show"); !strings.Contains(show, "fd00:10:244:2::/64 via fd00:77::2 dev up0 proto 180") {
		t.Errorf("IPv6 routes:\n%s", show)
	}
	if got, err := r.Routes(); err != nil || !slices.Equal(got, both) {
		t.Errorf("lanekit routes %v %v, want %v", got, err, both)
	}
	if err := r.SyncRoutes(both[:1]); err != nil {
		t.Fatal(err)
	}
	if show := run("-n", ns, "-6", "route", "show"); strings.Contains(show, "fd00:10:244:2::/64") {
		t.Errorf("the IPv6 route of a node that left stays:\n%s", show)
	}
}
