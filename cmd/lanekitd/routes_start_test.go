package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
)

// TestNodeRoutesAfterAgentStart (issue 41: "1,000 nodes' routes programmed
// ≤ 2 s after the agent starts"): the built lanekitd, native routing on a
// veth uplink in its node namespace, started against an API server that
// holds N Nodes (pod CIDRs, InternalIPs on the uplink's subnet); the time
// from the process's start to a route to every other Node's pod CIDR via
// its InternalIP in the node namespace — the whole start (flags, BPF load,
// the store, every informer), not the k8s source alone. The suite runs 100
// Nodes; LANEKIT_ROUTES_NODES=1000 for the size. The time is a
// figure (t.Log), not a pass mark; the routes are checked one by one.
// LANEKIT_ROUTES_LOG=1 prints the agent's log (its timestamps show where
// the start went). Root.
func TestNodeRoutesAfterAgentStart(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBPFFS(t)
	n := 100
	if v := os.Getenv("LANEKIT_ROUTES_NODES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 9 || n > 60000 {
			t.Fatalf("LANEKIT_ROUTES_NODES=%q: want 9-60000", v)
		}
	}
	srv := k8stest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rc := srv.RESTConfig()
	rc.QPS, rc.Burst = 1000, 2000
	admin, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// Node i: pod CIDR 10.(100+i/256).(i%256).0/24, InternalIP
	// 10.78.(i/250).(i%250+1); the agent is node 7 (offlineEnv's name).
	const self = 7
	cidr := func(i int) string { return fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256) }
	addr := func(i int) string { return fmt.Sprintf("10.78.%d.%d", i/250, i%250+1) }
	created := time.Now()
	if err := k8stest.CreateNodes(ctx, admin, n, cidr, addr); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Nodes created in %s", n, time.Since(created).Round(time.Millisecond))

	e := newOfflineEnv(t)
	if err := srv.WriteKubeconfig(e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"link", "add", "up0", "type", "veth", "peer", "name", "up1"},
		{"link", "set", "up1", "up"},
		{"addr", "add", addr(self) + "/16", "dev", "up0"},
		{"link", "set", "up0", "up"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + e.node, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	h, err := nodeHandle(e.node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	started := time.Now()
	agent, log := e.start(t, "--uplink", "up0", "--routing-mode", "native")
	defer e.stop(t, agent, log)
	want := map[string]string{}
	for i := range n {
		if i != self {
			want[cidr(i)] = addr(i)
		}
	}
	var got map[string]string
	for deadline := started.Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if got, err = nodeRoutes(h); err == nil && len(got) >= len(want) {
			break
		}
		if time.Now().After(deadline) || agent.ProcessState != nil {
			t.Fatalf("%d of %d routes after %s (%v)\n%s", len(got), len(want), time.Since(started).Round(time.Millisecond), err, log)
		}
	}
	took := time.Since(started)
	for dst, via := range want {
		if got[dst] != via {
			t.Errorf("route to %s: via %q, want via %s", dst, got[dst], via)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d routes, want %d (one per other Node)", len(got), len(want))
	}
	e.waitReady(t, log, 2*time.Minute)
	if os.Getenv("LANEKIT_ROUTES_LOG") != "" {
		t.Logf("agent log:\n%s", log)
	}
	t.Logf("%d Nodes: the %d routes to the other Nodes' pod CIDRs in place %s after lanekitd started (ready after %s)",
		n, len(want), took.Round(time.Millisecond), time.Since(started).Round(time.Millisecond))
}

func nodeHandle(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// nodeRoutes returns the namespace's IPv4 routes with a gateway: pod CIDR
// -> gateway.
func nodeRoutes(h *netlink.Handle) (map[string]string, error) {
	rs, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range rs {
		if r.Dst != nil && r.Gw != nil && r.Dst.IP.To4() != nil && !r.Dst.IP.Equal(net.IPv4zero) {
			out[r.Dst.String()] = r.Gw.String()
		}
	}
	return out, nil
}
