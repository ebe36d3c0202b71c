package lab

import (
	"context"
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

	"github.com/lanekit/lanekit/pkg/k8s"
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
		"exec", "-n", "default", client, "--", "ping", "-i", "0.05", "-c", strconv.Itoa(count), "-W", "1", vmIP.String())
	var pingOut strings.Builder
	ping.Stdout, ping.Stderr = &pingOut, &pingOut
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	pingDone := make(chan error, 1)
	go func() { pingDone <- ping.Wait() }()
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
	sock, err := RealNodeAgentSocket(1)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := findAgentVM(ctx, sock, k8s.VMName("default", "vm1"))
	if err != nil {
		t.Fatalf("node 1's agent: %v", err)
	}
	if a, _, _ := strings.Cut(vm.GetAddress(), "/"); a != vmIP.String() {
		t.Errorf("node 1's VM endpoint has %s, want the address the VM kept, %s", vm.GetAddress(), vmIP)
	}
	if _, err := kubectl(ctx, nodeBins, nil, "exec", "-n", "default", client, "--", "curl", "-sS", "-m", "10", "-o", "/dev/null", "http://"+vmIP.String()+"/"); err != nil {
		t.Errorf("HTTP to the guest on node 1: %v", err)
	}
	sent, lost, gap := pingGaps(pingOut.String())
	t.Logf("KubeVirt migration node 2 -> node 1 in %.1f s (VirtualMachineInstanceMigration Succeeded); pings every %v: %d sent, %d lost, longest gap %d (~%v of network blackout)",
		took.Seconds(), interval, sent, lost, gap, time.Duration(gap+1)*interval)
	if sent == 0 || lost*2 > sent {
		t.Errorf("pings: %d sent, %d lost:\n%s", sent, lost, tail(pingOut.String(), 2000))
	}
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
