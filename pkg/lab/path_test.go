package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// maxKernelShare is how much of a bulk flow a node's kernel may forward
// itself (ip_forward) and still call the flow "on the BPF path".
const maxKernelShare = 0.02

// pathSample is what one node looks like at one instant: its kernel's
// forwarding counter, its test pod's device counters and the pod's BPF
// endpoint counters.
type pathSample struct {
	fwd    uint64
	tx, rx uint64 // the pod's eth0: packets it sent and received
	bpf    datapath.Counters
}

func samplePath(t *testing.T, ctx context.Context, node int, pod string, ip netip.Addr) pathSample {
	t.Helper()
	var s pathSample
	var err error
	if s.fwd, err = IPForwDatagrams(ctx, NodeNS(node)); err != nil {
		t.Fatal(err)
	}
	if s.tx, s.rx, err = LinkPackets(ctx, pod, PodIfName); err != nil {
		t.Fatal(err)
	}
	if _, s.bpf, err = datapath.PinnedCounters(BPFDir(node), ip); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBulkTCPTakesTheBPFPath asserts the path bulk TCP takes between lanekit
// pods on two nodes, in both directions: each node's kernel forwards at most
// 2 % of the packets its pod sent and received (IpForwDatagrams in the node
// netns), and the pods' BPF endpoint counters account for the rest. GSO/TSO
// packets are most of a bulk flow: a datapath that judges them by their
// total length hands nearly all of them to ip_forward. Root only; brings up
// the global lab (run it under flock /tmp/lanekit-lab.lock).
func TestBulkTCPTakesTheBPFPath(t *testing.T) {
	bins := pathTestBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if err := Down(context.Background(), DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	if _, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, Bins: bins, Out: testLog{t}}); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	pods := map[int]string{1: PodNS(1, 1, KindLanekit), 2: PodNS(2, 1, KindLanekit)}
	ips := map[int]netip.Addr{}
	for n, pod := range pods {
		a, err := netip.ParseAddr(podIP(ctx, pod))
		if err != nil {
			t.Fatalf("address of %s: %v", pod, err)
		}
		ips[n] = a
	}

	for _, dir := range []struct{ client, server int }{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("node%d pod to node%d pod", dir.client, dir.server), func(t *testing.T) {
			before := map[int]pathSample{}
			for n := range pods {
				before[n] = samplePath(t, ctx, n, pods[n], ips[n])
			}
			bulkTCP(t, ctx, pods[dir.client], pods[dir.server], ips[dir.server].String())
			for n := range pods {
				a, b := samplePath(t, ctx, n, pods[n], ips[n]), before[n]
				sent, recv := a.tx-b.tx, a.rx-b.rx
				fwd := a.fwd - b.fwd
				bpfFwd := (a.bpf.FromPackets - b.bpf.FromPackets) - (a.bpf.StackPackets - b.bpf.StackPackets)
				bpfTo := a.bpf.ToPackets - b.bpf.ToPackets
				t.Logf("node%d: pod sent %d, received %d; kernel forwarded %d; BPF forwarded %d from the pod (%d to the stack), delivered %d to it",
					n, sent, recv, fwd, bpfFwd, a.bpf.StackPackets-b.bpf.StackPackets, bpfTo)
				if n == dir.client && sent < 1000 {
					t.Fatalf("node%d: the client pod sent only %d packets: no bulk transfer to judge", n, sent)
				}
				if float64(fwd) > maxKernelShare*float64(sent+recv) {
					t.Errorf("node%d: the kernel forwarded %d datagrams, more than %.0f %% of the %d packets its pod sent and received: bulk TCP is not on the BPF path",
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

// pathTestBins returns the lab binaries, or skips (fails under make test)
// when something is missing.
func pathTestBins(t *testing.T) Bins {
	t.Helper()
	return requireLabBins(t, "creates network namespaces and reads pinned BPF maps", "ip", "iptables-restore", "nsenter", "iperf3", "sysctl")
}

// bulkTCP runs a bounded 3 s iperf3 transfer from client to server.
func bulkTCP(t *testing.T, ctx context.Context, client, server, serverIP string) {
	t.Helper()
	srv := nsCommand(ctx, server, "iperf3", "-s", "-1", "-B", serverIP)
	if err := srv.Start(); err != nil {
		t.Fatalf("iperf3 server: %v", err)
	}
	defer func() {
		srv.Process.Kill()
		srv.Wait()
	}()
	var out []byte
	var err error
	for i := 0; i < 20; i++ { // until the server listens
		out, err = nsCommand(ctx, client, "iperf3", "-c", serverIP, "-t", "3").CombinedOutput()
		if err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "receiver") {
					t.Logf("iperf3 %s -> %s: %s", client, server, strings.Join(strings.Fields(l), " "))
				}
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("iperf3 %s -> %s: %v\n%s", client, server, err, out)
}

// testLog sends lab progress lines to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
