package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/guest"
)

// The parts of TestDPULab (dpu_e2e_test.go) with the fast-lane VM on the
// DPU node (`lab up --dpu-nodes 1 --vm --vm-node 1`) and NetworkPolicy
// across the two kinds of node.

// dpuVMDeviceNS is the namespace the DPU agent gives node i's VM name's
// device (--vm-netns-dir /run/netns, prefixed with the DPU's name).
func dpuVMDeviceNS(i int, name string) string { return DPUNS(i) + "-" + name }

// netnsInode is the inode of a lab namespace.
func netnsInode(t *testing.T, ns string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(netnsPath(ns), &st); err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
	return st.Ino
}

// dpuVMPlacement: the VM's QEMU runs in its launcher namespace on the host,
// which holds no device of it; the VM's device with its steering program is
// in its namespace on the DPU, the representor with the pod programs in the
// DPU's, and lanekit-vhost runs in the DPU's namespace.
func dpuVMPlacement(t *testing.T, vm LabVM) {
	t.Helper()
	if vm.Node != 1 || vm.BackendNS != DPUNS(1) {
		t.Fatalf("vm %s on node %d with its backend in %q, want node 1 and %s", vm.Name, vm.Node, vm.BackendNS, DPUNS(1))
	}
	if found, err := datapathIn(vm.NS, PodCIDR(1)); err != nil || len(found) > 0 {
		t.Errorf("the VM's launcher namespace %s on the host holds lanekit datapath: %v %v", vm.NS, found, err)
	}
	if out, err := exec.Command("ip", "-n", vm.NS, "-o", "link").Output(); err != nil || strings.Count(string(out), "\n") != 1 {
		t.Errorf("the VM's launcher namespace has devices besides lo: %v\n%s", err, out)
	}
	// The VM's receive program on its device: steer_vm (XDP, the AF_XDP
	// path) until the backend takes packet sockets (--rx-gso kernel, the
	// default), then vm_rx_drop at tcx ingress.
	devNS := dpuVMDeviceNS(1, vm.Name)
	found, err := datapathIn(devNS, PodCIDR(1))
	if f := fmt.Sprint(found); err != nil || !strings.Contains(f, "XDP program") && !strings.Contains(f, "TCXIngress program") {
		t.Errorf("the VM's device namespace %s on the DPU: %v %v, want steer_vm (XDP) or vm_rx_drop (tcx) on the VM's device", devNS, found, err)
	}
	for what, want := range map[int]string{vm.BackendPID: DPUNS(1), vm.QEMUPID: vm.NS} {
		ino, ok := procNetnsInode(what)
		if !ok || ino != netnsInode(t, want) {
			t.Errorf("pid %d (backend %d, QEMU %d) is not in %s", what, vm.BackendPID, vm.QEMUPID, want)
		}
	}
}

