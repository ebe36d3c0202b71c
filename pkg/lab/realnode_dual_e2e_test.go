package lab

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestLabRealNodesDualStack brings up the real-node lab dual-stack (`lab up
// --k8s --kubelet --ip-family dual`: kube-controller-manager with a cluster
// CIDR and the API server with a Service range per family, kubelet's
// --node-ip of both families) and checks: each Node has an IPv4 and an IPv6
// pod CIDR and InternalIP; the scheduler's pods (one per node) get an
// address of each family in status.podIPs from their node's ranges; they
// reach each other over IPv6 both ways without the nodes' kernels
// forwarding a datagram (Ip6OutForwDatagrams: the BPF path); a
// RequireDualStack Service's two ClusterIPs and its DNS name over IPv6
// (CoreDNS's AAAA) answer from both pods; both agents program the IPv6
// ClusterIP with the pods' IPv6 addresses as backends (the endpointslice
// controller's IPv6 slice); the machine's tunables are unchanged.
// TestLabRealNodes covers the rest of the lab's contract (agents, no
// kube-proxy, hostPort, nothing left after down).
func TestLabRealNodesDualStack(t *testing.T) {
	bins, nodeBins := realNodeTestBins(t)
	before, err := ReadKernelTunables()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var upLog bytes.Buffer
	// Installed as docs/install.md tells a newcomer to, with Helm (TestLabRealNodes
	// installs with kustomize): the page's own command, read from it.
	_, upErr := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, IPFamily: IPFamilyDual, Install: InstallHelm,
		Bins: bins, Out: &upLog})
	t.Cleanup(func() {
		if t.Failed() {
			for i := 1; i <= 2; i++ {
				t.Logf("node %d kubelet: %s", i, logTail(NodeLog(i, "kubelet")))
			}
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := Down(dctx, DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left := listLabNetns(); len(left) > 0 {
			t.Errorf("netns left after down: %v", left)
		}
	})
	if upErr != nil {
		t.Fatalf("lab up: %v\n%s", upErr, upLog.String())
	}
	t.Logf("lab up:\n%s", upLog.String())
	_, kc, err := K8s()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("installed by the documented helm install", func(t *testing.T) {
		ds, err := kc.AppsV1().DaemonSets(LanekitNamespace).Get(ctx, "lanekit-agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Labels["app.kubernetes.io/managed-by"] != "Helm" || ds.Annotations["meta.helm.sh/release-name"] != "lanekit" {
			t.Fatalf("DaemonSet labels %v annotations %v: not the Helm release lanekit", ds.Labels, ds.Annotations)
		}
		// The docs' check step: the agent's own status, waited for.
		out, err := kubectl(ctx, nodeBins, nil, "-n", LanekitNamespace, "exec", "ds/lanekit-agent", "--", "lanekit", "status", "--wait")
		t.Logf("lanekit status --wait:\n%s", out)
		if err != nil {
			t.Fatal(err)
		}
		// The docs' proof step, as on any cluster (its kubeconfig, probes
		// through the pods' exec API; no --lab): every check passes.
		cctx, ccancel := context.WithTimeout(ctx, 4*time.Minute)
		defer ccancel()
		cmd := exec.CommandContext(cctx, "nsenter", "--net="+netnsPath(WireNS), "--",
			filepath.Join(bins.Dir, "lanekit"), "connectivity", "test", "--kubeconfig", Kubeconfig, "--timeout", "20s")
		b, err := cmd.CombinedOutput()
		t.Logf("lanekit connectivity test:\n%s", b)
		if err != nil {
			t.Fatalf("connectivity test on the Helm-installed cluster: %v", err)
		}
		for _, want := range []string{`pod-to-pod \(across nodes\)\s+pass`, `pod-to-service \(ClusterIP\)\s+pass`,
			`policy: deny \(client -> server\)\s+pass`, `dns\s+pass`, ` 0 failed`} {
			if !regexp.MustCompile(want).Match(b) {
				t.Errorf("summary lacks %q", want)
			}
		}
	})

	podCIDR6 := map[string]netip.Prefix{}
	nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		var fams, ips []string
		for _, c := range n.Spec.PodCIDRs {
			p := netip.MustParsePrefix(c)
			fams = append(fams, family(p.Addr()))
			if p.Addr().Is6() {
				podCIDR6[n.Name] = p
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, family(netip.MustParseAddr(a.Address)))
			}
		}
		if !slices.Equal(fams, []string{"IPv4", "IPv6"}) || !slices.Equal(ips, []string{"IPv4", "IPv6"}) {
			t.Errorf("node %s: spec.podCIDRs %v, addresses %v; want an IPv4 and an IPv6 pod CIDR and InternalIP", n.Name, n.Spec.PodCIDRs, n.Status.Addresses)
		}
	}

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
	ip6 := map[string]string{}
	for _, p := range pods {
		if len(p.Status.PodIPs) != 2 {
			t.Fatalf("pod %s status.podIPs %v, want one per family", p.Name, p.Status.PodIPs)
		}
		a := netip.MustParseAddr(p.Status.PodIPs[1].IP)
		if !podCIDR6[p.Spec.NodeName].Contains(a) {
			t.Fatalf("pod %s on %s: IPv6 %s not in the node's IPv6 pod CIDR %s", p.Name, p.Spec.NodeName, a, podCIDR6[p.Spec.NodeName])
		}
		ip6[p.Name] = a.String()
	}
	exec := func(p corev1.Pod, args ...string) (string, error) {
		return kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", p.Namespace, p.Name, "--"}, args...)...)
	}
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
		got, err := exec(p, "curl", "-sS", "-m", "5", url)
		if err != nil || strings.TrimSpace(got) != peer.Name {
			t.Errorf("%s (%s) -> %s: %q, %v", p.Name, p.Spec.NodeName, url, got, err)
		}
	}
	if d := fwd() - fwdBefore; d != 0 {
		t.Errorf("the nodes' kernels forwarded %d IPv6 datagrams of pod-to-pod traffic, want 0 (lanekit's BPF carries it)", d)
	}
	// The Service: each ClusterIP, and the name over IPv6 (AAAA), from a
	// pod that is not a backend (a pod reaching itself through an IPv6
	// ClusterIP, hairpin, is not implemented yet).
	client := clientPod(t, ctx, kc)
	targets := []string{svc.Spec.ClusterIPs[0], "[" + svc.Spec.ClusterIPs[1] + "]", "web.default.svc." + ClusterDomain}
	for k, target := range targets {
		seen := map[string]bool{}
		for try := 0; try < 30 && len(seen) < 2; try++ {
			args := []string{"curl", "-sS", "-m", "5"}
			if k == 2 {
				args = append(args, "-6")
			}
			got, err := exec(client, append(args, "http://"+target+"/hostname")...)
			if err != nil {
				t.Errorf("%s -> %s: %v", client.Name, target, err)
				break
			}
			seen[strings.TrimSpace(got)] = true
		}
		if !seen[pods[0].Name] || !seen[pods[1].Name] || len(seen) != 2 {
			t.Errorf("service %s from %s: answers from %v, want both pods", target, client.Name, seen)
		}
	}
	// lanekit serves the IPv6 ClusterIP: both agents, both pods' IPv6
	// addresses as its backends.
	want := []string{ip6[pods[0].Name], ip6[pods[1].Name]}
	slices.Sort(want)
	for i := 1; i <= 2; i++ {
		fe := serviceFrontend(t, i, svc.Spec.ClusterIPs[1])
		if fe == nil {
			t.Errorf("agent on %s has no frontend [%s]:80", NodeNS(i), svc.Spec.ClusterIPs[1])
			continue
		}
		var backends []string
		for _, b := range fe.GetBackends() {
			backends = append(backends, b.GetAddress())
		}
		slices.Sort(backends)
		if !slices.Equal(backends, want) {
			t.Errorf("agent on %s: [%s]:80 backends %v, want %v", NodeNS(i), svc.Spec.ClusterIPs[1], backends, want)
		}
	}

	after, err := ReadKernelTunables()
	if err != nil {
		t.Fatal(err)
	}
	if !mapsEqual(before, after) {
		t.Errorf("the machine's kernel tunables changed while the lab was up: before %v, after %v", before, after)
	}
}

// family names an address's family as Kubernetes does.
func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// clientPod runs an agnhost pod that no Service selects and waits until it
// is Ready.
func clientPod(t *testing.T, ctx context.Context, kc kubernetes.Interface) corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Labels: map[string]string{"app": "client"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agnhost", Image: "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
			Args: []string{"pause"}}}},
	}
	if _, err := kc.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = kc.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && podReady(got), nil
	})
	if err != nil {
		t.Fatalf("pod %s not Ready: %v", p.Name, err)
	}
	return *got
}
