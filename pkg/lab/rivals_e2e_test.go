package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/testutil"
)

// machineNetfilter is the machine's own iptables and nftables rulesets.
func machineNetfilter(t *testing.T) string {
	t.Helper()
	var b bytes.Buffer
	for _, args := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		// iptables-save's comment lines carry the time.
		b.WriteString(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(string(out), ""))
	}
	return b.String()
}

// rivalTestBins is realNodeTestBins plus the rival's binaries and image
// archives (skips when they are not built).
func rivalTestBins(t *testing.T, cni string) (Bins, string) {
	t.Helper()
	bins, nodeBins := realNodeTestBins(t)
	r, _, err := rivalFor(cni, RoutingNative)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Bins {
		if f := filepath.Join(nodeBins, b); !executable(f) && !regularFile(f) {
			if os.Getenv(EnvNodeRequired) != "" {
				t.Fatalf("%s missing in %s (%s is set)", b, nodeBins, EnvNodeRequired)
			}
			t.Skipf("skipping: %s not built in %s (make k8s-node-bins)", b, nodeBins)
		}
	}
	imgs := exec.Command("go", append([]string{"run", "./internal/tools/lkimages", "-out", bins.ImagesDir(), "-bin", bins.Dir, "-node-bins", nodeBins}, r.Images...)...)
	imgs.Dir = repoRoot(t)
	if out, err := imgs.CombinedOutput(); err != nil {
		t.Fatalf("lkimages: %v\n%s", err, out)
	}
	return bins, nodeBins
}

// TestLabRivals brings up the real-node lab with each rival network (upstream
// kube-proxy + flannel, or Cilium; no lanekit) and checks, from a user's
// side, that pods reach each other across the nodes, a ClusterIP Service (by
// address and by name; and from a node's own netns, a hostNetwork client), a
// NodePort from outside the nodes and a hostPort;
// and the path. kube-proxy + flannel: kube-proxy's DNAT in the client node's
// conntrack table, its rules for the Service (iptables: the KUBE-SVC chain's
// packet counter moved; nftables: the ClusterIP in its services map),
// flannel's routes (host-gw: the peer's pod CIDR via its underlay address;
// vxlan: flannel.1's tx counter moved), no BPF pin on any node. Cilium: its
// service map (cilium-dbg bpf lb list) holds the ClusterIP with both pods,
// its BPF conntrack the client's connections to the pods, no KUBE-SVC rule
// and no conntrack DNAT in the node, its maps pinned in the node's bpffs (not
// the machine's), its routes (native: direct node routes; VXLAN:
// cilium_vxlan's tx counter moved). Both: no lanekit agent, and the
// machine's own iptables and nftables rules and bpffs unchanged after lab down.
// EnvLabRivals opts TestLabRivals in.
const EnvLabRivals = "LANEKIT_LAB_RIVALS"

func TestLabRivals(t *testing.T) {
	if os.Getenv(EnvLabRivals) == "" {
		t.Skipf("opt-in: set %s=1 (real-node labs of other projects' datapaths, about 1.5 minutes each; "+
			"make test stays in its budget without them)", EnvLabRivals)
	}
	testutil.RequireTools(t, "nft", "curl")
	for _, c := range []struct{ cni, routing string }{
		{CNIKubeProxyIptables, RoutingNative},
		{CNIKubeProxyNftables, RoutingTunnel},
		{CNICilium, RoutingNative},
		{CNICilium, RoutingTunnel},
	} {
		t.Run(c.cni+"/"+c.routing, func(t *testing.T) {
			bins, nodeBins := rivalTestBins(t, c.cni)
			testRivalLab(t, bins, nodeBins, c.cni, c.routing)
		})
	}
}

// machineBPFPins lists the machine's own bpffs (top two levels).
func machineBPFPins(t *testing.T) []string {
	t.Helper()
	var out []string
	ents, err := os.ReadDir("/sys/fs/bpf")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		out = append(out, e.Name())
		if sub, err := os.ReadDir(filepath.Join("/sys/fs/bpf", e.Name())); err == nil {
			for _, s := range sub {
				out = append(out, e.Name()+"/"+s.Name())
			}
		}
	}
	return out
}