// dpuPolicyAcrossKinds: a NetworkPolicy selecting a pod on the DPU node
// (app=web on node 1, admitting role=client) is enforced on the DPU:
// node 2's client reaches web, node 2's other pod is dropped, and the drop
// is counted by the DPU's programs (the web endpoint's policy-ingress drop
// reason and the policy's verdicts, read from the DPU agent).
func dpuPolicyAcrossKinds(t *testing.T, lk func(t *testing.T, args ...string) (string, error), cli string) {
	pods := addLabPods(t, lk, []labPodSpec{
		{name: "web", ns: "shop", node: 1, labels: "app=web", ports: "http=8080/TCP"},
		{name: "client", ns: "shop", node: 2, labels: "role=client"},
		{name: "other", ns: "shop", node: 2, labels: "role=other"},
	})
	web := pods["web"].IP
	webFromClientsPolicy(t, lk, cli) // labpolicy_test.go: on both nodes' agents (node 1's forwards to its DPU)
	drops := func() uint64 { return dpuCounters(t, 1)[web].GetDrops()["policy-ingress"] }
	before := drops()
	ask := func(from string) int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := inNS(ctx, NamedPodNS(from), cli, "lab", "tcp-ask", web+":8080", "--count", "3", "--timeout", "1s")
		if err != nil {
			t.Fatalf("tcp-ask from %s: %v: %s", from, err, out)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s -> web on the DPU node: %v", from, got)
		return got[web+":8080"]
	}
	if got := ask("client"); got != 3 {
		t.Errorf("client (node 2) -> web (node 1, DPU) answered %d of 3 under a policy admitting it", got)
	}
	if got := ask("other"); got != 0 {
		t.Errorf("other (node 2) -> web (node 1, DPU) answered %d of 3 under a policy denying it", got)
	}
	if d := since(drops(), before); d == 0 {
		t.Errorf("the DPU's web endpoint counted no policy-ingress drop for the denied pod")
	} else {
		t.Logf("DPU: web endpoint policy-ingress drops +%d", d)
	}
	c, closeFn, err := agentClient(DPUSocket(1))
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
	if err != nil || len(resp.GetPolicies()) != 1 {
		t.Fatalf("the DPU's policies: %v %v, want the one applied through the host", resp, err)
	}
	if p := resp.GetPolicies()[0]; p.GetAllowedPackets() == 0 || p.GetDeniedPackets() == 0 {
		t.Errorf("the DPU's policy verdicts: %+v, want allowed and denied packets", p)
	}
	if found, err := datapathIn(NodeNS(1), PodCIDR(1)); err != nil || len(found) > 0 {
		t.Errorf("node 1 with a pod and a policy more: %v %v", found, err)
	}
	for node := 1; node <= 2; node++ {
		if _, err := lk(t, "policy", "delete", "shop/web-from-clients", "--socket", AgentSocket(node)); err != nil {
			t.Error(err)
		}
	}
}

// dpuVMSample is what the VM path on the DPU is judged by.
type dpuVMSample struct {
	to, from     uint64 // the VM endpoint's packets (DPU agent)
	vhRX, vhTX   uint64 // packets lanekit-vhost moved into / out of the guest
	vhRXBytes    uint64 // bytes it moved into the guest
	fwdDPU, fwdN uint64 // IpForwDatagrams: the DPU's stack, node 1's
}

