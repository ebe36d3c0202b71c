package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// waitVMIRunning waits for VMI default/vm1's phase Running (KubeVirt's
// word that the domain runs) with its launcher pod running, failing with
// what KubeVirt and the launcher's containers say otherwise.
func waitVMIRunning(t *testing.T, ctx context.Context, kc kubernetes.Interface, launcher string) {
	t.Helper()
	if _, err := waitVMILauncher(ctx, kc, "vm1"); err != nil {
		t.Fatalf("%v\ncompute: %s\nsidecar: %s", err,
			tail(containerLogs(ctx, kc, launcher, "compute"), 4000), tail(containerLogs(ctx, kc, launcher, "hook-sidecar-0"), 2000))
	}
}

// kvPathSample is one reading of the pod (node 1) -> VM (node 2) path: the
// pod's and the VM's endpoint counters (lanekit's BPF programs), the VM's
// lanekit-vhost frames into and out of the guest, and each node's
// kernel-forwarded IPv4 datagrams.
type kvPathSample struct {
	pod, vm    datapath.Counters
	vhRX, vhTX uint64
	fwd        [2]uint64
}

// kubevirtGuestNet: the VMI's guest, booted by KubeVirt, gets the address
// lanekit's IPAM gave its VM endpoint and answers a pod on the other node.
//   - the address: the launcher pod's network-status for lanekit-vm (what
//     lanekit's CNI returned to Multus) is the agent's VM endpoint address,
//     with the VMI's MAC; the guest's NIC is configured with it over the
//     serial console (virt-serial0 in the launcher's private volume), as
//     cloud-init would be;
//   - the path: 20 pings and an HTTP GET from a pod on node 1, every echo
//     counted by the pod's endpoint (node 1's BPF), by the VM endpoint
//     (node 2's BPF) and by the VM's lanekit-vhost both ways.
func kubevirtGuestNet(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, launcher string) {
	pod, err := kc.CoreV1().Pods("default").Get(ctx, launcher, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != KubeNodeName(2) {
		t.Fatalf("launcher pod on %s, want %s (the VMI's nodeSelector)", pod.Spec.NodeName, KubeNodeName(2))
	}
	netAddr, err := kubevirtVMAddress(pod, BindingLanekit)
	if err != nil {
		t.Fatal(err)
	}
	vm := kvAgentVM(t, ctx, 2)
	vmAddr, _, _ := strings.Cut(vm.GetAddress(), "/")
	if vmAddr != netAddr || !strings.EqualFold(vm.GetMac(), kubevirtTestMAC) {
		t.Fatalf("agent's VM endpoint %s mac %s; network-status says %s, the VMI's MAC is %s", vm.GetAddress(), vm.GetMac(), netAddr, kubevirtTestMAC)
	}
	vmIP, err := netip.ParseAddr(vmAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM endpoint %s mac %s on %s, lanekit-vhost pid %d", vm.GetAddress(), vm.GetMac(), KubeNodeName(2), vm.GetBackend().GetPid())

	_, con, err := kubevirtGuestUp(ctx, 2, pod, BindingLanekit, kubevirtTestMAC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })

	client := agnhostPausePod(t, ctx, kc, "kv-client", KubeNodeName(1))
	inPod := func(args ...string) (string, error) {
		return kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", "default", client.Name, "--"}, args...)...)
	}
	// First contact (ARP on both sides) before counting.
	var out string
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(context.Context) (bool, error) {
		out, err = inPod("ping", "-c", "1", "-W", "2", vmAddr)
		return err == nil, nil
	}); err != nil {
		gout, _, _ := con.Run(ctx, "ip addr; ip route; cat /proc/net/dev")
		t.Fatalf("%s (node 1) cannot ping the guest at %s: %s %v\nguest:\n%s", client.Name, vmAddr, out, err, gout)
	}

	podIP, err := netip.ParseAddr(client.Status.PodIP)
	if err != nil {
		t.Fatal(err)
	}
	b := takeKubeVirtPath(t, ctx, podIP, vmIP, vm.GetBackend().GetMetricsSocket())
	const pings = 20
	out, err = inPod("ping", "-c", strconv.Itoa(pings), "-i", "0.2", "-W", "3", vmAddr)
	if err != nil {
		t.Errorf("ping %s from %s: %v\n%s", vmAddr, client.Name, err, out)
	}
	got, err := inPod("curl", "-sS", "-m", "10", "http://"+vmAddr+"/")
	if err != nil || !strings.Contains(got, "lanekit guest") {
		t.Errorf("http://%s/ from %s: %q, %v", vmAddr, client.Name, got, err)
	}
	a := takeKubeVirtPath(t, ctx, podIP, vmIP, vm.GetBackend().GetMetricsSocket())
	m := regexp.MustCompile(`(\d+) received`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ping output: %s", out)
	}
	recv, _ := strconv.ParseUint(m[1], 10, 64)
	t.Logf("%d/%d echoes answered; pod: %d out, %d in; VM endpoint: %d in, %d out; lanekit-vhost: %d frames into the guest, %d out; kernel-forwarded datagrams: node1 %d, node2 %d",
		recv, pings, since(a.pod.FromPackets, b.pod.FromPackets), since(a.pod.ToPackets, b.pod.ToPackets),
		since(a.vm.ToPackets, b.vm.ToPackets), since(a.vm.FromPackets, b.vm.FromPackets),
		since(a.vhRX, b.vhRX), since(a.vhTX, b.vhTX), since(a.fwd[0], b.fwd[0]), since(a.fwd[1], b.fwd[1]))
	if recv < pings*3/4 {
		t.Errorf("%d of %d echoes answered", recv, pings)
	}
	for _, c := range []struct {
		what string
		n    uint64
	}{
		{"the pod's endpoint sent (node 1's BPF)", since(a.pod.FromPackets, b.pod.FromPackets)},
		{"the pod's endpoint received", since(a.pod.ToPackets, b.pod.ToPackets)},
		{"the VM endpoint received (node 2's BPF)", since(a.vm.ToPackets, b.vm.ToPackets)},
		{"the VM endpoint sent", since(a.vm.FromPackets, b.vm.FromPackets)},
		{"lanekit-vhost moved into the guest", since(a.vhRX, b.vhRX)},
		{"lanekit-vhost moved out of the guest", since(a.vhTX, b.vhTX)},
	} {
		if c.n < recv {
			t.Errorf("%s %d packets, fewer than the %d echoes answered", c.what, c.n, recv)
		}
	}
	// Kernel routing would forward every echo and reply on both nodes; the
	// BPF path forwards none (other traffic of the nodes may add a few).
	for i := range a.fwd {
		if n := since(a.fwd[i], b.fwd[i]); n >= recv {
			t.Errorf("node %d's kernel forwarded %d datagrams during %d echoes: the path is the kernel's, not lanekit's", i+1, n, recv)
		}
	}
	t.Run("the lease names the cluster's DNS; the guest resolves a Service by name", func(t *testing.T) {
		kubevirtGuestDNS(t, ctx, kc, con)
	})
	t.Run("ClusterIP Service selecting the VM", func(t *testing.T) {
		kubevirtService(t, ctx, kc, nodeBins, client.Name, vmIP)
	})
	t.Run("NetworkPolicy selecting the VM by kubevirt.io/domain", func(t *testing.T) {
		kubevirtPolicy(t, ctx, kc, nodeBins, client.Name, vmIP)
	})
	t.Run("agent pod restarted: the VM's network comes back", func(t *testing.T) {
		kubevirtAgentRestart(t, ctx, kc, nodeBins, client.Name, vmIP)
	})
	t.Run("live migration by KubeVirt keeps the address", func(t *testing.T) {
		kubevirtMigrate(t, ctx, kc, nodeBins, client.Name, vmIP, 2, 1, "vm1-move")
	})
	t.Run("and back under a MigrationPolicy with maxDowntimeMs 50", func(t *testing.T) {
		kubevirtMigrateTightDowntime(t, ctx, kc, nodeBins, client.Name, vmIP)
	})
	t.Run("VMI deleted: its endpoint and backend are released", func(t *testing.T) {
		kubevirtDeleteVMI(t, ctx, nodeBins, vmIP)
	})
}

