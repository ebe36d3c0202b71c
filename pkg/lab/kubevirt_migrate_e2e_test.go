package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// kubevirtMigrate live-migrates vm1 from node 2 to node 1 with a
// VirtualMachineInstanceMigration, as `virtctl migrate` does, while the
// client pod pings the guest every 50 ms: the migration succeeds, the VMI
// runs on node 1 with the address it had, node 1's agent holds its VM
// endpoint active on that address, and the guest answers ping and HTTP
// there. The pings lost and the longest gap (the network's blackout, at
// 50 ms resolution) are logged: a benchmark figure, not a pass mark.
func kubevirtMigrate(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr) {
	const interval, count = 50 * time.Millisecond, 2400 // 120 s at most
	pingCtx, stopPing := context.WithCancel(ctx)
	defer stopPing()
	ping := exec.CommandContext(pingCtx, "nsenter", "--net="+netnsPath(WireNS), "--", filepath.Join(nodeBins, "kubectl"), "--kubeconfig", Kubeconfig,
		"exec", "-n", "default", client, "--", "ping", "-D", "-i", "0.05", "-c", strconv.Itoa(count), "-W", "1", vmIP.String())
	var pingOut strings.Builder
	ping.Stdout, ping.Stderr = &pingOut, &pingOut
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	pingDone := make(chan error, 1)
	go func() { pingDone <- ping.Wait() }()
	// A TCP connection held through the move: a line every 100 ms to the
	// guest's echo port, each echo stamped on arrival.
	const lines = 350
	stream := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(WireNS), "--", filepath.Join(nodeBins, "kubectl"), "--kubeconfig", Kubeconfig,
		"exec", "-n", "default", client, "--", "bash", "-c", "set -o pipefail; for i in $(seq 1 "+strconv.Itoa(lines)+"); do echo $i; sleep 0.1; done | "+
			"socat -t 10 - TCP:"+vmIP.String()+":7777 | while read -r l; do echo \"$l $(date +%s%N)\"; done")
	var streamOut strings.Builder
	stream.Stdout, stream.Stderr = &streamOut, &streamOut
	if err := stream.Start(); err != nil {
		t.Fatal(err)
	}
	streamDone := make(chan error, 1)
	go func() { streamDone <- stream.Wait() }()
	time.Sleep(2 * time.Second) // a baseline before the move

	const mig = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata:
  name: vm1-move
  namespace: default
spec:
  vmiName: vm1
