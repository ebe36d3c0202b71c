package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestNetlinkRoutes installs, replaces and removes node routes in a scratch
// netns and leaves routes it does not own alone.
func TestNetlinkRoutes(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fmt.Sprintf("lk-t-k8sroutes-%d", os.Getpid())
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
	run("-n", ns, "link", "set", "up0", "up")
	run("-n", ns, "route", "add", "10.245.2.0/24", "via", "10.77.0.2") // someone else's

	r, err := NewNetlinkRoutes("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rt := func(dst, via string) Route {
		return Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
	}
	if err := r.SyncRoutes([]Route{rt("10.244.2.0/24", "10.77.0.2"), rt("10.244.3.0/24", "10.77.0.3")}); err != nil {
		t.Fatal(err)
	}
	show := run("-n", ns, "-4", "route", "show")
	for _, want := range []string{"10.244.2.0/24 via 10.77.0.2 dev up0 proto 180", "10.244.3.0/24 via 10.77.0.3 dev up0 proto 180"} {
		if !strings.Contains(show, want) {
			t.Errorf("routes:\n%s\nlack %q", show, want)
		}
	}
	// Node 3 moved, node 2 left.
	if err := r.SyncRoutes([]Route{rt("10.244.3.0/24", "10.77.0.33")}); err != nil {
		t.Fatal(err)
	}
	got, err := r.Routes()
	if err != nil {
		t.Fatal(err)
	}
	if want := []Route{rt("10.244.3.0/24", "10.77.0.33")}; !slices.Equal(got, want) {
		t.Errorf("lanekit routes %v, want %v", got, want)
	}
	if show := run("-n", ns, "-4", "route", "show"); !strings.Contains(show, "10.245.2.0/24 via 10.77.0.2") {
		t.Errorf("a route lanekit does not own was removed:\n%s", show)
	}
	// An unreachable gateway is an error naming the route; the others apply.
	err = r.SyncRoutes([]Route{rt("10.244.4.0/24", "192.0.2.1"), rt("10.244.3.0/24", "10.77.0.3")})
	if err == nil || !strings.Contains(err.Error(), "10.244.4.0/24 via 192.0.2.1") {
		t.Errorf("unreachable gateway: err %v", err)
	}
	if got, _ := r.Routes(); !slices.Equal(got, []Route{rt("10.244.3.0/24", "10.77.0.3")}) {
		t.Errorf("after a partial failure: %v", got)
	}
}

// TestNodeUplink: without --uplink the agent uses the device holding its
// Node's InternalIP.
func TestNodeUplink(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t)
	ns := fmt.Sprintf("lk-t-k8suplink-%d", os.Getpid())
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "add", "up0", "type", "veth", "peer", "name", "other0"},
		{"-n", ns, "addr", "add", "10.77.0.9/24", "dev", "other0"},
		{"-n", ns, "addr", "add", "10.77.1.1/24", "dev", "up0"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		if args[0] == "netns" {
			t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		}
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	n = mustCreate(t, e.c.CoreV1().Nodes().Create, n)
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "10.77.0.9"}, {Type: corev1.NodeInternalIP, Address: "10.77.1.1"}}
	if _, err := e.c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := NodeUplink(context.Background(), e.c, "n1", "/run/netns/"+ns)
	if err != nil || got != "up0" {
		t.Errorf("NodeUplink = %q, %v; want up0 (the InternalIP's device)", got, err)
	}
	if _, err := NodeUplink(context.Background(), e.c, "n1", ""); err == nil || !strings.Contains(err.Error(), "10.77.1.1") {
		t.Errorf("NodeUplink in a netns without the address: %v", err)
	}
}
