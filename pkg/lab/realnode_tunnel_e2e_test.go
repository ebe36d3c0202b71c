package lab

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestLabRealNodesTunnel: lanekit installed as an admin whose network routes
// no pod CIDR installs it (kustomize, the ConfigMap's routing-mode tunnel) on
// the real-node lab's routed underlay, whose router knows no pod CIDR and
// hosts the API server. CoreDNS, which reaches the API server through the
// kubernetes Service, gets Ready only through lanekit's masquerading (the
// router cannot route a reply to a pod address); the test then checks from
// the pods: pod to pod across the nodes (the agent's tunnel counters move,
// its BPF encapsulation and uplink decapsulation among them; the nodes'
// kernels forward nothing), the API server by its address and through
// the kubernetes Service's ClusterIP (the masquerade counters on the
// client's node move), a ClusterIP Service of the two pods and its NodePort
// from the router on both nodes (local and remote backends). Opt-in with
// the rival labs (EnvLabRivals): it is the lab `lab bench --routing tunnel`
// compares with flannel's and Cilium's VXLAN.
func TestLabRealNodesTunnel(t *testing.T) {
	if os.Getenv(EnvLabRivals) == "" {
		t.Skipf("opt-in: set %s=1 (the real-node labs of the rival comparisons; lanekit's tunnel one, about 1.5 minutes)", EnvLabRivals)
	}
	testutil.RequireTools(t, "curl")
	bins, nodeBins := realNodeTestBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	srv, kc, down := upRealNodeLab(t, ctx, bins, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, Routing: RoutingTunnel})
	defer down()

	svc, pods := webNodePort(t, ctx, kc)
	inPod := func(p corev1.Pod, args ...string) (string, error) {
		return kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", p.Namespace, p.Name, "--"}, args...)...)
	}
	forwarded := func() uint64 {
		var sum uint64
		for i := 1; i <= 2; i++ {
			v, err := IPForwDatagrams(ctx, NodeNS(i))
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		return sum
	}
	masq := func() uint64 {
		sock, err := RealNodeAgentSocket(1)
		if err != nil {
			t.Fatal(err)
		}
		return agentStatusOf(t, sock).GetControlPlane().GetLbCounters()["masquerade"]
	}

	tunnel := func() map[string]uint64 {
		sock, err := RealNodeAgentSocket(1)
		if err != nil {
			t.Fatal(err)
		}
		return agentStatusOf(t, sock).GetRouting().GetTunnelCounters()
	}

	// Pod to pod across the nodes, in the tunnel (what is no GSO packet, as
	// these requests and answers, encapsulated and decapsulated in BPF),
	// nothing kernel-forwarded.
	tun0, fwd0, m0 := tunnel(), forwarded(), masq()
	for k, p := range pods {
		peer := pods[1-k]
		got, err := inPod(p, "curl", "-sS", "-m", "5", fmt.Sprintf("http://%s:8080/hostname", peer.Status.PodIP))
		if err != nil || strings.TrimSpace(got) != peer.Name {
			t.Errorf("%s (%s) -> %s (%s): %q, %v", p.Name, p.Spec.NodeName, peer.Name, peer.Status.PodIP, got, err)
		}
	}
	tun1 := tunnel()
	for _, c := range []string{"encap", "encap-bpf", "decap", "decap-uplink"} {
		if tun1[c] <= tun0[c] {
			t.Errorf("tunnel counter %s on %s: %d -> %d over the cross-node requests, want it to move", c, NodeNS(1), tun0[c], tun1[c])
		}
	}
	if d := forwarded() - fwd0; d != 0 {
		t.Errorf("the nodes' kernels forwarded %d datagrams of pod-to-pod traffic, want 0", d)
	}
	if m := masq(); m != m0 {
		t.Errorf("pod-to-pod traffic masqueraded: %d -> %d flows", m0, m)
	}

	// Outside the cluster: the API server on the router, by its address and
	// through the kubernetes Service. Its replies reach the pod only
	// because the request left with the node's address.
	apiSvc, err := kc.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{fmt.Sprintf("%s:%d", srv.Address, srv.APIPort), apiSvc.Spec.ClusterIP + ":443"} {
		before := masq()
		got, err := inPod(pods[0], "curl", "-sSk", "-m", "5", "https://"+target+"/version")
		if err != nil || !strings.Contains(got, "gitVersion") {
			t.Errorf("%s -> https://%s/version: %q, %v", pods[0].Name, target, got, err)
		}
		if after := masq(); after <= before {
			t.Errorf("%s -> %s: masquerade counter on %s %d -> %d, want it to move", pods[0].Name, target, NodeNS(1), before, after)
		}
	}

	// A ClusterIP of the two pods.
	seen := map[string]bool{}
	for try := 0; try < 30 && len(seen) < 2; try++ {
		got, err := inPod(pods[0], "curl", "-sS", "-m", "5", "http://"+svc.Spec.ClusterIP+"/hostname")
		if err != nil {
			t.Fatalf("%s -> %s: %v", pods[0].Name, svc.Spec.ClusterIP, err)
		}
		seen[strings.TrimSpace(got)] = true
	}
	if !seen[pods[0].Name] || !seen[pods[1].Name] {
		t.Errorf("service %s: answers from %v, want both pods", svc.Spec.ClusterIP, seen)
	}

	// The NodePort from outside the cluster (the router), on both nodes,
	// until each pod has answered on each: a local backend's reply leaves
	// from the NodePort (not masqueraded), a remote one's comes back
	// through the tunnel.
	for i := 1; i <= 2; i++ {
		url := fmt.Sprintf("http://%s:%d/hostname", UnderlayIP(i), svc.Spec.Ports[0].NodePort)
		seen := map[string]bool{}
		for try := 0; try < 30 && len(seen) < 2; try++ {
			out, err := nsCommand(ctx, WireNS, "curl", "-sS", "-m", "5", url).Output()
			if err != nil {
				t.Errorf("NodePort %s from %s: %v", url, WireNS, err)
				break
			}
			seen[strings.TrimSpace(string(out))] = true
		}
		if !seen[pods[0].Name] || !seen[pods[1].Name] {
			t.Errorf("NodePort %s from %s: answers from %v, want both pods", url, WireNS, seen)
		}
	}
}
