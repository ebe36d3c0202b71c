package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// TestLabK8sDualStack brings up `lab up --k8s --ip-family dual` (a real API
// server with both families' Service ranges, Nodes with an IPv4 and an IPv6
// spec.podCIDRs entry and InternalIP, no static IPv6 pod routes) and checks
// what the agents' Kubernetes source makes of it:
//   - every pod's status.podIPs holds an IPv4 and an IPv6 address, the
//     latter from its Node's IPv6 pod CIDR;
//   - each agent installed a native route per family to the other node's
//     pod CIDR via that node's InternalIP of the family (the lab installs
//     none for IPv6: without the agent reading the IPv6 podCIDR and
//     InternalIP, IPv6 across nodes has no route);
//   - `lab check` passes its IPv4 and IPv6 matrices;
//   - a RequireDualStack Service gets a ClusterIP of each family from the
//     API server, and each answers from the backend on the other node over
//     its own family, through node 1's BPF load balancer (new-flow and
//     rev-NAT counters);
//   - bulk IPv6 TCP across the nodes stays on the BPF path: each node's
//     kernel forwards at most 2 % of it (Ip6OutForwDatagrams).
//
// Root; brings up the global lab (run under flock /tmp/lanekit-lab.lock).
func TestLabK8sDualStack(t *testing.T) { testLabK8sFamily(t, IPFamilyDual) }

// TestLabK8sIPv6Only is TestLabK8sDualStack on `lab up --k8s --ip-family
// ipv6`: Nodes whose only spec.podCIDR is IPv6 (the agents take it from the
// Node and run IPv6-only), pods with only an IPv6 status.podIPs entry, each
// agent's IPv6 route from the Nodes, `lab check` over IPv6, a SingleStack
// IPv6 Service (ipFamilies [IPv6]) through node 1's BPF load balancer, and
// bulk IPv6 TCP on the BPF path.
func TestLabK8sIPv6Only(t *testing.T) { testLabK8sFamily(t, IPFamilyIPv6) }

