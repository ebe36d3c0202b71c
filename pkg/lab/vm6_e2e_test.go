package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
)

// requireVMBins skips (or, with LANEKIT_BIN set, fails) without QEMU or a
// built lanekit-vhost.
func requireVMBins(t *testing.T, bins Bins) {
	t.Helper()
	testutil.RequireBinary(t, "qemu-system-x86_64")
	if !executable(filepath.Join(bins.Dir, "lanekit-vhost")) {
		if os.Getenv("LANEKIT_BIN") != "" {
			t.Fatalf("lanekit-vhost missing in %s", bins.Dir)
		}
		testutil.MissingDep(t, "lanekit-vhost missing in %s", bins.Dir)
	}
}

// TestDualStackVMLab: the fast-lane VMs over IPv6 in a dual-stack lab (`lab
// up --vm --vms 2 --ip-family dual`: vm1 on node 2, vm2 on node 1, so VM to
// VM crosses nodes in lab check). The guest gets an IPv6 address from node 2's
// IPv6 pod range (its gateway fe80::1 answered by the datapath's NDP
// responder, as for pods); `lab check` passes with the IPv6 VM rows (pods
// and nodes to the VM, the VM to pods and nodes); IPv6 bulk TCP between a
// pod on node 1 and the guest on node 2, both ways, is carried by BPF and
// the fast lane (0 kernel-forwarded: Ip6OutForwDatagrams in both node
// netns; the pod's and the VM's endpoint counters and lanekit-vhost's frame
// counters account for the packets). Then an IPv6 ClusterIP with the guest
// as its backend (from a pod) and one the guest reaches (its backend a pod
// on node 1), and a NetworkPolicy selecting the VM that admits only node
// 1's IPv6 pod range: the pod on node 1 gets in over IPv6, the pod on
// node 2 does not (over either family), and the VM's endpoint counts the
// denied connections as policy-ingress drops. Last (it moves the guest):
// `lab vm migrate` node 2 -> 1 -> 2 keeps the guest's IPv6 address
// (dualStackMigration). QEMU under TCG: transfers are 3 s, every probe
// bounded. Root only; brings up the global lab.
func TestDualStackVMLab(t *testing.T) {
	bins := pathTestBins(t)
	bins.Self = CLIForTests(t)
	requireVMBins(t, bins)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, VM: true, VMQueues: 1, VMs: 2, NoStdVM: true, IPFamily: IPFamilyDual, Bins: bins})
	if len(st.VMs) != 2 || st.VMs[0].Node != 2 || st.VMs[1].Node != 1 || st.VMs[1].IP6 == "" {
		t.Fatalf("want vm1 on node 2 and vm2 (with IPv6) on node 1, got %+v", st.VMs)
	}
	vm := st.VMs[0]
	vmIP := netip.MustParseAddr(vm.IP)
	vm6, err := netip.ParseAddr(vm.IP6)
	if err != nil || !netip.MustParsePrefix(PodCIDR6(2)).Contains(vm6) {
		t.Fatalf("VM IPv6 address %q (%v): want one in node 2's IPv6 pod range %s", vm.IP6, err, PodCIDR6(2))
	}
	pods := map[int]Pod{}
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			if p.Kind == KindLanekit && pods[n.Index].NS == "" {
				pods[n.Index] = p
			}
		}
	}
	pod1 := pods[1]
	if pod1.IP6 == "" || pods[2].IP6 == "" {
		t.Fatalf("lanekit pods without IPv6: %+v", pods)
	}

	// lab check first: it takes the guest console, which serves one client.
	t.Run("lab check", func(t *testing.T) {
		var out bytes.Buffer
		err := Check(ctx, bins, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
		// VM to VM across nodes: vm2 (node 1) is a source and a target of
		// the IPv6 VM matrix, and of the IPv4 one.
		for _, want := range []string{"and every lanekit VM's IPv6 address", "nodes over IPv6: ICMPv6 + TCP echo to every lanekit VM",
			"lanekit VMs over IPv6 (commands through the guest console)", "vm2 (" + st.VMs[1].IP6 + ")",
			"lanekit VMs (commands through the guest console): ICMP + TCP echo to every lanekit pod and every node and every other VM"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("lab check printed no %q matrix", want)
			}
		}
	})

	con, err := guest.DialConsole(ctx, vm.SerialSocket)
	if err != nil {
		t.Fatalf("guest console: %v", err)
	}
	defer con.Close()
	if out, code, err := con.Run(ctx, "ip -6 route show default; ip -6 addr show scope global"); err != nil || code != 0 ||
		!strings.Contains(out, "via fe80::1") || !strings.Contains(out, vm.IP6+"/128") {
		t.Fatalf("guest IPv6 configuration: exit %d, %v: %q (want %s/128 and a default route via fe80::1)", code, err, out, vm.IP6)
	}

	t.Run("IPv6 bulk TCP pod and VM", func(t *testing.T) {
		podVMBulkPath(t, ctx, vm, con, pod1.NS, vmIP, netip.MustParseAddr(pod1.IP), vm.IP6, IP6OutForwDatagrams, "IPv6 datagrams")
	})

	applyAll := func(t *testing.T, what, yaml string) { labApply(t, ctx, bins.Self, what, yaml) } // ipv6only_e2e_test.go
	lbNew := func(node int) uint64 { return agentStatus(t, node).GetControlPlane().GetLbCounters()["new-flow"] }
	const vmVIP6, podVIP6 = "fd00:96::30", "fd00:96::31"

	t.Run("pod to an IPv6 ClusterIP with the VM as its backend", func(t *testing.T) {
		applyAll(t, "service", ipv6ClusterIPService("vm6", vmVIP6, 8080, vm.IP6))
		before := lbNew(1)
		const n = 3
		for i := range n {
			var out string
			var err error
			for try := 0; try < 3; try++ { // the agents apply the Service asynchronously
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				out, err = inNS(cctx, pod1.NS, "busybox", "sh", "-c", fmt.Sprintf("echo pod-%d | busybox nc -w 3 %s 80", i, vmVIP6))
				cancel()
				if err == nil && strings.Contains(out, "LK-HELLO") {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || !strings.Contains(out, "LK-HELLO") {
				t.Fatalf("pod -> [%s]:80 (the guest's responder): %v: %q", vmVIP6, err, out)
			}
		}
		d := since(lbNew(1), before)
		t.Logf("node1: LB new-flow +%d for %d connections to the VM's IPv6 ClusterIP", d, n)
		if d < n {
			t.Errorf("node1 load-balanced %d new flows for the pod's %d connections", d, n)
		}
	})

	t.Run("VM to an IPv6 ClusterIP with a pod on node 1 as its backend", func(t *testing.T) {
		echo, err := startEchoOn(ctx, bins, pod1.NS, EchoPort6)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { echo.Process.Kill(); echo.Wait() }()
		applyAll(t, "service", ipv6ClusterIPService("pod6", podVIP6, EchoPort6, pod1.IP6))
		before := lbNew(2)
		const n = 3
		for i := range n {
			token := fmt.Sprintf("vm6-%d", i)
			cmd := fmt.Sprintf("echo %s | nc -w 3 %s 80", token, podVIP6)
			var out string
			var code int
			for try := 0; try < 3; try++ {
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				out, code, err = con.Run(cctx, cmd)
				cancel()
				if err == nil && code == 0 && strings.Contains(out, token) {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || code != 0 || !strings.Contains(out, token) {
				t.Fatalf("%q in the guest: exit %d, %v: %q", cmd, code, err, out)
			}
		}
		d := since(lbNew(2), before)
		t.Logf("node2: LB new-flow +%d for the guest's %d connections", d, n)
		if d < n {
			t.Errorf("node2 load-balanced %d new flows for the guest's %d connections", d, n)
		}
	})

	t.Run("NetworkPolicy selecting the VM over IPv6", func(t *testing.T) {
		dial := func(t *testing.T, from, addr string) bool { return echoDial(t, ctx, bins.Self, from, addr) }
		vm6Echo := net.JoinHostPort(vm.IP6, fmt.Sprint(EchoPort6))
		vm4Echo := net.JoinHostPort(vm.IP, fmt.Sprint(EchoPort))
		// Before the policy both pods reach the guest.
		for _, p := range []Pod{pods[1], pods[2]} {
			if !dial(t, p.NS, vm6Echo) {
				t.Fatalf("%s -> %s fails without a policy", p.NS, vm6Echo)
			}
		}
		applyAll(t, "policy", fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: vm-from-node1-pods, namespace: default}
spec:
  podSelector: {matchLabels: {%s: %s}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: "%s"}}]
`, VMLabelDomain, vm.Name, PodCIDR6(1)))
		drops := func() uint64 { return endpointCounters(t, 2)[vm.IP6].GetDrops()["policy-ingress"] }
		before := drops()
		deadline := time.Now().Add(10 * time.Second)
		for dial(t, pods[2].NS, vm6Echo) { // the agents apply the policy asynchronously
			if time.Now().After(deadline) {
				t.Fatalf("%s -> %s still connects under a policy admitting only %s", pods[2].NS, vm6Echo, PodCIDR6(1))
			}
			time.Sleep(500 * time.Millisecond)
		}
		if dial(t, pods[2].NS, vm4Echo) {
			t.Errorf("%s -> %s (IPv4) connects under a policy admitting only %s", pods[2].NS, vm4Echo, PodCIDR6(1))
		}
		if !dial(t, pod1.NS, vm6Echo) {
			t.Errorf("%s -> %s (in the admitted IPv6 block) is refused", pod1.NS, vm6Echo)
		}
		d := since(drops(), before)
		t.Logf("VM endpoint: policy-ingress drops +%d", d)
		if d < 2 {
			t.Errorf("the VM's endpoint counted %d policy-ingress drops for the denied connections", d)
		}
		for node := 1; node <= 2; node++ {
			labCLI(t, ctx, bins.Self, "policy", "delete", "default/vm-from-node1-pods", "--socket", AgentSocket(node))
		}
	})

	con.Close() // the guest's console moves with it
	for _, to := range []int{1, 2} {
		t.Run(fmt.Sprintf("migrate to node %d keeps the IPv6 address", to), func(t *testing.T) {
			dualStackMigration(t, ctx, bins, vm.Name, vmIP, vm6, to)
		})
	}
}

// dualStackMigration moves the dual-stack lab's guest to node to with `lab
// vm migrate`'s code while a pod on each node pings its IPv4 and its IPv6
// address every 10 ms and holds a TCP connection to each: both connections
// survive, each pinger loses at most maxMigrationLoss; the guest's IPv6
// address is in the target's IPv6 endpoint map under the target's endpoint
// ID and no longer in the source's; IPv6 pings from both nodes after the
// move reach that endpoint (its counters), and the old node forwarded no
// IPv6 datagram in the kernel (Ip6OutForwDatagrams) throughout: its pods
// reach the guest over BPF and the claim's /128 route.
func dualStackMigration(t *testing.T, ctx context.Context, bins Bins, name string, vmIP, vm6 netip.Addr, to int) {
	before, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	from := vmOf(t, name).Node
	fwd0, err := IP6OutForwDatagrams(ctx, NodeNS(from))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	rep, err := MigrateVM(ctx, MigrateOptions{VM: name, To: to, Bins: bins, Out: testLog{t}})
	if rep != nil {
		t.Logf("report:\n%s", rep)
	}
	if err != nil {
		migrationDiagnostics(t, ctx, name, vmIP, from, to)
		t.Fatalf("migrate: %v", err)
	}
	if rep.IP6 != vm6.String() || rep.TCP6 == nil || len(rep.Pings6) != len(before.Nodes) {
		t.Fatalf("report: IPv6 %q, tcp6 %v, %d IPv6 pingers: want %s and a pinger on each node", rep.IP6, rep.TCP6, len(rep.Pings6), vm6)
	}
	for _, tcp := range []TCPStats{rep.TCP, *rep.TCP6} {
		if tcp.Error != "" || tcp.Exchanges < 10 {
			t.Errorf("tcp connection %s: %+v", tcp.Local, tcp)
		}
	}
	for _, p := range append(rep.Pings, rep.Pings6...) {
		if p.Sent < 100 || p.Lost > maxMigrationLoss {
			t.Errorf("pings from %s: %d sent, %d lost (at most %d)", p.From, p.Sent, p.Lost, maxMigrationLoss)
		}
	}
	if lv := vmOf(t, name); lv.Node != to || lv.IP6 != vm6.String() {
		t.Fatalf("lab state after the move: vm on node %d with IPv6 %q, want node %d, %s", lv.Node, lv.IP6, to, vm6)
	}
	id, c0, err := datapath.PinnedCounters(BPFDir(to), vm6)
	if err != nil || id != rep.TargetID {
		t.Fatalf("node %d IPv6 endpoint map: %s is endpoint %d (%v), want the target's %d", to, vm6, id, err, rep.TargetID)
	}
	if id, _, err := datapath.PinnedCounters(BPFDir(from), vm6); err == nil {
		t.Errorf("node %d (the source) still has %s in its IPv6 endpoint map (endpoint %d)", from, vm6, id)
	}
	for n := 1; n <= len(before.Nodes); n++ {
		pod := PodNS(n, 1, KindLanekit)
		if out, err := nsCommand(ctx, pod, append(pingCommand(), "-6", "-c", "3", "-W", "2", vm6.String())...).CombinedOutput(); err != nil {
			t.Errorf("ping %s from %s after the migration: %v\n%s", vm6, pod, err, out)
		}
	}
	_, c1, err := datapath.PinnedCounters(BPFDir(to), vm6)
	if err != nil {
		t.Fatal(err)
	}
	if got := c1.ToPackets - c0.ToPackets; got < 6 {
		t.Errorf("node %d endpoint %d: %d packets delivered for 6 IPv6 pings from both nodes", to, id, got)
	}
	fwd1, err := IP6OutForwDatagrams(ctx, NodeNS(from))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d -> %d: IPv6 path: target endpoint %d +%d packets for 6 pings; old node Ip6OutForwDatagrams +%d; %s",
		from, to, id, c1.ToPackets-c0.ToPackets, fwd1-fwd0, time.Since(began).Round(time.Millisecond))
	if fwd1 != fwd0 {
		t.Errorf("node %d (the old node) forwarded %d IPv6 datagrams in the kernel across the move", from, fwd1-fwd0)
	}
}

// ipv6ClusterIPService renders an IPv6-only ClusterIP Service (TCP 80 →
// port) in namespace default with one IPv6 backend.
func ipv6ClusterIPService(name, vip string, port int, backend string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  clusterIP: "%[2]s"
  clusterIPs: ["%[2]s"]
  ipFamilies: [IPv6]
  ports:
  - {name: p, port: 80, targetPort: %[3]d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv6
ports: [{name: p, port: %[3]d}]
endpoints:
- addresses: ["%[4]s"]
`, name, vip, port, backend)
}
