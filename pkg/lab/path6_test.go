package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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
	bins.Self = filepath.Join(bins.Dir, "lanekit")
	if _, err := os.Stat(bins.Self); err != nil {
		bins.Self = filepath.Join(t.TempDir(), "lanekit")
		build := exec.Command("go", "build", "-o", bins.Self, "../../cmd/lanekit")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build lanekit: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if err := Down(context.Background(), DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	st, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 2, IPFamily: IPFamilyDual, Bins: bins, Out: testLog{t}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	for _, p := range st.PodsOf(KindLanekit) {
		if a, err := netip.ParseAddr(p.IP6); err != nil || !a.Is6() {
			t.Fatalf("lanekit pod %s has no IPv6 address (%q)", p.NS, p.IP6)
		}
	}

	t.Run("lab check", func(t *testing.T) {
		var out bytes.Buffer
		err := Check(ctx, bins, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out.Bytes(), []byte("lanekit pods over IPv6")) {
			t.Fatal("lab check printed no IPv6 matrix")
		}
	})

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
				a, b := sample(t, n), before[n]
				sent, recv := a.tx-b.tx, a.rx-b.rx
				fwd := a.fwd - b.fwd
				bpfFwd := (a.bpf.FromPackets - b.bpf.FromPackets) - (a.bpf.StackPackets - b.bpf.StackPackets)
				bpfTo := a.bpf.ToPackets - b.bpf.ToPackets
				t.Logf("node%d: pod sent %d, received %d; kernel forwarded %d (IPv6); BPF forwarded %d from the pod (%d to the stack), delivered %d to it",
					n, sent, recv, fwd, bpfFwd, a.bpf.StackPackets-b.bpf.StackPackets, bpfTo)
				if n == dir.client && sent < 1000 {
					t.Fatalf("node%d: the client pod sent only %d packets: no bulk transfer to judge", n, sent)
				}
				if float64(fwd) > maxKernelShare*float64(sent+recv) {
					t.Errorf("node%d: the kernel forwarded %d IPv6 datagrams, more than %.0f %% of the %d packets its pod sent and received: bulk IPv6 TCP is not on the BPF path",
						n, fwd, 100*maxKernelShare, sent+recv)
				}
				if float64(bpfFwd) < (1-maxKernelShare)*float64(sent) {
					t.Errorf("node%d: BPF forwarded %d of the %d packets the pod sent", n, bpfFwd, sent)
				}
				if float64(bpfTo) < (1-maxKernelShare)*float64(recv) {
					t.Errorf("node%d: BPF delivered %d of the %d packets the pod received", n, bpfTo, recv)
				}
			}
		})
	}
}
