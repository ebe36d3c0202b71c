package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
)

// requireNodeBins skips t unless the real-node binaries are built
// (make k8s-node-bins, opt-in); with LANEKIT_K8S_NODE_REQUIRED set a
// missing one fails.
func requireNodeBins(t *testing.T) string {
	t.Helper()
	d, err := CheckNodeBins()
	if err != nil {
		if os.Getenv(EnvNodeRequired) != "" {
			t.Fatalf("%v (%s is set)", err, EnvNodeRequired)
		}
		t.Skipf("skipping: real-node binaries not built (opt-in: make k8s-lab-bins, about ten minutes the first time; "+
			"the test then runs in make test, about 2 minutes): %v", err)
	}
	return d
}

// TestNodeBinDirMatchesScript: the lab finds the node binaries where
// scripts/k8s-node-bins.sh puts them.
func TestNodeBinDirMatchesScript(t *testing.T) {
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts", "k8s-node-bins.sh"), "dir").Output()
	if err != nil {
		t.Fatalf("k8s-node-bins.sh dir: %v", err)
	}
	if got, want := NodeBinDir(), strings.TrimSpace(string(out)); got != want {
		t.Errorf("NodeBinDir() = %s, scripts/k8s-node-bins.sh dir = %s", got, want)
	}
}

// TestKubeletConfigFencesTheMachine checks what a real node's
// configuration promises the machine: cgroupfs under the lab's cgroup,
// cgroup v1 allowed, kubelet's own resolv.conf, CoreDNS without forward.
func TestKubeletConfigFencesTheMachine(t *testing.T) {
	cfg := kubeletConfig(1, "/a/lanekit-lab/lk-node1")
	for _, want := range []string{`cgroupDriver: cgroupfs`, `failCgroupV1: false`, `cgroupRoot: "/a/lanekit-lab/lk-node1"`,
		`resolvConf: "` + nodeMount + `/etc/resolv.conf"`, `protectKernelDefaults: false`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("kubelet config lacks %q:\n%s", want, cfg)
		}
	}
	if regexp.MustCompile(`(?m)^\s*(forward|proxy)\b`).Match(corednsManifest) {
		t.Error("CoreDNS's Corefile forwards outside the cluster")
	}
	ctd := containerdConfig("/bins")
	for _, want := range []string{`BinaryName = "/bins/runc"`, `SystemdCgroup = false`, `"io.containerd.internal.v1.opt"`, `restrict_oom_score_adj = true`} {
		if !strings.Contains(ctd, want) {
			t.Errorf("containerd config lacks %q", want)
		}
	}
	if root, err := KubeletCgroupRoot(2); err != nil || !strings.HasSuffix(root, "/lanekit-lab/lk-node2") {
		t.Errorf("KubeletCgroupRoot(2) = %q, %v", root, err)
	}
}

