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

// since is a-b for two samples of a counter that only grows, 0 when the
// samples raced (b read after a on another CPU's share).
func since(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// pathDelta is what one endpoint and its node did between two samples.
type pathDelta struct {
	sent, recv uint64 // packets the endpoint sent and received
	fwd        uint64 // datagrams the node's kernel forwarded
	bpfFwd     uint64 // of what it sent, what BPF forwarded (not handed to the stack)
	bpfStack   uint64 // of what it sent, what BPF handed to the host stack
	bpfTo      uint64 // what BPF delivered to it
}

// deltaOf is the difference of two samples. bpfFwd is from minus stack,
// clamped at 0: the two counters are read per CPU, not atomically together,
// so a sample may see a packet's stack hand-off before its from count.
func deltaOf(b, a pathSample) pathDelta {
	from, stack := since(a.bpf.FromPackets, b.bpf.FromPackets), since(a.bpf.StackPackets, b.bpf.StackPackets)
	return pathDelta{sent: since(a.tx, b.tx), recv: since(a.rx, b.rx), fwd: since(a.fwd, b.fwd),
		bpfFwd: since(from, stack), bpfStack: stack, bpfTo: since(a.bpf.ToPackets, b.bpf.ToPackets)}
}

// minBulkPackets is what a client must send for a bulk transfer to be
// judged: packets are GSO packets of up to 64 KiB, 192 KiB with BIG TCP
// (lanekitd's default), so a few seconds of TCP to a TCG guest are hundreds.
const minBulkPackets = 300

// judgeBulkPath judges one endpoint's side of a bulk transfer (the samples
// b before and a after it): the client sent at least minBulkPackets (else
// there is nothing to judge: fatal), the node's kernel forwarded at most
// maxShare of what the endpoint sent and received (fwdWhat names its
// counter's unit in the messages), and BPF forwarded and delivered all but
// maxKernelShare of it. It returns the delta for further assertions.
func judgeBulkPath(t *testing.T, who string, b, a pathSample, client bool, maxShare float64, fwdWhat string) pathDelta {
	t.Helper()
	d := deltaOf(b, a)
	t.Logf("%s: sent %d, received %d; kernel forwarded %d %s; BPF forwarded %d of what it sent (%d to the stack), delivered %d to it",
		who, d.sent, d.recv, d.fwd, fwdWhat, d.bpfFwd, d.bpfStack, d.bpfTo)
	if client && d.sent < minBulkPackets {
		t.Fatalf("%s: the client sent only %d packets: no bulk transfer to judge", who, d.sent)
	}
	if float64(d.fwd) > maxShare*float64(d.sent+d.recv) {
		t.Errorf("%s: the kernel forwarded %d %s, more than %.0f %% of the %d packets sent and received: bulk TCP is not on the BPF path",
			who, d.fwd, fwdWhat, 100*maxShare, d.sent+d.recv)
	}
	if float64(d.bpfFwd) < (1-maxKernelShare)*float64(d.sent) {
		t.Errorf("%s: BPF forwarded %d of the %d packets sent", who, d.bpfFwd, d.sent)
	}
	if float64(d.bpfTo) < (1-maxKernelShare)*float64(d.recv) {
		t.Errorf("%s: BPF delivered %d of the %d packets received", who, d.bpfTo, d.recv)
	}
	return d
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
	upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, Bins: bins})
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
				judgeBulkPath(t, fmt.Sprintf("node%d pod", n), before[n], samplePath(t, ctx, n, pods[n], ips[n]),
					n == dir.client, maxKernelShare, "datagrams")
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
	iperfBounded(t, ctx, client, server, serverIP, "-t", "3")
}

// bulkTCPParallel runs a bounded 2 s iperf3 transfer with n parallel streams.
func bulkTCPParallel(t *testing.T, ctx context.Context, client, server, serverIP string, n int) {
	t.Helper()
	iperfBounded(t, ctx, client, server, serverIP, "-t", "2", "-P", fmt.Sprint(n))
}

// iperfBounded runs one iperf3 client with args from client against a
// one-shot server in server, retried until the server listens; it logs the
// receiver's line.
func iperfBounded(t *testing.T, ctx context.Context, client, server, serverIP string, args ...string) {
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
		out, err = nsCommand(ctx, client, append([]string{"iperf3", "-c", serverIP}, args...)...).CombinedOutput()
		if err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "receiver") {
					t.Logf("iperf3 %s %s -> %s: %s", strings.Join(args, " "), client, server, strings.Join(strings.Fields(l), " "))
				}
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("iperf3 %s %s -> %s: %v\n%s", strings.Join(args, " "), client, server, err, out)
}

// testLog sends lab progress lines to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
