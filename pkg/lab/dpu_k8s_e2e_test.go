package lab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// dpuK8sVIP is the test Service's ClusterIP: inside ServiceCIDR, outside
// the lab kube-proxy rules' 10.96.0.x addresses.
const dpuK8sVIP = "10.96.200.10"

// TestDPULabK8s: `lab up --k8s --dpu-nodes 1`. Node 1's DPU agent is its
// Kubernetes agent, under the host's node name: its pod CIDR and routes come
// from the Nodes, Services and NetworkPolicies created through the API
// server are enforced by its programs on node 1's pod's representor, while
// node 1's own namespace holds no lanekit datapath and its host agent no
// connection to the API server. One lab up, several subtests.
func TestDPULabK8s(t *testing.T) {
	bins := requireLabBins(t, "creates network namespaces", "ip", "iptables-restore", "nsenter", "sysctl", pingCommand()[0])
	k8stest.RequireBins(t)
	bins.Self = filepath.Join(bins.Dir, "lanekit") // the lab kubelet, tcp echo and dial
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var upLog bytes.Buffer
	start := time.Now()
	st, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, DPUNodes: 1, Bins: bins, Out: &upLog})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("DPU agent log: %s", logTail(DPULog(1)))
			for i := 1; i <= 2; i++ {
				t.Logf("agent %d log: %s", i, logTail(AgentLog(i)))
				t.Logf("kubelet %d log: %s", i, logTail(KubeletLog(i)))
			}
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := Down(dctx, DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if netnsExists(DPUNS(1)) {
			t.Errorf("lab down left %s", DPUNS(1))
		}
	})
	t.Logf("lab up (%s):\n%s", time.Since(start).Round(100*time.Millisecond), upLog.String())
	if err != nil {
		t.Fatal(err)
	}
	srv, c, err := K8s()
	if err != nil {
		t.Fatal(err)
	}
	api := net.JoinHostPort(APIAddress, strconv.Itoa(srv.APIPort))
	var client, backend Pod // node 1's (DPU node) lab pod, node 2's
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			if p.Kind == KindLanekit && n.Index == 1 {
				client = p
			} else if p.Kind == KindLanekit && n.Index == 2 {
				backend = p
			}
		}
	}
	if client.IP == "" || backend.IP == "" {
		t.Fatalf("lab pods %+v", st.Nodes)
	}

	t.Run("Check", func(t *testing.T) {
		var out bytes.Buffer
		if err := Check(ctx, bins, &out); err != nil {
			t.Errorf("lab check: %v\n%s", err, out.String())
		}
	})
	t.Run("HostHoldsNoDatapath", func(t *testing.T) { testDPUK8sHost(t, api) })
	t.Run("DPUWatchesItsHost", func(t *testing.T) { testDPUK8sWatches(ctx, t, c, client) })
	t.Run("Service", func(t *testing.T) { testDPUK8sService(ctx, t, bins, c, client, backend) })
	t.Run("NetworkPolicy", func(t *testing.T) { testDPUK8sPolicy(ctx, t, bins, c, client, backend) })
}