// TestLabRealNodes brings up the real-node lab dual-stack (containerd +
// kubelet per node, kube-controller-manager with a cluster CIDR per family,
// no kube-proxy), lanekit installed as docs/install.md tells a newcomer to,
// with its own `bin/helm install` line (InstallHelm), and checks what an
// operator would:
//   - the install: the Helm release's DaemonSet, the docs' check step
//     (`lanekit status --wait` in an agent) and proof step (`lanekit
//     connectivity test` as on any cluster, every check passing);
//   - the DaemonSet's agents Running and Ready on both nodes without
//     restarts, and no kube-proxy rule on any node;
//   - each Node with a pod CIDR and InternalIP of each family; pods the
//     scheduler spreads over both nodes with an address of each family from
//     their node's ranges;
//   - IPv4: the pods reach each other, a ClusterIP Service by address and
//     by name (CoreDNS) answers from both, hostPort on each node's address
//     (lanekit's BPF, no portmap), both agents program the ClusterIP with
//     the two pods as backends (no kube-proxy rule exists);
//   - IPv6: pod to pod both ways with no datagram forwarded by the nodes'
//     kernels (Ip6OutForwDatagrams: the BPF path), the RequireDualStack
//     Service's IPv6 ClusterIP and its name over IPv6 (AAAA) from a client
//     pod, both agents program the IPv6 ClusterIP with the pods' IPv6
//     addresses (the endpointslice controller's IPv6 slice);
//   - reinstalled with kustomize: `helm uninstall` then `kubectl apply -k`
//     of the lab's overlay over deploy/ (InstallKustomize): the new agents
//     Ready on both nodes and the Service served again;
//   - the machine's kernel tunables unchanged, and nothing left after lab
//     down (processes, namespaces, cgroups, directories, mounts).
//
// One lab-up for all of it (the real-node lab takes minutes to come up).
// The kustomize install carries deploy/lb with a pool of both families
// (testLBPool): a dual-stack LoadBalancer Service gets an address of each
// range, announced by ARP and NDP, and both answer a client on the underlay
// from both pods, with the client's own address kept under
// externalTrafficPolicy Local.
func TestLabRealNodes(t *testing.T) {
	bins, nodeBins := realNodeTestBins(t)
	before, err := ReadKernelTunables()
	if err != nil {
		t.Fatal(err)
	}
	machineDirs := []string{"/var/lib/kubelet", "/var/lib/lanekit", "/etc/cni", "/opt/cni", "/var/log/containers", "/var/lib/containerd", "/opt/containerd"}
	existed := map[string]bool{}
	for _, d := range machineDirs {
		_, err := os.Stat(d)
		existed[d] = err == nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	srv, kc, down := upRealNodeLab(t, ctx, bins,
		Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, IPFamily: IPFamilyDual, Install: InstallHelm})

	t.Run("installed by the documented helm install", func(t *testing.T) { checkDocsInstall(t, ctx, kc, bins, nodeBins) })
	checkAgents := func(t *testing.T, when string) {
		t.Helper()
		pods, err := kc.CoreV1().Pods(LanekitNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lanekit-agent"})
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				t.Errorf("%s: agent %s on %s is terminating", when, p.Name, p.Spec.NodeName)
			}
			nodes = append(nodes, p.Spec.NodeName)
			if p.Status.Phase != corev1.PodRunning || !podReady(&p) {
				t.Errorf("%s: agent %s on %s: %s, ready %t", when, p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p))
			}
			for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				if cs.RestartCount != 0 {
					t.Errorf("%s: agent %s container %s restarted %d times", when, p.Name, cs.Name, cs.RestartCount)
				}
			}
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, []string{KubeNodeName(1), KubeNodeName(2)}) {
			t.Errorf("%s: agents on %v, want one on each node", when, nodes)
		}
	}
	t.Run("agents ready, no kube-proxy", func(t *testing.T) {
		checkAgents(t, "after lab up")
		for i := 1; i <= 2; i++ {
			out, err := nsCommand(ctx, NodeNS(i), "iptables-save").Output()
			if err != nil {
				t.Fatalf("iptables-save on %s: %v", NodeNS(i), err)
			}
			if strings.Contains(string(out), "KUBE-SVC") || strings.Contains(string(out), "KUBE-SERVICES") {
				t.Errorf("%s has kube-proxy rules:\n%s", NodeNS(i), out)
			}
		}
	})
	podCIDR6 := checkDualStackNodes(t, ctx, kc)

	// Pods the scheduler places, one per node, a client pod no Service
	// selects, and a ClusterIP Service of both families.
	web := webDeployment()
	if _, err := kc.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: web.Spec.Selector.MatchLabels,
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Ports:          []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("service clusterIPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	if err := waitDeployment(ctx, kc, "default", "web"); err != nil {
		t.Fatal(err)
	}
	pods := webPods(t, ctx, kc)
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Fatalf("the scheduler put both pods on %s", pods[0].Spec.NodeName)
	}
	client := clientPod(t, ctx, kc)
	inPod := func(p corev1.Pod, args ...string) (string, error) {
		return kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", p.Namespace, p.Name, "--"}, args...)...)
	}
	// serves reports whether each target answers from both pods (from).
	serves := func(t *testing.T, from corev1.Pod, targets []string, curl ...string) {
		t.Helper()
		for _, target := range targets {
			seen := map[string]bool{}
			for try := 0; try < 30 && len(seen) < 2; try++ {
				got, err := inPod(from, append(append([]string{"curl", "-sS", "-m", "5"}, curl...), "http://"+target+"/hostname")...)
				if err != nil {
					t.Errorf("%s -> %s: %v", from.Name, target, err)
					break
				}
				seen[strings.TrimSpace(got)] = true
			}
			if !seen[pods[0].Name] || !seen[pods[1].Name] || len(seen) != 2 {
				t.Errorf("service %s from %s: answers from %v, want both pods", target, from.Name, seen)
			}
		}
	}
	programmed := func(t *testing.T, clusterIP string, want []string) {
		t.Helper()
		want = slices.Sorted(slices.Values(want))
		for i := 1; i <= 2; i++ {
			fe := serviceFrontend(t, i, clusterIP)
			if fe == nil {
				t.Errorf("agent on %s has no frontend %s port 80", NodeNS(i), clusterIP)
				continue
			}
			var backends []string
			for _, b := range fe.GetBackends() {
				backends = append(backends, b.GetAddress())
			}
			slices.Sort(backends)
			if !slices.Equal(backends, want) {
				t.Errorf("agent on %s: %s backends %v, want %v", NodeNS(i), clusterIP, backends, want)
			}
		}
	}

	t.Run("IPv4", func(t *testing.T) {
		// Pod to pod across the nodes, both ways.
		for k, p := range pods {
			peer := pods[1-k]
			got, err := inPod(p, "curl", "-sS", "-m", "5", fmt.Sprintf("http://%s:8080/hostname", peer.Status.PodIP))
			if err != nil || strings.TrimSpace(got) != peer.Name {
				t.Errorf("%s (%s) -> %s (%s): %q, %v", p.Name, p.Spec.NodeName, peer.Name, peer.Status.PodIP, got, err)
			}
		}
		// The Service by ClusterIP and by name, from a backend (hairpin) too.
		serves(t, pods[0], []string{svc.Spec.ClusterIPs[0], "web.default.svc." + ClusterDomain})
		// hostPort: each node's address answers with that node's pod, from a
		// pod on the same node (from_pod) and from the other node's pod (the
		// uplink).
		for _, p := range pods {
			for _, peer := range pods {
				url := fmt.Sprintf("http://%s:%d/hostname", peer.Status.HostIP, webHostPort)
				got, err := inPod(p, "curl", "-sS", "-m", "5", url)
				if err != nil || strings.TrimSpace(got) != peer.Name {
					t.Errorf("hostPort: %s (%s) -> %s: %q, %v; want %s", p.Name, p.Spec.NodeName, url, got, err, peer.Name)
				}
			}
		}
		// lanekit serves it: each agent programmed the ClusterIP with the two
		// pods as backends (the agents' sockets are in the nodes' /run).
		programmed(t, svc.Spec.ClusterIPs[0], []string{pods[0].Status.PodIP, pods[1].Status.PodIP})
	})
	t.Run("IPv6", func(t *testing.T) {
		ip6 := podIPv6s(t, pods, podCIDR6)
		fwd := func() uint64 {
			var sum uint64
			for i := 1; i <= 2; i++ {
				v, err := IP6OutForwDatagrams(ctx, NodeNS(i))
				if err != nil {
					t.Fatal(err)
				}
				sum += v
			}
			return sum
		}
		// Pod to pod over IPv6, both ways, on the BPF path.
		fwdBefore := fwd()
		for k, p := range pods {
			peer := pods[1-k]
			url := "http://" + net.JoinHostPort(ip6[peer.Name], "8080") + "/hostname"
			got, err := inPod(p, "curl", "-sS", "-m", "5", url)
			if err != nil || strings.TrimSpace(got) != peer.Name {
				t.Errorf("%s (%s) -> %s: %q, %v", p.Name, p.Spec.NodeName, url, got, err)
			}
		}
		if d := fwd() - fwdBefore; d != 0 {
			t.Errorf("the nodes' kernels forwarded %d IPv6 datagrams of pod-to-pod traffic, want 0 (lanekit's BPF carries it)", d)
		}
		// The IPv6 ClusterIP and the name over IPv6 (AAAA), from a pod that
		// is not a backend (a pod reaching itself through an IPv6 ClusterIP,
		// hairpin, is not implemented yet).
		serves(t, client, []string{"[" + svc.Spec.ClusterIPs[1] + "]"})
		serves(t, client, []string{"web.default.svc." + ClusterDomain}, "-6")
		programmed(t, svc.Spec.ClusterIPs[1], []string{ip6[pods[0].Name], ip6[pods[1].Name]})
	})
	checkAgents(t, "after the traffic")

	t.Run("reinstalled with kustomize", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(WireNS), "--", filepath.Join(filepath.Dir(bins.DeployDir()), "bin", "helm"),
			"uninstall", "lanekit", "-n", LanekitNamespace, "--wait", "--kubeconfig", Kubeconfig).CombinedOutput()
		if err != nil {
			t.Fatalf("helm uninstall: %v: %s", err, out)
		}
		// With deploy/lb and a pool on the underlay (lab up --lb-pool).
		if err := installLanekit(ctx, nodeBins, bins.DeployDir(), srv, testLBPool, RoutingNative); err != nil {
			t.Fatal(err)
		}
		if err := waitDaemonSet(ctx, kc, LanekitNamespace, "lanekit-agent", 2); err != nil {
			t.Fatal(err)
		}
		ds, err := kc.AppsV1().DaemonSets(LanekitNamespace).Get(ctx, "lanekit-agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Labels["app.kubernetes.io/managed-by"] == "Helm" {
			t.Fatalf("DaemonSet still Helm's after the kustomize install: %v", ds.Labels)
		}
		checkAgents(t, "after the kustomize install")
		serves(t, client, []string{svc.Spec.ClusterIPs[0]})
		programmed(t, svc.Spec.ClusterIPs[0], []string{pods[0].Status.PodIP, pods[1].Status.PodIP})

		// A dual-stack LoadBalancer Service: an address of each family from
		// the pool (LB IPAM), answered by ARP / NDP from an elected node (L2
		// announcement) and load-balanced to both pods, for a client on the
		// underlay outside the cluster.
		lb, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web-lb"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: web.Spec.Selector.MatchLabels,
				IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
				Ports:          []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var lbIPs []netip.Addr
		for deadline := time.Now().Add(30 * time.Second); len(lbIPs) < 2 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			got, err := kc.CoreV1().Services("default").Get(ctx, lb.Name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			lbIPs = lbIPs[:0]
			for _, in := range got.Status.LoadBalancer.Ingress {
				if a, err := netip.ParseAddr(in.IP); err == nil {
					lbIPs = append(lbIPs, a)
				}
			}
		}
		ranges, err := lbPoolRanges(testLBPool)
		if err != nil {
			t.Fatal(err)
		}
		if len(lbIPs) != 2 || !ranges[0].Contains(lbIPs[0]) || !ranges[1].Contains(lbIPs[1]) {
			t.Fatalf("LoadBalancer ingress %v, want an address of each range of the pool %s (IPv4 first)", lbIPs, testLBPool)
		}
		fromWire := func(path string, lbIP netip.Addr) (string, error) {
			out, err := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(WireNS), "--", "curl", "-sS", "-m", "3",
				"http://"+netip.AddrPortFrom(lbIP, 80).String()+path).Output()
			return strings.TrimSpace(string(out)), err
		}
		for _, lbIP := range lbIPs {
			seen := map[string]bool{}
			for try := 0; try < 30 && len(seen) < 2; try++ {
				out, err := fromWire("/hostname", lbIP)
				if err != nil {
					time.Sleep(300 * time.Millisecond)
					continue
				}
				seen[out] = true
			}
			if !seen[pods[0].Name] || !seen[pods[1].Name] {
				t.Errorf("LoadBalancer %s from the underlay: answers from %v, want both pods", lbIP, seen)
			}
		}
		// externalTrafficPolicy Local: the pod sees the client's own
		// address, from outside the nodes' subnet (ExternalClientIP, 6).
		if _, err := kc.CoreV1().Services("default").Patch(ctx, lb.Name, types.MergePatchType,
			[]byte(`{"spec":{"externalTrafficPolicy":"Local"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		for k, want := range []string{ExternalClientIP, ExternalClientIP6} {
			var client netip.AddrPort
			for try := 0; try < 30 && client.Addr().String() != want; try++ {
				time.Sleep(300 * time.Millisecond)
				if out, err := fromWire("/clientip", lbIPs[k]); err == nil {
					client, _ = netip.ParseAddrPort(out)
				}
			}
			if client.Addr().String() != want {
				t.Errorf("LoadBalancer %s with externalTrafficPolicy Local: the pod saw client %v, want %s (source preserved)", lbIPs[k], client, want)
			}
		}
	})

	after, err := ReadKernelTunables()
	if err != nil {
		t.Fatal(err)
	}
	if !mapsEqual(before, after) {
		t.Errorf("the machine's kernel tunables changed while the lab was up: before %v, after %v", before, after)
	}

	r := down()
	after, err = ReadKernelTunables()
	if err != nil {
		t.Fatal(err)
	}
	if !mapsEqual(before, after) {
		t.Errorf("the machine's kernel tunables changed after lab down: before %v, after %v", before, after)
	}
	// Nothing left: processes, namespaces, cgroups, mount points, mounts.
	if left := listLabNetns(); len(left) > 0 {
		t.Errorf("netns left after down: %v", left)
	}
	for _, name := range []string{"kubelet", "containerd", "containerd-shim", "kube-controller", "kube-scheduler"} {
		if pids := nodeBinPids(name); len(pids) > 0 {
			t.Errorf("%s still running after down: %v", name, pids)
		}
	}
	if len(r.Cgroups) == 0 {
		t.Error("lab up recorded no cgroups (realnodes.json)")
	}
	for _, d := range r.Cgroups {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup left after down: %s", d)
		}
	}
	for _, d := range machineDirs {
		if _, err := os.Stat(d); (err == nil) != existed[d] {
			t.Errorf("%s: existed before lab up %t, exists after down %t", d, existed[d], err == nil)
		}
	}
	if _, err := os.Stat(RunDir); err == nil {
		t.Errorf("%s left after down", RunDir)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), "lanekit-node") {
		t.Errorf("node mounts visible on the machine:\n%s", mi)
	}
}

// upRealNodeLab brings up the real-node lab cfg for t (Bins and Out set here)
// and returns its API server and client and down: down takes the lab down
// once (t's cleanup calls it too), first logging each node's init, kubelet and
// containerd logs when t failed, and returns what realnodes.json recorded.
func upRealNodeLab(t *testing.T, ctx context.Context, bins Bins, cfg Config) (*k8stest.Server, kubernetes.Interface, func() realNodes) {
	t.Helper()
	var upLog bytes.Buffer
	cfg.Bins, cfg.Out = bins, &upLog
	_, upErr := Up(ctx, cfg)
	var r realNodes
	done := false
	down := func() realNodes {
		if done {
			return r
		}
		done = true
		if t.Failed() {
			for i := 1; i <= cfg.Nodes; i++ {
				t.Logf("node %d init: %s", i, logTail(filepath.Join(NodeDir(i), "node.log")))
				t.Logf("node %d kubelet: %s", i, logTail(NodeLog(i, "kubelet")))
				t.Logf("node %d containerd: %s", i, logTail(NodeLog(i, "containerd")))
			}
		}
		if data, err := os.ReadFile(realNodesFile()); err == nil {
			_ = json.Unmarshal(data, &r)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := Down(dctx, DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
		return r
	}
	t.Cleanup(func() { down() })
	if upErr != nil {
		t.Fatalf("lab up: %v\n%s", upErr, upLog.String())
	}
	t.Logf("lab up:\n%s", upLog.String())
	srv, kc, err := K8s()
	if err != nil {
		t.Fatal(err)
	}
	return srv, kc, down
}

// realNodeTestBins skips t unless it can bring up the real-node lab (root,
// the API server and node binaries), and writes this tree's image archives
// where lab up finds them; it returns the lab binaries and the node
// binaries' directory.
func realNodeTestBins(t *testing.T) (Bins, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network, mount and PID namespaces, cgroups")
	}
	lockLab()
	k8stest.RequireBins(t)
	nodeBins := requireNodeBins(t)
	testutil.RequireTools(t, "ip", "nsenter", "iptables-save")
	bins := requireLabBins(t, "network namespaces")
	root := repoRoot(t)
	bins.Self = CLIForTests(t)
	// The archives of this tree's agent (and pause, agnhost, CoreDNS),
	// where lab up finds them (make k8s-node-images writes the same).
	imgs := exec.Command("go", "run", "./internal/tools/lkimages", "-out", bins.ImagesDir(), "-bin", bins.Dir, "-node-bins", nodeBins)
	imgs.Args = append(imgs.Args, NodeImages...) // what the test needs; ExtraNodeImages are for `make conformance`
	imgs.Dir = root
	if out, err := imgs.CombinedOutput(); err != nil {
		t.Fatalf("lkimages: %v\n%s", err, out)
	}
	return bins, nodeBins
}

// testLBPool is TestLabRealNodes' LoadBalancer pool, on the underlay: an
// IPv4 and an IPv6 range.
const testLBPool = LabLBPool + "," + LabLBPool6

// webHostPort is the web pods' hostPort (served by lanekit's BPF, no portmap).
const webHostPort = 8090

func webDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// One per node, placed by kube-scheduler.
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname",
						WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
					Containers: []corev1.Container{{Name: "agnhost", Image: "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
						Args:  []string{"netexec", "--http-port=8080"},
						Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: webHostPort}}}},
				},
			},
		},
	}
}

// webNodePort creates the web Deployment (a pod on each node) and a
// NodePort Service "web" of it (port 80 to 8080), waits for the pods and
// returns the Service and the pods, the one on node 1 first.
func webNodePort(t *testing.T, ctx context.Context, kc kubernetes.Interface) (*corev1.Service, []corev1.Pod) {
	t.Helper()
	web := webDeployment()
	if _, err := kc.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: web.Spec.Selector.MatchLabels,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitDeployment(ctx, kc, "default", "web"); err != nil {
		t.Fatal(err)
	}
	pods := webPods(t, ctx, kc)
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Fatalf("the scheduler put both pods on %s", pods[0].Spec.NodeName)
	}
	if pods[0].Spec.NodeName != KubeNodeName(1) {
		pods[0], pods[1] = pods[1], pods[0]
	}
	return svc, pods
}

func webPods(t *testing.T, ctx context.Context, kc kubernetes.Interface) []corev1.Pod {
	t.Helper()
	pods, err := kc.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	if len(out) != 2 {
		t.Fatalf("want 2 running web pods, have %d", len(out))
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// serviceFrontend returns node i's agent's frontend for addr:80.
func serviceFrontend(t *testing.T, i int, addr string) *apiv1.ServiceFrontend {
	t.Helper()
	sock, err := RealNodeAgentSocket(i)
	if err != nil {
		t.Fatal(err)
	}
	c, closeFn, err := agentClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ListServices(ctx, &apiv1.ListServicesRequest{})
	if err != nil {
		t.Fatalf("list services on %s: %v", NodeNS(i), err)
	}
	for _, fe := range resp.GetFrontends() {
		if fe.GetAddress() == addr && fe.GetPort() == 80 {
			return fe
		}
	}
	return nil
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// nodeBinPids lists the processes named comm whose executable is one of
// the node binaries (another containerd or kubelet is not the lab's).
func nodeBinPids(comm string) []string {
	out, _ := exec.Command("pgrep", "-x", comm).Output()
	var pids []string
	for _, p := range strings.Fields(string(out)) {
		exe, err := os.Readlink("/proc/" + p + "/exe")
		if err == nil && strings.HasPrefix(exe, NodeBinDir()) {
			pids = append(pids, p)
		}
	}
	return pids
}
