package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// labApply applies a Kubernetes object file (what: "service" or "policy")
// to every node's agent through the CLI.
func labApply(t *testing.T, ctx context.Context, self, what, yaml string) {
	t.Helper()
	file := writeTemp(t, what+".yaml", yaml)
	for node := 1; node <= 2; node++ {
		labCLI(t, ctx, self, what, "apply", "-f", file, "--socket", AgentSocket(node))
	}
}

// labCLI runs the lanekit CLI, bounded; it fails the test on an error.
func labCLI(t *testing.T, ctx context.Context, self string, args ...string) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(cctx, self, args...).CombinedOutput(); err != nil {
		t.Fatalf("lanekit %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// echoDial runs `lab tcp-dial` to addr from netns ns: whether the TCP echo
// answered.
func echoDial(t *testing.T, ctx context.Context, self, ns, addr string) bool {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := inNS(cctx, ns, self, "lab", "tcp-dial", "--timeout", "3s", addr)
	if err != nil {
		t.Fatalf("tcp-dial %s from %s: %v: %s", addr, ns, err, out)
	}
	res, err := ParseDialResults([]byte(out))
	if err != nil || len(res) != 1 {
		t.Fatalf("tcp-dial output %q: %v", out, err)
	}
	return res[0].OK
}

// TestIPv6OnlyLab: `lab up --ip-family ipv6` gives lanekit pods only an
// IPv6 address (the agents get only an IPv6 pod CIDR): no IPv4 address or
// route in the pods, `lab check` passes (the IPv6 matrix: pod to pod on
// the same node and across nodes, pod to node), IPv6 bulk TCP across nodes
// is carried by BPF both ways (Ip6OutForwDatagrams, the endpoints' counters
// looked up by their IPv6 addresses), an IPv6 ClusterIP with backends on
// both nodes answers, and a NetworkPolicy admitting only node 1's IPv6 pod
// range keeps the pod on node 2 out (counted as policy-ingress drops) while
// the other pod on node 1 gets in. Root; brings up the global lab.
func TestIPv6OnlyLab(t *testing.T) {
	bins := pathTestBins(t)
	bins.Self = CLIForTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 2, IPFamily: IPFamilyIPv6, Bins: bins})
	pods := map[string]Pod{}
	for _, p := range st.PodsOf(KindLanekit) {
		if a, err := netip.ParseAddr(p.IP6); err != nil || !a.Is6() || p.IP != "" {
			t.Fatalf("lanekit pod %s: IPv4 %q, IPv6 %q: want only an IPv6 address", p.NS, p.IP, p.IP6)
		}
		out, err := inNS(ctx, p.NS, "ip", "-4", "-o", "addr", "show", "dev", PodIfName)
		if err != nil || strings.TrimSpace(out) != "" {
			t.Fatalf("pod %s has IPv4 on %s: %q %v", p.NS, PodIfName, out, err)
		}
		pods[p.NS] = p
	}
	p11, p12, p21, p22 := pods[PodNS(1, 1, KindLanekit)], pods[PodNS(1, 2, KindLanekit)], pods[PodNS(2, 1, KindLanekit)], pods[PodNS(2, 2, KindLanekit)]

	t.Run("lab check", func(t *testing.T) {
		out := checkIPv6Matrix(t, ctx, bins)
		if strings.Contains(out, "lanekit pods: ICMP") {
			t.Fatal("lab check probed lanekit pods over IPv4 in an IPv6-only lab")
		}
	})

	sample := func(t *testing.T, node int, p Pod) pathSample {
		t.Helper()
		var s pathSample
		var err error
		if s.fwd, err = IP6OutForwDatagrams(ctx, NodeNS(node)); err != nil {
			t.Fatal(err)
		}
		if s.tx, s.rx, err = LinkPackets(ctx, p.NS, PodIfName); err != nil {
			t.Fatal(err)
		}
		if _, s.bpf, err = datapath.PinnedCounters(BPFDir(node), netip.MustParseAddr(p.IP6)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, dir := range []struct {
		client, server Pod
		cn, sn         int
	}{{p11, p21, 1, 2}, {p21, p11, 2, 1}} {
		t.Run(fmt.Sprintf("IPv6 bulk TCP node%d pod to node%d pod", dir.cn, dir.sn), func(t *testing.T) {
			bc, bs := sample(t, dir.cn, dir.client), sample(t, dir.sn, dir.server)
			bulkTCP(t, ctx, dir.client.NS, dir.server.NS, dir.server.IP6)
			judgeBulkPath(t, "client node", bc, sample(t, dir.cn, dir.client), true, maxKernelShare, "IPv6 datagrams")
			judgeBulkPath(t, "server node", bs, sample(t, dir.sn, dir.server), false, maxKernelShare, "IPv6 datagrams")
		})
	}

	echo := func(t *testing.T, p Pod) {
		t.Helper()
		cmd, err := startEchoOn(ctx, bins, p.NS, EchoPort6)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	echo(t, p11)
	echo(t, p21)
	const vip = "fd00:96::40"
	t.Run("IPv6 ClusterIP", func(t *testing.T) {
		labApply(t, ctx, bins.Self, "service", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: echo6, namespace: default}
spec:
  clusterIP: "%[1]s"
  clusterIPs: ["%[1]s"]
  ipFamilies: [IPv6]
  ports: [{name: e, port: 80, targetPort: %[2]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo6-1, namespace: default, labels: {kubernetes.io/service-name: echo6}}
addressType: IPv6
ports: [{name: e, port: %[2]d}]
endpoints: [{addresses: ["%[3]s"]}, {addresses: ["%[4]s"]}]
`, vip, EchoPort6, p11.IP6, p21.IP6))
		lbNew := func() uint64 { return agentStatus(t, 2).GetControlPlane().GetLbCounters()["new-flow"] }
		before := lbNew()
		addr := net.JoinHostPort(vip, "80")
		const n = 6
		for i := range n {
			ok := false
			for try := 0; try < 5 && !ok; try++ { // the agents apply the Service asynchronously
				if ok = echoDial(t, ctx, bins.Self, p22.NS, addr); !ok {
					time.Sleep(500 * time.Millisecond)
				}
			}
			if !ok {
				t.Fatalf("connection %d: %s -> %s fails", i, p22.NS, addr)
			}
		}
		if d := since(lbNew(), before); d < n {
			t.Errorf("node 2 load-balanced %d new flows for %d connections to the IPv6 ClusterIP", d, n)
		}
	})

	t.Run("NetworkPolicy over IPv6", func(t *testing.T) {
		target := net.JoinHostPort(p11.IP6, fmt.Sprint(EchoPort6))
		if !echoDial(t, ctx, bins.Self, p21.NS, target) {
			t.Fatalf("%s -> %s fails without a policy", p21.NS, target)
		}
		labApply(t, ctx, bins.Self, "policy", fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-node1-pods, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: "%s"}}]
`, PodCIDR6(1)))
		drops := func() uint64 { return endpointCounters(t, 1)[p11.IP6].GetDrops()["policy-ingress"] }
		before := drops()
		deadline := time.Now().Add(10 * time.Second)
		for echoDial(t, ctx, bins.Self, p21.NS, target) { // applied asynchronously
			if time.Now().After(deadline) {
				t.Fatalf("%s -> %s still connects under a policy admitting only %s", p21.NS, target, PodCIDR6(1))
			}
			time.Sleep(500 * time.Millisecond)
		}
		if !echoDial(t, ctx, bins.Self, p12.NS, target) {
			t.Errorf("%s -> %s (in the admitted block) is refused", p12.NS, target)
		}
		if d := since(drops(), before); d < 1 {
			t.Errorf("%s counted %d policy-ingress drops for the denied connection", p11.NS, d)
		}
		for node := 1; node <= 2; node++ {
			labCLI(t, ctx, bins.Self, "policy", "delete", "default/from-node1-pods", "--socket", AgentSocket(node))
		}
	})

	// Pods by label across nodes: `lab pod add` pushes Pod objects with
	// only an IPv6 address; node 1's agent must know the remote client by
	// it for the podSelector to admit it.
	t.Run("NetworkPolicy podSelector across nodes over IPv6", func(t *testing.T) {
		for _, p := range [][]string{{"web", "1", "app=web"}, {"client", "2", "role=client"}, {"other", "2", "role=other"}} {
			labCLI(t, ctx, bins.Self, "lab", "pod", "add", p[0], "--node", p[1], "--namespace", "shop", "--labels", p[2])
		}
		st, err := LoadState()
		if err != nil {
			t.Fatal(err)
		}
		named := map[string]NamedPod{}
		for _, p := range st.NamedPods {
			if p.IP != "" || p.IP6 == "" {
				t.Fatalf("lab pod %s: IPv4 %q IPv6 %q, want IPv6 only", p.Name, p.IP, p.IP6)
			}
			named[p.Name] = p
		}
		echo(t, Pod{NS: NamedPodNS("web")})
		labApply(t, ctx, bins.Self, "policy", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
`)
		target := net.JoinHostPort(named["web"].IP6, fmt.Sprint(EchoPort6))
		deadline := time.Now().Add(10 * time.Second)
		for echoDial(t, ctx, bins.Self, NamedPodNS("other"), target) { // applied asynchronously
			if time.Now().After(deadline) {
				t.Fatalf("other -> %s still connects under a policy admitting only role=client", target)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if !echoDial(t, ctx, bins.Self, NamedPodNS("client"), target) {
			t.Errorf("client (role=client, node 2, IPv6 only) -> %s is refused", target)
		}
	})
}