// testDPUK8sHost: node 1's namespace has no tcx/XDP program, endpoint
// device or pod route and no pins; its host agent holds no connection to
// the API server, the DPU agent does.
func testDPUK8sHost(t *testing.T, api string) {
	found, err := datapathIn(NodeNS(1), PodCIDR(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("node 1 (with a DPU) holds lanekit datapath: %v", found)
	}
	if _, err := os.Stat(BPFDir(1)); err == nil {
		t.Errorf("node 1 has pins at %s", BPFDir(1))
	}
	if found, err := datapathIn(DPUNS(1), PodCIDR(1)); err != nil || len(found) < 3 {
		t.Errorf("DPU: datapath seen %v (%v), want the uplink's and the endpoint's programs and routes", found, err)
	}
	host, err := peersOf(readPID(AgentPIDFile(1)))
	if err != nil {
		t.Fatal(err)
	}
	if host[api] {
		t.Errorf("node 1's host agent is connected to the API server %s: it should run no watchers", api)
	}
	dpuPeers, err := peersOf(readPID(filepath.Join(DPUDir(1), "agent.pid")))
	if err != nil {
		t.Fatal(err)
	}
	if !dpuPeers[api] {
		t.Errorf("the DPU agent has no connection to the API server %s (peers %v)", api, dpuPeers)
	}
}

// testDPUK8sWatches: the DPU agent runs under the host's Node: its pod CIDR
// is that Node's spec.podCIDR, its status names the node, the route to node
// 2's pods is the Node source's (route protocol 180, in the DPU), and node
// 1's Pod (spec.nodeName the host's) has its endpoint on the DPU with the
// address the kubelet reported.
func testDPUK8sWatches(ctx context.Context, t *testing.T, c kubernetes.Interface, client Pod) {
	stResp := agentStatusOf(t, DPUSocket(1))
	node, err := c.CoreV1().Nodes().Get(ctx, KubeNodeName(1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stResp.GetPodCidr() != node.Spec.PodCIDR {
		t.Errorf("DPU agent pod CIDR %q, want node %s's spec.podCIDR %q", stResp.GetPodCidr(), node.Name, node.Spec.PodCIDR)
	}
	if loc := stResp.GetDatapath().GetLocation(); !strings.Contains(loc, "Kubernetes node "+KubeNodeName(1)) || !strings.Contains(loc, "for host "+NodeNS(1)) {
		t.Errorf("DPU agent location %q does not name the host's Node %s", loc, KubeNodeName(1))
	}
	if !stResp.GetReady() {
		t.Errorf("DPU agent not ready: %s", stResp.GetReason())
	}
	out, err := run(ctx, "ip", "-n", DPUNS(1), "-4", "route", "show", PodCIDR(2))
	want := fmt.Sprintf("%s via %s dev %s proto %d", PodCIDR(2), UnderlayIP(2), Uplink, k8s.RouteProtocol)
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("DPU route to node 2's pods %q (%v), want %q (from node 2's Node object)", strings.TrimSpace(out), err, want)
	}
	pods, err := c.CoreV1().Pods(PodNamespace).List(ctx, metav1.ListOptions{LabelSelector: "lab.lanekit.io/node=1"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("node 1's lab pods: %v %v", pods, err)
	}
	p := pods.Items[0]
	if p.Spec.NodeName != KubeNodeName(1) || p.Status.PodIP != client.IP {
		t.Errorf("pod %s: nodeName %q IP %q, want %q %q", p.Name, p.Spec.NodeName, p.Status.PodIP, KubeNodeName(1), client.IP)
	}
	eps := listEndpoints(t, DPUSocket(1))
	var ep *apiv1.Endpoint
	for _, e := range eps {
		if e.GetLabels()["K8S_POD_NAME"] == p.Name {
			ep = e
		}
	}
	if ep == nil || !strings.HasPrefix(ep.GetIps()[0].GetAddress(), client.IP+"/") {
		t.Errorf("DPU endpoint of pod %s: %v, want IP %s", p.Name, ep, client.IP)
	}
}

// testDPUK8sService: a Service and its EndpointSlice created through the
// API server (backend: node 2's pod) reach node 1's pod's representor on the
// DPU: node 1's pod connects to the ClusterIP, the DPU's load balancer
// counts the new flow and its reverse translation, its conntrack holds it,
// node 1's stack forwards nothing.
func testDPUK8sService(ctx context.Context, t *testing.T, b Bins, c kubernetes.Interface, client, backend Pod) {
	echo, err := startEcho(ctx, b, backend.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-echo.Process.Pid, syscall.SIGKILL); _ = echo.Wait() }()
	_, err = c.CoreV1().Services(PodNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dpu-echo", Namespace: PodNamespace},
		Spec: corev1.ServiceSpec{ClusterIP: dpuK8sVIP,
			Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(EchoPort), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DiscoveryV1().EndpointSlices(PodNamespace).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "dpu-echo-1", Namespace: PodNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: "dpu-echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.IP}, NodeName: ptr.To(KubeNodeName(2)),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("echo"), Port: ptr.To[int32](EchoPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := net.JoinHostPort(dpuK8sVIP, "80")
	var last string
	deadline := time.Now().Add(30 * time.Second)
	for last = dial(ctx, t, b, client.NS, vip); last != "" && time.Now().Before(deadline); last = dial(ctx, t, b, client.NS, vip) {
		time.Sleep(200 * time.Millisecond)
	}
	if last != "" {
		t.Fatalf("node 1 pod -> Service %s (from the API server): %s", vip, last)
	}
	lb0 := agentStatusOf(t, DPUSocket(1)).GetControlPlane().GetLbCounters()
	from0 := dpuCounters(t, 1)[client.IP].GetFromPackets()
	fwd0, _ := IPForwDatagrams(ctx, NodeNS(1))
	const conns = 5
	for k := range conns {
		if got, err := echoVia(client.NS, vip, "dpu-k8s-"+strconv.Itoa(k)); err != nil || got != "dpu-k8s-"+strconv.Itoa(k) {
			t.Errorf("echo %d through %s: %q %v", k, vip, got, err)
		}
	}
	lb1 := agentStatusOf(t, DPUSocket(1)).GetControlPlane().GetLbCounters()
	from1 := dpuCounters(t, 1)[client.IP].GetFromPackets()
	fwd1, _ := IPForwDatagrams(ctx, NodeNS(1))
	if d := lb1["new-flow"] - lb0["new-flow"]; d < conns {
		t.Errorf("the DPU's load balancer counted %d new flows for %d connections to %s", d, conns, vip)
	}
	if d := lb1["rev-nat"] - lb0["rev-nat"]; d < conns {
		t.Errorf("the DPU's load balancer reverse-translated %d replies for %d connections", d, conns)
	}
	if d := from1 - from0; d < 3*conns {
		t.Errorf("the DPU counted %d packets from %s for %d connections", d, client.IP, conns)
	}
	if d := fwd1 - fwd0; d != 0 {
		t.Errorf("node 1's stack forwarded %d datagrams: Service traffic went through the host", d)
	}
	if n := conntrackEntries(t, DPUSocket(1)); n == 0 {
		t.Error("the DPU's conntrack is empty after Service connections")
	}
	t.Run("FromHostNetns", func(t *testing.T) { testDPUK8sHostClusterIP(t, vip) })
}

// testDPUK8sHostClusterIP: node 1's own processes reach the ClusterIP
// (issue 28's socket LB for the host of a DPU node): the host holds no
// lanekit program, its route to the Service range leads through its PF to
// the DPU, whose from_host on the PF representor load-balances the flow
// (the DPU's new-flow counter) and from_uplink translates the replies back
// (rev-nat).
func testDPUK8sHostClusterIP(t *testing.T, vip string) {
	found, err := datapathIn(DPUNS(1), PodCIDR(1))
	if err != nil || !strings.Contains(fmt.Sprint(found), "on "+DPUPF) {
		t.Errorf("no program on the DPU's host PF representor %s: %v %v", DPUPF, found, err)
	}
	lb0 := agentStatusOf(t, DPUSocket(1)).GetControlPlane().GetLbCounters()
	const conns = 3
	for k := range conns {
		tok := "host-" + strconv.Itoa(k)
		if got, err := echoVia(NodeNS(1), vip, tok); err != nil || got != tok {
			t.Errorf("node 1's host netns -> %s: %q %v", vip, got, err)
		}
	}
	lb1 := agentStatusOf(t, DPUSocket(1)).GetControlPlane().GetLbCounters()
	if d := lb1["new-flow"] - lb0["new-flow"]; d < conns {
		t.Errorf("the DPU's load balancer counted %d new flows for %d host connections to %s", d, conns, vip)
	}
	if d := lb1["rev-nat"] - lb0["rev-nat"]; d < conns {
		t.Errorf("the DPU reverse-translated %d replies for %d host connections", d, conns)
	}
}

// testDPUK8sPolicy: a NetworkPolicy created through the API server selects
// node 1's pod and admits TCP to the echo port from pods labelled
// role=dpu-peer only: a pod so labelled on node 2 connects, node 2's lab pod
// is dropped, and the drops are counted against node 1's pod by the DPU's
// programs (its endpoint's policy-ingress drops).
func testDPUK8sPolicy(ctx context.Context, t *testing.T, b Bins, c kubernetes.Interface, client, denied Pod) {
	echo, err := startEcho(ctx, b, client.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-echo.Process.Pid, syscall.SIGKILL); _ = echo.Wait() }()
	peer, err := c.CoreV1().Pods(PodNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dpu-peer", Namespace: PodNamespace, Labels: map[string]string{"role": "dpu-peer"}},
		Spec:       corev1.PodSpec{NodeName: KubeNodeName(2), Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WaitPodIP(ctx, c, PodNamespace, peer.Name, time.Minute); err != nil {
		t.Fatalf("%v; kubelet: %s", err, logTail(KubeletLog(2)))
	}
	peerNS := PodNetns(2, peer.UID)
	target := net.JoinHostPort(client.IP, strconv.Itoa(EchoPort))
	for _, ns := range []string{peerNS, denied.NS} {
		if e := dial(ctx, t, b, ns, target); e != "" {
			t.Fatalf("%s -> %s before the policy: %s", ns, target, e)
		}
	}
	_, err = c.NetworkingV1().NetworkPolicies(PodNamespace).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "dpu-node1-ingress", Namespace: PodNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"lab.lanekit.io/node": "1"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "dpu-peer"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(EchoPort))}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for dial(ctx, t, b, denied.NS, target) == "" {
		if time.Now().After(deadline) {
			t.Fatalf("%s still reaches %s 30 s after the policy", denied.NS, target)
		}
		time.Sleep(200 * time.Millisecond)
	}
	drops0 := dpuCounters(t, 1)[client.IP].GetDrops()["policy-ingress"]
	if e := dial(ctx, t, b, denied.NS, target); e == "" {
		t.Errorf("%s (not role=dpu-peer) reaches node 1's pod under the policy", denied.NS)
	}
	drops1 := dpuCounters(t, 1)[client.IP].GetDrops()["policy-ingress"]
	if drops1 <= drops0 {
		t.Errorf("the DPU counted no policy-ingress drop for node 1's pod (%d -> %d)", drops0, drops1)
	}
	if e := dial(ctx, t, b, peerNS, target); e != "" {
		t.Errorf("the allowed peer %s -> %s under the policy: %s", peerNS, target, e)
	}
	if got, err := echoVia(peerNS, target, "allowed"); err != nil || got != "allowed" {
		t.Errorf("allowed peer echo: %q %v", got, err)
	}
}

// peersOf returns the remote addresses ("ip:port") of process pid's
// established IPv4 TCP sockets (its fds' socket inodes in its netns'
// /proc/net/tcp).
func peersOf(pid int) (map[string]bool, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("no pid")
	}
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) < 10 || fields[3] != "01" || !inodes[fields[9]] {
			continue
		}
		if a, ok := procNetAddr(fields[2]); ok {
			out[a] = true
		}
	}
	return out, sc.Err()
}

// procNetAddr decodes /proc/net/tcp's "0100A8C0:1F90" (little-endian IPv4
// on this machine, port in hex).
func procNetAddr(s string) (string, bool) {
	h, p, ok := strings.Cut(s, ":")
	ipv, err1 := strconv.ParseUint(h, 16, 32)
	port, err2 := strconv.ParseUint(p, 16, 16)
	if !ok || err1 != nil || err2 != nil {
		return "", false
	}
	ip := net.IPv4(byte(ipv), byte(ipv>>8), byte(ipv>>16), byte(ipv>>24))
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10)), true
}