`
	start := time.Now()
	if _, err := kubectl(ctx, nodeBins, []byte(mig), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	var phase string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, nodeBins, nil, "get", "vmim", "vm1-move", "-n", "default", "-o", "jsonpath={.status.phase}")
		phase = strings.TrimSpace(out)
		return err == nil && (phase == "Succeeded" || phase == "Failed"), nil
	}); err != nil || phase != "Succeeded" {
		st, _ := kubectl(ctx, nodeBins, nil, "get", "vmim", "vm1-move", "-n", "default", "-o", "yaml")
		t.Fatalf("migration phase %q (%v):\n%s\npods: %s", phase, err, st, podSummary(ctx, kc, "default"))
	}
	took := time.Since(start)
	time.Sleep(3 * time.Second) // the pings after the move
	stopPing()
	<-pingDone

	node, _ := kubectl(ctx, nodeBins, nil, "get", "vmi", "vm1", "-n", "default", "-o", "jsonpath={.status.nodeName} {.status.interfaces[0].ipAddress}")
	if f := strings.Fields(node); len(f) != 2 || f[0] != KubeNodeName(1) || f[1] != vmIP.String() {
		t.Errorf("after the migration the VMI reports node and address %q, want %s %s", node, KubeNodeName(1), vmIP)
	}
	vm := kvAgentVM(t, ctx, 1)
	if a, _, _ := strings.Cut(vm.GetAddress(), "/"); a != vmIP.String() {
		t.Errorf("node 1's VM endpoint has %s, want the address the VM kept, %s", vm.GetAddress(), vmIP)
	}
	if _, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "http://"+vmIP.String()+"/"); err != nil {
		t.Errorf("HTTP to the guest on node 1: %v", err)
	}
	var streamErr error
	select {
	case streamErr = <-streamDone:
	case <-time.After(90 * time.Second):
		streamErr = errors.New("still running 90 s after the migration")
	}
	got, tcpGap, err := echoGaps(streamOut.String(), lines)
	if streamErr != nil || err != nil {
		t.Errorf("the TCP connection held through the migration: %v, %v; got %d of %d echoes:\n%s", streamErr, err, got, lines, tail(streamOut.String(), 1500))
	} else {
		t.Logf("TCP connection held through the migration: %d/%d echoes in order, longest gap between echoes %v (100 ms apart without a move)", got, lines, tcpGap.Round(time.Millisecond))
	}
	sent, lost, gap := pingGaps(pingOut.String())
	// Where the blackout went: the last reply before the longest gap, the
	// target agent's activation (what told it, when), the first reply after.
	if last, first, ok := pingGapEdges(pingOut.String()); ok && vm.GetActivatedUnixNano() != 0 {
		act := time.Unix(0, vm.GetActivatedUnixNano())
		// Replies are stamped when they arrive: a reply held up before the
		// gap (queued in the source) makes the gap between replies shorter
		// than the pings lost say.
		t.Logf("replies around the longest gap %v apart: the target agent activated the VM endpoint %v after the last reply before it (by %s), the first reply after it came %v after that",
			first.Sub(last).Round(time.Millisecond), act.Sub(last).Round(time.Millisecond), vm.GetActivatedBy(), first.Sub(act).Round(time.Millisecond))
	}
	t.Logf("KubeVirt migration node 2 -> node 1 in %.1f s (VirtualMachineInstanceMigration Succeeded); pings every %v: %d sent, %d lost, longest gap %d (~%v of network blackout)",
		took.Seconds(), interval, sent, lost, gap, time.Duration(gap+1)*interval)
	if sent == 0 || lost*2 > sent {
		t.Errorf("pings: %d sent, %d lost:\n%s", sent, lost, tail(pingOut.String(), 2000))
	}
}

// echoGaps reads the stamped echoes ("<seq> <unix ns>" lines): how many
// came back, and the longest time between two consecutive ones; an echo
// out of order or missing is an error.
func echoGaps(out string, want int) (got int, longest time.Duration, err error) {
	var last int64
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		seq, err1 := strconv.Atoi(f[0])
		ts, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if seq != got+1 {
			return got, longest, fmt.Errorf("echo %d after %d", seq, got)
		}
		if last != 0 {
			longest = max(longest, time.Duration(ts-last))
		}
		got, last = seq, ts
	}
	if got != want {
		return got, longest, fmt.Errorf("%d of %d echoes", got, want)
	}
	return got, longest, nil
}

// pingGaps reads ping's output: the echoes sent (the highest sequence
// seen or the summary's count), how many got no reply, and the longest
// run of consecutive sequence numbers without one.
func pingGaps(out string) (sent, lost, longest int) {
	got := map[int]bool{}
	for _, m := range regexp.MustCompile(`icmp_seq=(\d+)`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		got[n] = true
		sent = max(sent, n)
	}
	if m := regexp.MustCompile(`(\d+) packets transmitted`).FindStringSubmatch(out); m != nil {
		n, _ := strconv.Atoi(m[1])
		sent = max(sent, n)
	}
	run := 0
	for seq := 1; seq <= sent; seq++ {
		if got[seq] {
			run = 0
			continue
		}
		lost++
		run++
		longest = max(longest, run)
	}
	return sent, lost, longest
}

// pingGapEdges reads `ping -D` output: the time of the last reply before
// the longest run of missing replies and of the first one after it.
func pingGapEdges(out string) (last, first time.Time, ok bool) {
	re := regexp.MustCompile(`^\[(\d+)\.(\d+)\] .*icmp_seq=(\d+)`)
	var prevSeq int
	var prevT time.Time
	longest := 0
	for _, l := range strings.Split(out, "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		sec, _ := strconv.ParseInt(m[1], 10, 64)
		frac := (m[2] + "000000000")[:9]
		ns, _ := strconv.ParseInt(frac, 10, 64)
		ts := time.Unix(sec, ns)
		seq, _ := strconv.Atoi(m[3])
		if prevSeq != 0 && seq-prevSeq-1 > longest {
			longest, last, first, ok = seq-prevSeq-1, prevT, ts, true
		}
		prevSeq, prevT = seq, ts
	}
	return last, first, ok
}

func TestPingGapEdges(t *testing.T) {
	out := "[1000.100000] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=63 time=1 ms\n[1000.150000] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=63 time=1 ms\n" +
		"[1000.500000] 64 bytes from 10.0.0.1: icmp_seq=9 ttl=63 time=1 ms\n[1000.600000] 64 bytes from 10.0.0.1: icmp_seq=11 ttl=63 time=1 ms\n"
	last, first, ok := pingGapEdges(out)
	if !ok || !last.Equal(time.Unix(1000, 150000000)) || !first.Equal(time.Unix(1000, 500000000)) {
		t.Errorf("pingGapEdges = %v %v %v", last, first, ok)
	}
	if _, _, ok := pingGapEdges("no replies\n"); ok {
		t.Error("edges without replies")
	}
}

func TestEchoGaps(t *testing.T) {
	if got, gap, err := echoGaps("1 1000000000\n2 1100000000\njunk\n3 1600000000\n", 3); err != nil || got != 3 || gap != 500*time.Millisecond {
		t.Errorf("echoGaps = %d, %v, %v; want 3, 500ms, nil", got, gap, err)
	}
	if _, _, err := echoGaps("1 1\n3 2\n", 3); err == nil {
		t.Error("a missing echo passed")
	}
	if _, _, err := echoGaps("1 1\n2 2\n", 3); err == nil {
		t.Error("a short stream passed")
	}
}

func TestPingGaps(t *testing.T) {
	out := "64 bytes from 10.0.0.1: icmp_seq=1 ttl=63 time=1 ms\n64 bytes from 10.0.0.1: icmp_seq=2 ttl=63 time=1 ms\n" +
		"64 bytes from 10.0.0.1: icmp_seq=6 ttl=63 time=1 ms\n64 bytes from 10.0.0.1: icmp_seq=8 ttl=63 time=1 ms\n"
	if sent, lost, gap := pingGaps(out); sent != 8 || lost != 4 || gap != 3 {
		t.Errorf("pingGaps = %d sent, %d lost, gap %d; want 8, 4, 3", sent, lost, gap)
	}
	if sent, lost, gap := pingGaps(out + "10 packets transmitted, 4 received, 60% packet loss\n"); sent != 10 || lost != 6 || gap != 3 {
		t.Errorf("with the summary: %d sent, %d lost, gap %d; want 10, 6, 3", sent, lost, gap)
	}
}
