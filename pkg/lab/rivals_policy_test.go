package lab

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/bench"
)

// The policy rows of a --cni run: the cross-node row again per count (its
// own Prepare, policy count and base), the other rows emptied of policies
// first, only the policy rows with --policies-only; compared across labs
// only with networks that enforce NetworkPolicy; refused for flannel when
// they would be the only rows.
func TestRivalPolicyRows(t *testing.T) {
	rp := &rivalPolicies{current: -1}
	paths := []bench.Path{{Name: bench.RawPath}, {Name: BenchPodSameNode}, {Name: BenchPodCrossNode, Note: "n"}}
	got := rp.policyRows(CNILanekit, []int{0, 100}, false, paths)
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
		if p.Prepare == nil {
			t.Errorf("%s: no Prepare", p.Name)
		}
	}
	if want := []string{bench.RawPath, BenchPodSameNode, BenchPodCrossNode, "pod-cross-node+0-policies", "pod-cross-node+100-policies"}; !slices.Equal(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
	if *got[3].Policies != 0 || *got[4].Policies != 100 || got[4].PolicyBase != BenchPodCrossNode || !strings.Contains(got[4].Note, "100 NetworkPolicies") {
		t.Errorf("policy rows %+v %+v", got[3], got[4])
	}
	if only := rp.policyRows(CNILanekit, []int{1000}, true, paths); len(only) != 1 || only[0].Name != "pod-cross-node+1000-policies" {
		t.Errorf("--policies-only rows %+v", only)
	}

	cross := RivalCross([]string{CNILanekit, CNICilium, CNIKubeProxyIptables}, RoutingNative, []int{0, 100}, true)
	var refs []string
	for _, c := range cross {
		refs = append(refs, c.RefGroup+":"+c.Path)
	}
	if want := []string{"cilium:pod-cross-node+0-policies", "cilium:pod-cross-node+100-policies"}; !slices.Equal(refs, want) {
		t.Errorf("cross refs %v, want %v", refs, want)
	}
	if _, err := RivalBenchGroups(Bins{}, []string{CNILanekit, CNIKubeProxyIptables}, RoutingNative, []int{100}, true, nil); err == nil ||
		!strings.Contains(err.Error(), "enforces no NetworkPolicy") {
		t.Errorf("--policies-only with flannel: %v", err)
	}
}

// The enforcement probe: a refusal from the server's kernel is reachable,
// a dropped SYN unreachable, and waitReach waits for the state asked for.
func TestRivalPolicyProbe(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTools(t, "ip", "iptables")
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	c, s := "lk-t-probe-c", "lk-t-probe-s"
	for _, n := range []string{c, s} {
		_ = exec.Command("ip", "netns", "del", n).Run()
		sh("ip", "netns", "add", n)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	}
	sh("ip", "-n", c, "link", "add", "p", "type", "veth", "peer", "name", "p", "netns", s)
	sh("ip", "-n", c, "addr", "add", "10.99.0.1/24", "dev", "p")
	sh("ip", "-n", s, "addr", "add", "10.99.0.2/24", "dev", "p")
	sh("ip", "-n", c, "link", "set", "p", "up")
	sh("ip", "-n", s, "link", "set", "p", "up")
	rp := &rivalPolicies{clientNS: c, serverIP: "10.99.0.2", timeout: 3 * time.Second}
	ctx := context.Background()
	// The first SYN may wait for ARP on a loaded machine (the probe's
	// dial gives up after 500 ms): wait for the answer.
	if err := rp.waitReach(ctx, true); err != nil {
		t.Fatalf("nothing in the way: %v", err)
	}
	if err := rp.probe(); err != nil {
		t.Fatalf("nothing in the way, probed again: %v", err)
	}
	if err := rp.waitReach(ctx, false); err == nil {
		t.Fatal("waitReach(unreachable) returned with the server answering")
	}
	if _, err := os.Stat("/run/netns/" + s); err != nil {
		t.Fatal(err)
	}
	sh("ip", "netns", "exec", s, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "DROP")
	if err := rp.probe(); !errors.Is(err, errUnreachable) {
		t.Fatalf("SYN dropped: probe %v, want unreachable", err)
	}
	if err := rp.waitReach(ctx, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := rp.waitReach(ctx, true); err == nil || time.Since(start) < 3*time.Second {
		t.Fatalf("waitReach(reachable) with the SYN dropped: %v after %v", err, time.Since(start))
	}
}
