package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestDualStackLab brings up a dual-stack lab (--ip-family dual), runs `lab
// check` (IPv4 and IPv6 matrices: pod to pod on the same node and across
// nodes, pod to node), and asserts the path bulk IPv6 TCP takes between
// lanekit pods on two nodes, in both directions: each node's kernel forwards
// at most 2 % of the packets its pod sent and received (Ip6OutForwDatagrams
// in the node netns) and the pods' BPF endpoint counters account for the
// rest. Root only; brings up the global lab (run it under flock
// /tmp/lanekit-lab.lock).
func TestDualStackLab(t *testing.T) {
	bins := pathTestBins(t)
	// lab check runs the CLI's tcp-echo/tcp-dial in the namespaces.
	bins.Self = CLIForTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 2, IPFamily: IPFamilyDual, Bins: bins})
	for _, p := range st.PodsOf(KindLanekit) {
		if a, err := netip.ParseAddr(p.IP6); err != nil || !a.Is6() {
			t.Fatalf("lanekit pod %s has no IPv6 address (%q)", p.NS, p.IP6)
		}
	}

	t.Run("lab check", func(t *testing.T) { checkIPv6Matrix(t, ctx, bins) })

	pods := map[int]Pod{}
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			if p.Kind == KindLanekit && pods[n.Index].NS == "" {
				pods[n.Index] = p
			}
		}
	}
	sample := func(t *testing.T, node int) pathSample {
		t.Helper()
		var s pathSample
		var err error
		if s.fwd, err = IP6OutForwDatagrams(ctx, NodeNS(node)); err != nil {
			t.Fatal(err)
		}
		if s.tx, s.rx, err = LinkPackets(ctx, pods[node].NS, PodIfName); err != nil {
			t.Fatal(err)
		}
		// The endpoint's counters (one set per endpoint, both families).
		if _, s.bpf, err = datapath.PinnedCounters(BPFDir(node), netip.MustParseAddr(pods[node].IP)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, dir := range []struct{ client, server int }{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("IPv6 bulk TCP node%d pod to node%d pod", dir.client, dir.server), func(t *testing.T) {
			before := map[int]pathSample{}
			for n := range pods {
				before[n] = sample(t, n)
			}
			bulkTCP(t, ctx, pods[dir.client].NS, pods[dir.server].NS, pods[dir.server].IP6)
			for n := range pods {
				judgeBulkPath(t, fmt.Sprintf("node%d pod", n), before[n], sample(t, n), n == dir.client, maxKernelShare, "IPv6 datagrams")
			}
		})
	}
}

// checkIPv6Matrix runs lab check, which must pass and probe the lanekit
// pods over IPv6; it returns the output.
func checkIPv6Matrix(t *testing.T, ctx context.Context, bins Bins) string {
	t.Helper()
	var out bytes.Buffer
	err := Check(ctx, bins, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out.Bytes(), []byte("lanekit pods over IPv6")) {
		t.Fatal("lab check printed no IPv6 matrix")
	}
	return out.String()
}