func testRivalLab(t *testing.T, bins Bins, nodeBins, cni, routing string) {
	before, pinsBefore := machineNetfilter(t), machineBPFPins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, kc, down := upRealNodeLab(t, ctx, bins, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Kubelet: true, CNI: cni, Routing: routing})
	if pods, err := kc.CoreV1().Pods(LanekitNamespace).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) > 0 {
		t.Errorf("lanekit pods on a %s lab: %d, %v", cni, len(pods.Items), err)
	}
	if cni == CNICilium {
		if err := waitDaemonSet(ctx, kc, ciliumNamespace, ciliumAgentDS, 2); err != nil {
			t.Error(err)
		}
	} else {
		for _, ds := range [][2]string{{"kube-system", "kube-proxy"}, {"kube-flannel", "kube-flannel-ds"}} {
			if err := waitDaemonSet(ctx, kc, ds[0], ds[1], 2); err != nil {
				t.Error(err)
			}
		}
	}
	for i := 1; i <= 2; i++ {
		root, err := nodeRoot(i)
		if err != nil {
			t.Fatal(err)
		}
		// The node's own bpffs. kube-proxy + flannel: nothing pinned (the
		// kernel's preloaded maps.debug and progs.debug iterators aside).
		// Cilium: its service map.
		bpffs := filepath.Join(root, "sys", "fs", "bpf")
		if cni == CNICilium {
			if _, err := os.Stat(filepath.Join(bpffs, "tc", "globals", "cilium_lb4_services_v2")); err != nil {
				t.Errorf("cilium: node %d's bpffs has no tc/globals/cilium_lb4_services_v2: %v", i, err)
			}
			continue
		}
		ents, err := os.ReadDir(bpffs)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
				t.Errorf("%s: node %d's bpffs has %s pinned; want nothing (no lanekit)", cni, i, e.Name())
			}
		}
	}

	svc, pods := webNodePort(t, ctx, kc)
	exec := func(p corev1.Pod, args ...string) (string, error) {
		return kubectl(ctx, nodeBins, nil, append([]string{"exec", "-n", p.Namespace, p.Name, "--"}, args...)...)
	}
	tunnelDev := "flannel.1"
	if cni == CNICilium {
		tunnelDev = "cilium_vxlan"
	}
	tunnelTx := func() int {
		out, err := nsCommand(ctx, NodeNS(1), "cat", "/sys/class/net/"+tunnelDev+"/statistics/tx_packets").Output()
		if err != nil {
			return -1
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return n
	}
	tx0 := tunnelTx()
	for k, p := range pods {
		peer := pods[1-k]
		got, err := exec(p, "curl", "-sS", "-m", "5", fmt.Sprintf("http://%s:8080/hostname", peer.Status.PodIP))
		if err != nil || strings.TrimSpace(got) != peer.Name {
			t.Errorf("%s (%s) -> %s (%s): %q, %v", p.Name, p.Spec.NodeName, peer.Name, peer.Status.PodIP, got, err)
		}
	}
	tx1 := tunnelTx()
	svcPackets := func() int { return kubeSvcPackets(t, ctx, NodeNS(1), "default/web") }
	pk0 := -1
	if cni == CNIKubeProxyIptables {
		pk0 = svcPackets()
	}
	for _, target := range []string{svc.Spec.ClusterIP, "web.default.svc." + ClusterDomain} {
		seen := map[string]bool{}
		for try := 0; try < 30 && len(seen) < 2; try++ {
			got, err := exec(pods[0], "curl", "-sS", "-m", "5", "http://"+target+"/hostname")
			if err != nil {
				t.Errorf("%s -> %s: %v", pods[0].Name, target, err)
				break
			}
			seen[strings.TrimSpace(got)] = true
		}
		if !seen[pods[0].Name] || !seen[pods[1].Name] || len(seen) != 2 {
			t.Errorf("service %s from %s: answers from %v, want both pods", target, pods[0].Name, seen)
		}
	}
	// The proxy's own programming histograms, where the services bench
	// reads them (proxymetrics.go): served in node 1's netns, each with the
	// observations of the web Service just programmed.
	if ps := proxyScrapeFor(cni); ps == nil {
		t.Errorf("%s: no programming histograms named", cni)
	} else if got, err := ps.read(ctx); err != nil {
		t.Errorf("%s: own metrics at %s: %v", cni, ps.URL, err)
	} else {
		for _, s := range ps.Series {
			var n uint64
			for _, h := range got[s.Name] {
				n += h.count
			}
			if n == 0 {
				t.Errorf("%s: %s (labels matching %q) has no observation after a Service was programmed", cni, s.Name, s.Match)
			}
		}
	}
	// NodePort, from the underlay (outside every node), on both nodes.
	nodePort := svc.Spec.Ports[0].NodePort
	for i := 1; i <= 2; i++ {
		url := fmt.Sprintf("http://%s:%d/hostname", UnderlayIP(i), nodePort)
		out, err := nsCommand(ctx, WireNS, "curl", "-sS", "-m", "5", url).Output()
		if err != nil || (strings.TrimSpace(string(out)) != pods[0].Name && strings.TrimSpace(string(out)) != pods[1].Name) {
			t.Errorf("NodePort %s from %s: %q, %v", url, WireNS, out, err)
		}
	}
	// A node's own process to the ClusterIP (a hostNetwork client, as in the
	// upstream "node-Service" tests): kube-proxy's nat OUTPUT (the node has a
	// route for the Service range, as a kubeadm node's default route gives
	// it), Cilium's socket LB — attached to the node's cgroup2 directory
	// (cgroup.hostRoot), so the client runs in it as the node's processes do.
	svcURL := "http://" + svc.Spec.ClusterIP + "/hostname"
	cg, err := os.Open(realNodeCgroup2(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	curl := nsCommand(ctx, NodeNS(1), "curl", "-sS", "-m", "5", svcURL)
	curl.SysProcAttr.UseCgroupFD, curl.SysProcAttr.CgroupFD = true, int(cg.Fd())
	if out, err := curl.Output(); err != nil ||
		(strings.TrimSpace(string(out)) != pods[0].Name && strings.TrimSpace(string(out)) != pods[1].Name) {
		t.Errorf("service %s from node %s's own netns: %q, %v", svcURL, NodeNS(1), out, err)
	}
	// hostPort (portmap; Cilium: its BPF hostPort), from the other node's pod.
	url := fmt.Sprintf("http://%s:%d/hostname", pods[1].Status.HostIP, webHostPort)
	if got, err := exec(pods[0], "curl", "-sS", "-m", "5", url); err != nil || strings.TrimSpace(got) != pods[1].Name {
		t.Errorf("hostPort %s from %s: %q, %v", url, pods[0].Name, got, err)
	}

	// The path in the client's node: conntrack DNAT of the ClusterIP
	// (kube-proxy), or none of it and Cilium's maps.
	ct, err := nsCommand(ctx, NodeNS(1), "cat", "/proc/net/nf_conntrack").Output()
	if err != nil {
		t.Fatalf("conntrack table of %s: %v", NodeNS(1), err)
	}
	dnat := regexp.MustCompile(`src=` + regexp.QuoteMeta(pods[0].Status.PodIP) + ` dst=` + regexp.QuoteMeta(svc.Spec.ClusterIP) +
		` sport=\d+ dport=80 .*src=(` + regexp.QuoteMeta(pods[0].Status.PodIP) + `|` + regexp.QuoteMeta(pods[1].Status.PodIP) + `) dst=` +
		regexp.QuoteMeta(pods[0].Status.PodIP) + ` sport=8080`)
	if got := dnat.Match(ct); got != (cni != CNICilium) {
		t.Errorf("%s: conntrack entry DNATing %s:80 to a web pod in %s: %v, want %v:\n%s", cni, svc.Spec.ClusterIP, NodeNS(1), got, !got, ct)
	}
	switch cni {
	case CNIKubeProxyIptables:
		if pk1 := svcPackets(); pk0 < 0 || pk1 <= pk0 {
			t.Errorf("KUBE-SERVICES -> KUBE-SVC rule of default/web on %s: packets %d -> %d, want it to move", NodeNS(1), pk0, pk1)
		}
	case CNIKubeProxyNftables:
		out, err := nsCommand(ctx, NodeNS(1), "nft", "list", "table", "ip", "kube-proxy").Output()
		if err != nil || !strings.Contains(string(out), svc.Spec.ClusterIP+" . tcp . 80 : goto service-") {
			t.Errorf("kube-proxy's nftables table on %s lacks %s in its service map: %v\n%s", NodeNS(1), svc.Spec.ClusterIP, err, out)
		}
	case CNICilium:
		checkCiliumPath(t, ctx, kc, nodeBins, svc.Spec.ClusterIP, pods)
	}
	routes, err := nsCommand(ctx, NodeNS(1), "ip", "route", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	peerCIDR := regexp.QuoteMeta(pods[1].Status.PodIP[:strings.LastIndex(pods[1].Status.PodIP, ".")]) + `\.0/24`
	switch routing {
	case RoutingNative: // host-gw, Cilium's direct node routes: the peer's range via its underlay address
		if !regexp.MustCompile(`(?m)^` + peerCIDR + ` via ` + regexp.QuoteMeta(UnderlayIP(2)) + ` dev ` + Uplink).Match(routes) {
			t.Errorf("%s native: no route to node 2's pods via %s on %s:\n%s", cni, UnderlayIP(2), NodeNS(1), routes)
		}
		if tx0 != -1 {
			t.Errorf("%s native: %s has a %s device", cni, NodeNS(1), tunnelDev)
		}
	case RoutingTunnel: // vxlan: the tunnel device carried the cross-node traffic
		if cni != CNICilium && !regexp.MustCompile(`(?m)^`+peerCIDR+` via \S+ dev flannel\.1`).Match(routes) {
			t.Errorf("vxlan: no route to node 2's pods on flannel.1 on %s:\n%s", NodeNS(1), routes)
		}
		if tx0 < 0 || tx1 <= tx0 {
			t.Errorf("vxlan: %s tx packets %d -> %d over the cross-node requests, want them to move", tunnelDev, tx0, tx1)
		}
	}

	down()
	if after := machineNetfilter(t); after != before {
		t.Errorf("the machine's iptables/nftables rules changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if after := machineBPFPins(t); strings.Join(after, " ") != strings.Join(pinsBefore, " ") {
		t.Errorf("the machine's bpffs changed: before %v, after %v", pinsBefore, after)
	}
	if left := listLabNetns(); len(left) > 0 {
		t.Errorf("netns left after down: %v", left)
	}
}

// kubeSvcPackets is the packet counter of the KUBE-SERVICES rule that sends
// the Service's ClusterIP (kube-proxy's comment "NS/NAME cluster IP") to its
// KUBE-SVC chain, on node netns ns; -1 when there is no such rule.
func kubeSvcPackets(t *testing.T, ctx context.Context, ns, svc string) int {
	t.Helper()
	out, err := nsCommand(ctx, ns, "iptables-save", "-c", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("iptables-save on %s: %v", ns, err)
	}
	re := regexp.MustCompile(`(?m)^\[(\d+):\d+\] -A KUBE-SERVICES .*"` + regexp.QuoteMeta(svc) + ` cluster IP".* -j KUBE-SVC-`)
	m := re.FindSubmatch(out)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// realNodeCgroup2 is real node i's cgroup2 directory, as its init was
// started with it (NodeSpec.Cgroup2): where its processes run and Cilium's
// socket LB is attached.
func realNodeCgroup2(t *testing.T, i int) string {
	t.Helper()
	data, err := os.ReadFile(nodeSpecFile(RealNodeDir(i)))
	if err != nil {
		t.Fatal(err)
	}
	var spec NodeSpec
	if err := json.Unmarshal(data, &spec); err != nil || spec.Cgroup2 == "" {
		t.Fatalf("node %d spec: cgroup2 %q, %v", i, spec.Cgroup2, err)
	}
	return spec.Cgroup2
}
