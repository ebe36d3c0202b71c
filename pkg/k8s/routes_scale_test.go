package k8s

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
)

// TestNodeRoutesAtScale: a source started against an API server holding N
// Nodes (100 in the suite; LANEKIT_ROUTES_NODES=1000 for the size)
// installs a route to each other Node's pod CIDR in a scratch netns whose
// uplink holds every InternalIP on its /16, and logs how long that took
// from the source's start (issue 41: 1,000 nodes' routes in place ≤ 2 s
// after the agent starts; the time is reported, not asserted).
func TestNodeRoutesAtScale(t *testing.T) {
	testutil.RequireRoot(t)
	n := 100
	if v := os.Getenv("LANEKIT_ROUTES_NODES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2 || n > 60000 {
			t.Fatalf("LANEKIT_ROUTES_NODES=%q: want 2-60000", v)
		}
	}
	e := newEnv(t)
	ctx := context.Background()
	ns := fmt.Sprintf("lk-t-k8sroutescale-%d", os.Getpid())
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	sh("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh("-n", ns, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
	sh("-n", ns, "link", "set", "up1", "up")
	sh("-n", ns, "addr", "add", "10.78.0.1/16", "dev", "up0")
	sh("-n", ns, "link", "set", "up0", "up")

	// Node i: pod CIDR 10.(100+i/256).(i%256).0/24, InternalIP 10.78.i/250.i%250+1 (node 0 is this one).
	created := time.Now()
	cidr := func(i int) string { return fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256) }
	addr := func(i int) string { return fmt.Sprintf("10.78.%d.%d", i/250, i%250+1) }
	if err := k8stest.CreateNodes(ctx, e.c, n, cidr, addr); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Nodes created in %s", n, time.Since(created).Round(time.Millisecond))

	r, err := NewNetlinkRoutes("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	run(t, Config{NodeName: "n0", Client: e.c, Routes: r})
	var got []Route
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got, err = r.Routes(); err == nil && len(got) == n-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d routes after 60 s (%v)", len(got), n-1, err)
		}
	}
	took := time.Since(start)
	want := map[string]bool{}
	for i := 1; i < n; i++ {
		want[fmt.Sprintf("10.%d.%d.0/24 via 10.78.%d.%d", 100+i/256, i%256, i/250, i%250+1)] = true
	}
	for _, rt := range got {
		if k := rt.Dst.String() + " via " + rt.Via.String(); !want[k] {
			t.Errorf("route %s: not one of the Nodes'", k)
		}
	}
	t.Logf("%d nodes: %d routes in place %s after the source started", n, len(got), took.Round(time.Millisecond))
}