// kubevirtGuestDNS: the guest's boot-time DHCP lease (lanekit's datapath,
// the agents' --cluster-dns) wrote the lab's CoreDNS and the search list of
// a ClusterFirst pod in the VMI's namespace into its resolv.conf, and the
// guest resolves the kubernetes Service through it: UDP from the VM to
// CoreDNS's ClusterIP, answered.
func kubevirtGuestDNS(t *testing.T, ctx context.Context, kc kubernetes.Interface, con *guest.Console) {
	svc, err := kc.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc, code, err := con.Run(ctx, "cat /etc/resolv.conf")
	want := []string{"search default.svc." + ClusterDomain + " svc." + ClusterDomain + " " + ClusterDomain, "nameserver " + ClusterDNS}
	if err != nil || code != 0 || !strings.Contains(rc, want[0]+"\n") || !strings.Contains(rc, want[1]+"\n") {
		t.Fatalf("guest resolv.conf (%v, exit %d):\n%s\nwant the lines %q", err, code, rc, want)
	}
	name := "kubernetes.default.svc." + ClusterDomain
	var out string
	ok := false
	for range 10 { // CoreDNS may still be warming up its caches
		out, code, err = con.Run(ctx, "nslookup "+name+" 2>&1")
		if ok = err == nil && code == 0 && strings.Contains(out, svc.Spec.ClusterIP); ok {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if !ok {
		t.Fatalf("the guest's nslookup %s (%v, exit %d):\n%s\nwant %s", name, err, code, out, svc.Spec.ClusterIP)
	}
	t.Logf("guest resolv.conf:\n%sguest resolves %s to %s", rc, name, svc.Spec.ClusterIP)
}

// kubevirtDeleteVMI deletes VMI vm1 (wherever the migration left it) and
// waits for the agent of its node to release what it held: the VM endpoint
// (gone from the agent's list and from the BPF endpoint map) and its
// lanekit-vhost (its metrics socket no longer answers). Neither node's agent
// may still list the VM.
func kubevirtDeleteVMI(t *testing.T, ctx context.Context, nodeBins string, vmIP netip.Addr) {
	out, err := kubectl(ctx, nodeBins, nil, "get", "vmi", "vm1", "-n", "default", "-o", "jsonpath={.status.nodeName}")
	n := 0
	for i := 1; i <= 2; i++ {
		if strings.TrimSpace(out) == KubeNodeName(i) {
			n = i
		}
	}
	if err != nil || n == 0 {
		t.Fatalf("VMI vm1's node %q: %v", out, err)
	}
	vm := kvAgentVM(t, ctx, n)
	root, err := nodeRoot(n)
	if err != nil {
		t.Fatal(err)
	}
	metrics := filepath.Join(root, vm.GetBackend().GetMetricsSocket())
	if _, _, err := bench.BackendPackets(ctx, metrics); err != nil {
		t.Fatalf("the VM's backend does not answer before the delete: %v", err)
	}
	start := time.Now()
	if _, err := kubectl(ctx, nodeBins, nil, "delete", "vmi", "vm1", "-n", "default", "--wait=true", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Since(start)
	var left []string
	// Each look on the test's context (each agent call has its own
	// deadline), not the poll's: its end must not replace what was left
	// with its own deadline error.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		left = nil
		for i := 1; i <= 2; i++ {
			sock, err := RealNodeAgentSocket(i)
			if err != nil {
				return false, err
			}
			if vm, err := findAgentVM(ctx, sock, k8s.VMName("default", "vm1")); err == nil || !strings.Contains(err.Error(), "has no vm") {
				left = append(left, fmt.Sprintf("node %d's agent lists the VM (%v): %v", i, err, vm))
			}
		}
		if _, _, err := datapath.PinnedCounters(filepath.Join(root, "sys/fs/bpf/lanekit"), vmIP); err == nil {
			left = append(left, fmt.Sprintf("node %d's endpoint map has %s", n, vmIP))
		}
		if _, _, err := bench.BackendPackets(ctx, metrics); err == nil {
			left = append(left, "the VM's lanekit-vhost still answers on "+metrics)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("%.0f s after VMI vm1 was deleted (%.1f s for KubeVirt): %s", time.Since(start).Seconds(), deleted.Seconds(), strings.Join(left, "; "))
	}
	t.Logf("VMI vm1 deleted on %s in %.1f s; the agent released its endpoint and backend %.1f s after the delete began",
		KubeNodeName(n), deleted.Seconds(), time.Since(start).Seconds())
}

// kubevirtBench runs `lanekit lab bench` on the KubeVirt lab (--vm-backend
// off; 1 repetition of 3 s): the VMIs of lanekit's binding, KubeVirt's
// masquerade and KubeVirt's bridge (on a kernel without dummy links with
// the lab's virt-handler patch, which the row's label must name) boot,
// their guests take their addresses and every
// measurement of their rows succeeds, with the figures logged; no VMI is
// left after the run.
func kubevirtBench(t *testing.T, ctx context.Context, bins Bins) {
	cli := CLIForTests(t)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, cli, "lab", "bench", "--json", "--repeat", "1", "--duration", "3s", "--vm-backend", "off")
	cmd.Env = append(os.Environ(), "LANEKIT_BIN="+bins.Dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("lab bench: %s", tail(stderr.String(), 4000))
	var rep bench.Report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("lab bench: %v; its JSON: %v: %s", err, jerr, tail(stdout.String(), 2000))
	}
	rows := map[string]bench.Row{}
	for _, r := range rep.Rows {
		rows[r.Path] = r
	}
	// The bridge row runs on this kernel too (the lab's virt-handler holds
	// the pod's address on an empty bridge): its label must say so.
	want := []string{KubeVirtBenchLanekit, KubeVirtBenchMasquerade, KubeVirtBenchBridge}
	if why := noDummyLinks(ctx); why != "" {
		if r, ok := rows[KubeVirtBenchBridge]; ok && !strings.Contains(r.Includes.Detail, EmptyBridgeHolder) {
			t.Errorf("%s: %s, and the %s row's label does not say what holds the pod's address: %q", KubeVirtBenchBridge, why, KubeVirtBenchBridge, r.Includes.Detail)
		}
	}
	for _, name := range want {
		r, ok := rows[name]
		if !ok {
			t.Errorf("lab bench has no %s row (%v)", name, err)
			continue
		}
		rev, cpu := "-", "-"
		if r.TCPRevGbps != nil {
			rev = fmt.Sprintf("%.2f", r.TCPRevGbps.Median)
		}
		if h := r.HostCPU; h != nil {
			cpu = fmt.Sprintf("%.1f / %.1f ns/byte, %.0f µs/transaction (%d parts), guest NIC interrupts %.1f / %.1f per MB, %.2f per transaction",
				h.NsPerByte.Median, h.NsPerByteRev.Median, h.UsPerTxn.Median, len(h.Parts), h.IRQPerMB.Median, h.IRQPerMBRev.Median, h.IRQPerTxn.Median)
			// Read in the guest (MSI-X vectors under libvirt): counted in every run.
			if h.IRQPerMB.Median <= 0 || h.IRQPerMBRev.Median <= 0 || h.IRQPerTxn.Median <= 0 {
				t.Errorf("%s: the guest NIC's interrupts were not counted: %+v", name, h)
			}
		}
		t.Logf("%s: TCP %.2f Gbit/s (from the guest %s), RR p50 %.0f µs, %.0f conn/s, host CPU %s; offloads %s; %s", name, r.TCPGbps.Median,
			rev, r.RRP50us, r.CPS, cpu, r.GuestOffloads, r.Note)
		if !strings.Contains(r.Includes.Detail, KubeVirtClientNoBIGTCP) {
			t.Errorf("%s: the label does not say the client sends no BIG TCP: %q", name, r.Includes.Detail)
		}
		// Every row says what its guest negotiated, read in the guest; on
		// lanekit's binding that is lanekit-vhost's offer (TSO both ways).
		if r.GuestOffloads == "" || strings.HasPrefix(r.GuestOffloads, "unknown") {
			t.Errorf("%s: virtio offloads negotiated: %q", name, r.GuestOffloads)
		}
		if o := strings.Fields(r.GuestOffloads); name == KubeVirtBenchLanekit && (!slices.Contains(o, "guest_tso4") || !slices.Contains(o, "host_tso4")) {
			t.Errorf("%s: the guest negotiated %q, without lanekit-vhost's TSO", name, r.GuestOffloads)
		}
		// The host CPU breakdown found the row's processes on this machine.
		wantParts := []string{"qemu without vCPUs"}
		if name == KubeVirtBenchLanekit {
			wantParts = append(wantParts, "lanekit-vhost")
		}
		var parts []bench.HostCPUPart
		if r.HostCPU != nil {
			parts = r.HostCPU.Parts
		}
		for _, w := range wantParts {
			found := false
			for _, p := range parts {
				found = found || p.Name == w
			}
			if !found {
				t.Errorf("%s: no host CPU part %q (%+v)", name, w, r.HostCPU)
			}
		}
		if len(r.Errors) > 0 || r.TCPGbps.Median <= 0 || r.RRP50us <= 0 || r.CPS <= 0 {
			t.Errorf("%s: errors %v, TCP %.2f Gbit/s, RR p50 %.0f µs, %.0f conn/s", name, r.Errors, r.TCPGbps.Median, r.RRP50us, r.CPS)
		}
	}
	if err != nil {
		t.Errorf("lab bench: %v", err)
	}
	if out, _ := kubectlOut(ctx, "get", "vmi", "-n", "default", "-o", "name"); strings.Contains(out, "kv-bench") {
		t.Errorf("lab bench left its VMIs: %s", out)
	}
}

// kubevirtPolicy applies a NetworkPolicy that selects the VMI's launcher
// pod by the kubevirt.io/domain label (the VMI's, copied to the pod) and admits TCP 80 from pods
// labelled kv-role=allowed only: the guest (the VM endpoint takes the
// launcher pod's labels) must then refuse the client on node 1 — HTTP and
// ping, each refusal a policy-ingress drop at the VM endpoint on node 2 —
// until the client carries the label, when HTTP passes and ping stays
// refused.
func kubevirtPolicy(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins, client string, vmIP netip.Addr) {
	const policy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: kv-vm1-web
  namespace: default
spec:
  podSelector:
    matchLabels:
      kubevirt.io/domain: vm1
  policyTypes: [Ingress]
  ingress:
    - from:
        - podSelector:
            matchLabels:
              kv-role: allowed
      ports:
        - protocol: TCP
          port: 80
`
	if _, err := kubectl(ctx, nodeBins, []byte(policy), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kubectl(context.Background(), nodeBins, nil, "delete", "networkpolicy", "kv-vm1-web", "-n", "default", "--ignore-not-found") //nolint:errcheck
	})
	drops := func() uint64 { return kvEndpointCounters(t, 2, vmIP).Drops[datapath.DropPolicyIngress] }
	inPod := func(args ...string) error {
		_, err := kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", "default", client, "--"}, args...)...)
		return err
	}
	curl := func() error { return inPod("curl", "-sS", "-m", "3", "-o", "/dev/null", "http://"+vmIP.String()+"/") }
	ping := func() error { return inPod("ping", "-c", "1", "-W", "2", vmIP.String()) }
	before := drops()
	// The agents program the policy within a moment; until then the
	// guest still answers.
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		return curl() != nil, nil
	}); err != nil {
		t.Fatalf("the guest still answers HTTP from %s (no kv-role label) 30 s after the policy", client)
	}
	if ping() == nil {
		t.Errorf("the guest answers ping from %s under the policy", client)
	}
	if d := drops() - before; d < 2 {
		t.Errorf("VM endpoint counted %d policy-ingress drops, want at least 2 (the refused SYN and echo)", d)
	} else {
		t.Logf("refused: HTTP and ping from %s, %d policy-ingress drops at the VM endpoint", client, d)
	}
	if _, err := kubectl(ctx, nodeBins, nil, "label", "pod", client, "-n", "default", "kv-role=allowed", "--overwrite"); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		return curl() == nil, nil
	}); err != nil {
		t.Fatalf("the guest refuses HTTP from %s 30 s after it got kv-role=allowed", client)
	}
	if ping() == nil {
		t.Errorf("the guest answers ping from the labelled %s: the policy admits TCP 80 only", client)
	}
}

// takeKubeVirtPath reads a kvPathSample: the agents' pins and the backend's
// metrics socket are in the nodes' own bpffs and /run.
func takeKubeVirtPath(t *testing.T, ctx context.Context, podIP, vmIP netip.Addr, metricsSocket string) kvPathSample {
	t.Helper()
	var s kvPathSample
	roots := [2]string{}
	for i := range roots {
		r, err := nodeRoot(i + 1)
		if err != nil {
			t.Fatal(err)
		}
		roots[i] = r
		if s.fwd[i], err = IPForwDatagrams(ctx, NodeNS(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if _, s.pod, err = datapath.PinnedCounters(filepath.Join(roots[0], "sys/fs/bpf/lanekit"), podIP); err != nil {
		t.Fatal(err)
	}
	if _, s.vm, err = datapath.PinnedCounters(filepath.Join(roots[1], "sys/fs/bpf/lanekit"), vmIP); err != nil {
		t.Fatal(err)
	}
	if s.vhRX, s.vhTX, err = bench.BackendPackets(ctx, filepath.Join(roots[1], metricsSocket)); err != nil {
		t.Fatal(err)
	}
	return s
}

// kvEndpointCounters are the datapath counters of the endpoint with address
// ip on lab node n (its pinned BPF maps).
func kvEndpointCounters(t *testing.T, n int, ip netip.Addr) datapath.Counters {
	t.Helper()
	root, err := nodeRoot(n)
	if err != nil {
		t.Fatal(err)
	}
	_, c, err := datapath.PinnedCounters(filepath.Join(root, "sys/fs/bpf/lanekit"), ip)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubevirtConnectivity runs `lanekit connectivity test --vm` against the
// KubeVirt lab as a user would, with --vm-spec naming the lab's kernel-boot
// guest on lanekit's binding (the default containerDisk image is not
// reachable here): every check must pass, the VM's among them — a VMI in the
// check's own namespace, its address read from its launcher's
// network-status, the guest configured by nothing but its DHCP lease
// (lk.ip=dhcp), reached from the check's client pod.
func kubevirtConnectivity(t *testing.T, ctx context.Context, bins Bins) {
	spec := strings.Replace(KubeVirtVMI("conncheck", KubeNodeName(1), BindingLanekit, ""),
		"networkName: "+VMNetwork, "networkName: "+PodNamespace+"/"+VMNetwork, 1)
	f := writeTemp(t, "vmi.yaml", spec)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "nsenter", "--net="+netnsPath(WireNS), "--", filepath.Join(bins.Dir, "lanekit"),
		"connectivity", "test", "--kubeconfig", Kubeconfig, "--timeout", "90s", "--vm", "--vm-spec", f)
	b, err := cmd.CombinedOutput()
	t.Logf("lanekit connectivity test --vm:\n%s", b)
	if err != nil {
		t.Fatalf("connectivity test --vm: %v", err)
	}
	for _, want := range []string{`vm: pod-to-VMI \(lanekit binding\)\s+pass`, `pod-to-pod \(across nodes\)\s+pass`, ` 0 failed`} {
		if !regexp.MustCompile(want).Match(b) {
			t.Errorf("summary lacks %q", want)
		}
	}
}
