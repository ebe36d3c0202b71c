package lab

import (
	"context"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// checkDocsInstall checks the real-node lab's Helm install (InstallHelm)
// the way docs/install.md tells the user to: the release's DaemonSet, its
// check step (`lanekit status --wait` in an agent) and its proof step
// (`lanekit connectivity test` as on any cluster: the kubeconfig, probes
// through the pods' exec API, no --lab), every check passing.
func checkDocsInstall(t *testing.T, ctx context.Context, kc kubernetes.Interface, bins Bins, nodeBins string) {
	ds, err := kc.AppsV1().DaemonSets(LanekitNamespace).Get(ctx, "lanekit-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Labels["app.kubernetes.io/managed-by"] != "Helm" || ds.Annotations["meta.helm.sh/release-name"] != "lanekit" {
		t.Fatalf("DaemonSet labels %v annotations %v: not the Helm release lanekit", ds.Labels, ds.Annotations)
	}
	out, err := kubectl(ctx, nodeBins, nil, "-n", LanekitNamespace, "exec", "ds/lanekit-agent", "--", "lanekit", "status", "--wait")
	t.Logf("lanekit status --wait:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
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
}

// checkDualStackNodes checks that each Node has a pod CIDR and an InternalIP
// of each family, and returns the nodes' IPv6 pod CIDRs by name.
func checkDualStackNodes(t *testing.T, ctx context.Context, kc kubernetes.Interface) map[string]netip.Prefix {
	t.Helper()
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
	return podCIDR6
}

// podIPv6s returns each pod's IPv6 address (status.podIPs[1]), checked to
// be in its node's IPv6 pod CIDR.
func podIPv6s(t *testing.T, pods []corev1.Pod, podCIDR6 map[string]netip.Prefix) map[string]string {
	t.Helper()
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
	return ip6
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
	return *agnhostPausePod(t, ctx, kc, "client", "")
}

// agnhostPausePod starts an agnhost pause pod name (label app=name) on node
// ("": where the scheduler puts it) and waits until it is Ready, with an
// address.
func agnhostPausePod(t *testing.T, ctx context.Context, kc kubernetes.Interface, name, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agnhost",
			Image: "registry.k8s.io/e2e-test-images/agnhost:2.66.1", Args: []string{"pause"}}}},
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
		t.Fatalf("pod %s (node %q) not Ready: %v", p.Name, node, err)
	}
	if got.Status.PodIP == "" {
		t.Fatalf("pod %s has no address", p.Name)
	}
	return got
}