func takeDPUVM(t *testing.T, ctx context.Context, vm LabVM) dpuVMSample {
	t.Helper()
	var s dpuVMSample
	c := dpuCounters(t, 1)[vm.IP]
	if c == nil {
		t.Fatalf("the DPU agent has no endpoint %s (the VM)", vm.IP)
	}
	s.to, s.from = c.GetToPackets(), c.GetFromPackets()
	var err error
	if s.vhRX, s.vhTX, err = bench.BackendPackets(ctx, vm.MetricsSocket); err != nil {
		t.Fatal(err)
	}
	if s.vhRXBytes, err = bench.BackendRxBytes(ctx, vm.MetricsSocket); err != nil {
		t.Fatal(err)
	}
	if s.fwdDPU, err = IPForwDatagrams(ctx, DPUNS(1)); err == nil {
		s.fwdN, err = IPForwDatagrams(ctx, NodeNS(1))
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// judgeDPUVM: the VM's traffic between a and b went through the DPU's
// programs (its endpoint's counters, at least min packets each way) and
// lanekit-vhost, and through neither the DPU's stack (at most 1 % plus 5
// datagrams forwarded there) nor node 1's (none).
// min bounds the packets the DPU's programs count each way (skbs: a GSO or
// GRO packet counts once) and, when frames > 0, the frames lanekit-vhost
// moves into the guest (one per segment).
func judgeDPUVM(t *testing.T, what string, a, b dpuVMSample, min, minBytes uint64) {
	t.Helper()
	to, from := since(b.to, a.to), since(b.from, a.from)
	rx, tx := since(b.vhRX, a.vhRX), since(b.vhTX, a.vhTX)
	rxBytes := since(b.vhRXBytes, a.vhRXBytes)
	fwdDPU, fwdN := since(b.fwdDPU, a.fwdDPU), since(b.fwdN, a.fwdN)
	t.Logf("%s: DPU VM endpoint to %d from %d; lanekit-vhost into the guest %d (%d bytes), out %d; forwarded by the DPU's stack %d, node 1's %d",
		what, to, from, rx, rxBytes, tx, fwdDPU, fwdN)
	if to < min || from < min {
		t.Errorf("%s: the DPU's programs counted %d packets to the VM and %d from it, want >= %d each", what, to, from, min)
	}
	if rxBytes < minBytes {
		t.Errorf("%s: lanekit-vhost moved %d bytes into the guest, want >= %d", what, rxBytes, minBytes)
	}
	if rx < to*9/10 || tx < from*9/10 {
		t.Errorf("%s: lanekit-vhost moved %d frames in and %d out for %d/%d packets of the VM's endpoint: not the fast lane", what, rx, tx, to, from)
	}
	if fwdDPU > (to+from)/100+5 {
		t.Errorf("%s: the DPU's stack forwarded %d datagrams of the VM's %d packets: not the BPF path", what, fwdDPU, to+from)
	}
	if fwdN != 0 {
		t.Errorf("%s: node 1's stack forwarded %d datagrams", what, fwdN)
	}
}

// dpuVMServicesPolicy: a pod on node 2 reaches the VM on the DPU node
// through a ClusterIP (the guest's responder), and with bulk TCP; both
// through the DPU's programs and lanekit-vhost, not the DPU's stack. Then a
// NetworkPolicy selecting the VM by kubevirt.io/domain and admitting node
// 1's pods: node 1's pod reaches the guest, node 2's is dropped on the DPU
// (the VM endpoint's policy-ingress drops).
func dpuVMServicesPolicy(t *testing.T, ctx context.Context, self string, vm LabVM) {
	client1, client2 := PodNS(1, 1, KindLanekit), PodNS(2, 1, KindLanekit)
	t.Run("ClusterIP from node 2 to the VM on the DPU", func(t *testing.T) {
		const vip = "10.96.120.40"
		labApply(t, ctx, self, "service", strings.ReplaceAll(clusterIPService("dpuvm", vip, vm.IP), "tunvm", "default"))
		lbNew := func() uint64 { return agentStatus(t, 2).GetControlPlane().GetLbCounters()["new-flow"] }
		a, lb := takeDPUVM(t, ctx, vm), lbNew()
		const n = 5
		for i := range n {
			var out string
			var err error
			for try := 0; try < 3; try++ { // the agents apply the Service asynchronously
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				out, err = inNS(cctx, client2, "busybox", "sh", "-c", fmt.Sprintf("echo pod-%d | busybox nc -w 3 %s 80", i, vip))
				cancel()
				if err == nil && strings.Contains(out, "LK-HELLO") {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || !strings.Contains(out, "LK-HELLO") {
				t.Fatalf("node 2 pod -> %s:80 (the guest's responder on the DPU node): %v: %q", vip, err, out)
			}
		}
		if d := since(lbNew(), lb); d < n {
			t.Errorf("node 2 load-balanced %d new flows for %d connections to the VM's ClusterIP", d, n)
		}
		// At least 3 packets each way per connection (SYN, ACK, data or FIN;
		// the guest may send its data with the FIN, so 5 is not a floor).
		judgeDPUVM(t, "ClusterIP", a, takeDPUVM(t, ctx, vm), 3*n, 0)
	})

	con, err := guest.DialConsole(ctx, vm.SerialSocket)
	if err != nil {
		t.Fatalf("guest console: %v", err)
	}
	defer con.Close()
	t.Run("bulk TCP node 2 pod to the VM on the DPU", func(t *testing.T) {
		if out, code, err := con.Run(ctx, "cd /tmp && timeout 40 iperf3 -s -1 -p 5201 >/tmp/lk-dpu.log 2>&1 </dev/null &"); err != nil || code != 0 {
			t.Fatalf("start iperf3 in the guest: %v (exit %d) %s", err, code, out)
		}
		a := takeDPUVM(t, ctx, vm)
		var out []byte
		var cerr error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if out, cerr = nsCommand(ctx, client2, "iperf3", "-c", vm.IP, "-p", "5201", "-t", "3").CombinedOutput(); cerr == nil {
				break
			}
		}
		if cerr != nil {
			t.Fatalf("iperf3 node 2 pod -> VM: %v\n%s", cerr, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "receiver") {
				t.Logf("iperf3 node 2 pod -> VM on the DPU node: %s", strings.Join(strings.Fields(l), " "))
			}
		}
		// Bulk TCP crosses the DPU's programs as GRO/GSO packets (tens of
		// KiB each, fewer with BIG TCP) and the guest acks per GRO packet:
		// the packet counts are hundreds. What lanekit-vhost hands the guest
		// is GSO packets (--rx-gso kernel) or wire frames (xdp): count bytes,
		// at least 10,000 full segments' worth.
		judgeDPUVM(t, "bulk", a, takeDPUVM(t, ctx, vm), 100, 10000*1448)
	})

	t.Run("NetworkPolicy selecting the VM by kubevirt.io/domain", func(t *testing.T) {
		dial := func(from string) bool {
			return echoDial(t, ctx, self, from, net.JoinHostPort(vm.IP, strconv.Itoa(EchoPort)))
		}
		for _, p := range []string{client1, client2} {
			if !dial(p) {
				t.Fatalf("%s -> the VM's echo fails without a policy", p)
			}
		}
		labApply(t, ctx, self, "policy", fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: vm-from-node1, namespace: default}
spec:
  podSelector: {matchLabels: {%s: %s}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: "%s"}}]
`, VMLabelDomain, vm.Name, PodCIDR(1)))
		drops := func() uint64 { return dpuCounters(t, 1)[vm.IP].GetDrops()["policy-ingress"] }
		before := drops()
		deadline := time.Now().Add(10 * time.Second)
		for dial(client2) { // the agents apply the policy asynchronously
			if time.Now().After(deadline) {
				t.Fatalf("%s -> the VM still connects under a policy admitting only %s", client2, PodCIDR(1))
			}
			time.Sleep(500 * time.Millisecond)
		}
		if !dial(client1) {
			t.Errorf("%s (node 1, admitted) -> the VM is refused", client1)
		}
		d := since(drops(), before)
		t.Logf("DPU: VM endpoint policy-ingress drops +%d", d)
		if d == 0 {
			t.Errorf("the DPU's VM endpoint counted no policy-ingress drop for the denied pod")
		}
		for node := 1; node <= 2; node++ {
			labCLI(t, ctx, self, "policy", "delete", "default/vm-from-node1", "--socket", AgentSocket(node))
		}
	})
}

// dpuVMStatus: `lanekit status` lists the VM on both sides, the host saying
// its fast lane is on the DPU, the DPU naming the device's namespace there.
func dpuVMStatus(t *testing.T, lk func(t *testing.T, args ...string) (string, error), vm LabVM) {
	t.Helper()
	dev := fmt.Sprintf("device eth0 in netns %s", netnsPath(dpuVMDeviceNS(1, vm.Name)))
	host, _ := lk(t, "status", "--socket", AgentSocket(1))
	if !strings.Contains(host, fmt.Sprintf("vm:           %s %s/32 on the DPU (QEMU here): %s", vm.Name, vm.IP, dev)) {
		t.Errorf("host status does not list %s with its fast lane on the DPU", vm.Name)
	}
	dpu, _ := lk(t, "status", "--socket", DPUSocket(1))
	if !strings.Contains(dpu, fmt.Sprintf("vm:           %s %s/32 here: %s", vm.Name, vm.IP, dev)) || !strings.Contains(dpu, "(serving)") {
		t.Errorf("DPU status does not list %s with its device there", vm.Name)
	}
}

// keptRe reads how many endpoints a restarted agent re-adopted.
var keptRe = regexp.MustCompile(`"msg":"re-adopted endpoints","kept":(\d+)`)