func testLabK8sFamily(t *testing.T, family string) {
	v6only := family == IPFamilyIPv6
	bins := pathTestBins(t)
	k8stest.RequireBins(t)
	bins.Self = CLIForTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if t.Failed() {
			for i := 1; i <= 2; i++ {
				t.Logf("agent %d log: %s", i, logTail(AgentLog(i)))
				t.Logf("kubelet %d log: %s", i, logTail(KubeletLog(i)))
			}
			t.Logf("kube-apiserver log: %s", logTail(filepath.Join(K8sDir, "kube-apiserver.log")))
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := Down(dctx, DownOptions{Bins: bins}); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	st, err := Up(ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, IPFamily: family, Bins: bins, Out: testLog{t}})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	_, c, err := K8s()
	if err != nil {
		t.Fatal(err)
	}

	pods := map[int]Pod{}
	for _, n := range st.Nodes {
		node, err := c.CoreV1().Nodes().Get(ctx, KubeNodeName(n.Index), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{PodCIDR(n.Index), PodCIDR6(n.Index)}
		if v6only {
			want = want[1:]
		}
		if !slices.Equal(node.Spec.PodCIDRs, want) {
			t.Errorf("node %s spec.podCIDRs %v, want %v", node.Name, node.Spec.PodCIDRs, want)
		}
		for _, p := range n.Pods {
			if p.Kind != KindLanekit {
				continue
			}
			pods[n.Index] = p
			a6, err := netip.ParseAddr(p.IP6)
			if err != nil || !netip.MustParsePrefix(PodCIDR6(n.Index)).Contains(a6) {
				t.Fatalf("pod %s on node %d: IPv6 address %q, want one in %s (status.podIPs)", p.NS, n.Index, p.IP6, PodCIDR6(n.Index))
			}
			if v6only && p.IP != "" {
				t.Fatalf("pod %s on IPv6-only node %d has IPv4 address %s", p.NS, n.Index, p.IP)
			}
		}
	}
	list, err := c.CoreV1().Pods(PodNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		switch {
		case v6only && (len(p.Status.PodIPs) != 1 || !strings.Contains(p.Status.PodIPs[0].IP, ":")):
			t.Errorf("pod %s status.podIPs %v, want only an IPv6 address", p.Name, p.Status.PodIPs)
		case !v6only && (len(p.Status.PodIPs) != 2 || !strings.Contains(p.Status.PodIPs[1].IP, ":")):
			t.Errorf("pod %s status.podIPs %v, want an IPv4 and an IPv6 address", p.Name, p.Status.PodIPs)
		}
	}

	t.Run("native routes per family from the Nodes", func(t *testing.T) {
		for i, j := range map[int]int{1: 2, 2: 1} {
			want := []k8s.Route{
				{Dst: netip.MustParsePrefix(PodCIDR(j)), Via: netip.MustParseAddr(UnderlayIP(j))},
				{Dst: netip.MustParsePrefix(PodCIDR6(j)), Via: netip.MustParseAddr(UnderlayIP6(j))},
			}
			if v6only {
				want = want[1:]
			}
			r, err := k8s.NewNetlinkRoutes(netnsPath(NodeNS(i)))
			if err != nil {
				t.Fatal(err)
			}
			var got []k8s.Route
			waitFor(t, fmt.Sprintf("node %d's lanekit routes %v", i, want), 30*time.Second, func() bool {
				got, err = r.Routes()
				return err == nil && len(got) == len(want) && !slices.ContainsFunc(want, func(r k8s.Route) bool { return !slices.Contains(got, r) })
			})
			r.Close()
			t.Logf("node %d: lanekit routes %v", i, got)
		}
	})

	t.Run("lab check", func(t *testing.T) { checkIPv6Matrix(t, ctx, bins) })

	t.Run("Service of the pods' families", func(t *testing.T) {
		client, backend := pods[1], pods[2]
		srv := nsCommand(ctx, backend.NS, bins.Self, "lab", "tcp-whoami", "--listen", "[::]:8080", "--for", "3m")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
		spec := corev1.ServiceSpec{
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		}
		families := map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: backend.IP, discoveryv1.AddressTypeIPv6: backend.IP6}
		backends := []string{backend.IP, backend.IP6}
		if v6only {
			spec.IPFamilyPolicy, spec.IPFamilies = ptr.To(corev1.IPFamilyPolicySingleStack), []corev1.IPFamily{corev1.IPv6Protocol}
			delete(families, discoveryv1.AddressTypeIPv4)
			backends = backends[1:]
		}
		svc, err := c.CoreV1().Services(PodNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "dual", Namespace: PodNamespace}, Spec: spec,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(svc.Spec.ClusterIPs) != len(backends) || !netip.MustParsePrefix(ServiceCIDR6).Contains(netip.MustParseAddr(svc.Spec.ClusterIPs[len(backends)-1])) {
			t.Fatalf("service clusterIPs %v (ipFamilies %v), want one per family %v, the IPv6 one in %s", svc.Spec.ClusterIPs, svc.Spec.IPFamilies, backends, ServiceCIDR6)
		}
		// No endpointslice controller runs here: the test writes a slice
		// per family.
		for fam, addr := range families {
			_, err := c.DiscoveryV1().EndpointSlices(PodNamespace).Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "dual-" + strings.ToLower(string(fam)), Namespace: PodNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: "dual"}},
				AddressType: fam,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		}
		lb := func() map[string]uint64 { return agentStatus(t, 1).GetControlPlane().GetLbCounters() }
		const n = 20
		ask := func(addr string, n int) map[string]int {
			out, err := inNS(ctx, client.NS, bins.Self, "lab", "tcp-ask", addr, "--count", fmt.Sprint(n))
			if err != nil {
				t.Fatalf("tcp-ask %s from %s: %v: %s", addr, client.NS, err, out)
			}
			var got map[string]int
			if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
				t.Fatalf("tcp-ask output %q: %v", out, err)
			}
			return got
		}
		for k, vip := range svc.Spec.ClusterIPs {
			want := net.JoinHostPort(backends[k], "8080")
			addr := net.JoinHostPort(vip, "80")
			// The agents program the Service once their watchers see it.
			var got map[string]int
			waitFor(t, addr+" answers from "+client.NS, 30*time.Second, func() bool {
				got = ask(addr, 1)
				return got[want] == 1
			})
			before := lb()
			got = ask(addr, n)
			after := lb()
			t.Logf("%s -> %s: %v; node 1 LB new-flow +%d, rev-nat +%d", client.NS, addr, got,
				after["new-flow"]-before["new-flow"], after["rev-nat"]-before["rev-nat"])
			if got[want] != n {
				t.Errorf("%s -> %s: %v, want %d answers from %s", client.NS, addr, got, n, want)
			}
			if d := after["new-flow"] - before["new-flow"]; d < n {
				t.Errorf("node 1: LB new-flow counter grew by %d for %d connections to %s", d, n, addr)
			}
			if d := after["rev-nat"] - before["rev-nat"]; d < n {
				t.Errorf("node 1: LB rev-nat counter grew by %d for %d connections' replies from %s", d, n, addr)
			}
		}
	})

	sample := func(t *testing.T, node int) pathSample {
		t.Helper()
		var s pathSample
		var err error
		if s.fwd, err = IP6OutForwDatagrams(ctx, NodeNS(node)); err != nil {
			t.Fatal(err)
		}
		if s.tx, s.rx, err = LinkPackets(ctx, pods[node].NS, PodIfName); err != nil {
			t.Fatal(err)
		}
		addr := pods[node].IP
		if v6only {
			addr = pods[node].IP6
		}
		if _, s.bpf, err = datapath.PinnedCounters(BPFDir(node), netip.MustParseAddr(addr)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("IPv6 bulk TCP node1 pod to node2 pod", func(t *testing.T) {
		before := map[int]pathSample{1: sample(t, 1), 2: sample(t, 2)}
		bulkTCP(t, ctx, pods[1].NS, pods[2].NS, pods[2].IP6)
		for n := 1; n <= 2; n++ {
			judgeBulkPath(t, fmt.Sprintf("node%d pod", n), before[n], sample(t, n), n == 1, maxKernelShare, "IPv6 datagrams")
		}
	})
}

// TestResultPodIPs: the lab kubelet reports a CNI result's addresses as
// status.podIPs, IPv4 first, one per family; a result without IPv4 fails.
func TestResultPodIPs(t *testing.T) {
	res := func(addrs ...string) *current.Result {
		r := &current.Result{}
		for _, a := range addrs {
			_, n, _ := net.ParseCIDR(a)
			ip, _, _ := net.ParseCIDR(a)
			n.IP = ip
			r.IPs = append(r.IPs, &current.IPConfig{Address: *n})
		}
		return r
	}
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{in: []string{"10.244.1.5/24"}, want: []string{"10.244.1.5"}},
		{in: []string{"fd00:10:244:1::5/64", "10.244.1.5/24"}, want: []string{"10.244.1.5", "fd00:10:244:1::5"}},
		{in: []string{"10.244.1.5/24", "fd00:10:244:1::5/64", "fd00:10:244:1::6/64"}, want: []string{"10.244.1.5", "fd00:10:244:1::5"}},
		{in: []string{"fd00:10:244:1::5/64"}, want: []string{"fd00:10:244:1::5"}}, // an IPv6-only node
	} {
		got, err := resultPodIPs(res(c.in...))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%v: %v %v, want %v", c.in, got, err, c.want)
		}
	}
	if _, err := resultPodIPs(res()); err == nil {
		t.Error("a result without addresses: no error")
	}
}
