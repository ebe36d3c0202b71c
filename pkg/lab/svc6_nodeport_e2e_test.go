package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDualStackLabNodePort6: in a dual-stack lab (`lab up --ip-family dual`)
// a dual-stack NodePort Service with an IPv6 external IP and backends on
// both nodes is reached over IPv6 from the wire (an external host on the
// underlay) and from the other node's host stack: on node 1's IPv6 address
// and NodePort, and on the external IP (routed to node 1 by the external
// host). Every connection is answered by a backend of either node; node 1's
// LB counters account for them (NodePort to its local backend with the
// client's address, to the remote one source-NATed) and its kernel forwards
// none of it (Ip6OutForwDatagrams in node 1's netns): the BPF path
// translates, routes and translates back. Root; brings up the global lab.
func TestDualStackLabNodePort6(t *testing.T) {
	lk, cli, pods := dualStackWebLab(t)
	const (
		vip4, vip6 = "10.96.100.30", "fd00:96::30"
		nodePort   = 30180
		extIP      = "2001:db8:e::1"
		rawAddr    = "fd00:77::e2" // the external host's IPv6 address on the wire
	)
	applyDualStackWeb(t, lk, pods, vip4, vip6, fmt.Sprintf("  type: NodePort\n  externalIPs: [\"%s\"]", extIP), nodePort)
	// The external host: an IPv6 address on the wire, the external IP
	// routed to node 1 (as a router in front of the cluster would).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	raw := RawNS(2)
	for _, kv := range [][2]string{{"net.ipv6.conf.all.disable_ipv6", "0"}, {"net.ipv6.conf." + Uplink + ".disable_ipv6", "0"}} {
		if err := sysctl(ctx, raw, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"-n", raw, "-6", "addr", "replace", rawAddr + "/64", "dev", Uplink, "nodad"},
		{"-n", raw, "-6", "route", "replace", extIP + "/128", "via", UnderlayIP6(1), "dev", Uplink},
	} {
		if err := ip(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // whoami servers listening

	lb := func() map[string]uint64 { return agentStatus(t, 1).GetControlPlane().GetLbCounters() }
	fwd := func() uint64 {
		v, err := IP6OutForwDatagrams(ctx, NodeNS(1))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	be1 := net.JoinHostPort(pods["be1"].IP6, "8080")
	be2 := net.JoinHostPort(pods["be2"].IP6, "8080")
	const n = 40
	for _, c := range []struct{ what, from, addr string }{
		{"NodePort on node 1's IPv6 address from the external host", raw, net.JoinHostPort(UnderlayIP6(1), fmt.Sprint(nodePort))},
		{"NodePort on node 1's IPv6 address from node 2's stack", NodeNS(2), net.JoinHostPort(UnderlayIP6(1), fmt.Sprint(nodePort))},
		{"IPv6 external IP (routed to node 1) from the external host", raw, net.JoinHostPort(extIP, "80")},
	} {
		t.Run(c.what, func(t *testing.T) {
			before, fwdBefore := lb(), fwd()
			got := askWhoamiFrom(t, cli, c.from, c.addr, n)
			if got[be1] == 0 || got[be2] == 0 || got[be1]+got[be2] != n {
				t.Errorf("%s: %v, want %d answers spread over %s (node 1) and %s (node 2)", c.addr, got, n, be1, be2)
			}
			after, fwdAfter := lb(), fwd()
			local, snat := after["nodeport-local"]-before["nodeport-local"], after["nodeport-snat"]-before["nodeport-snat"]
			t.Logf("node 1 LB counters: nodeport-local +%d, nodeport-snat +%d, rev-nat +%d; Ip6OutForwDatagrams +%d",
				local, snat, after["rev-nat"]-before["rev-nat"], fwdAfter-fwdBefore)
			if local+snat < n || local == 0 || snat == 0 {
				t.Errorf("node 1 NodePort counters grew by %d local + %d SNAT for %d connections; want both, %d in all", local, snat, n, n)
			}
			// Each connection is at least 5 packets through node 1 (SYN,
			// SYN-ACK, ACK, answer, FIN): none of them is the kernel's to forward.
			if d := fwdAfter - fwdBefore; d > n*5/50 {
				t.Errorf("node 1's kernel forwarded %d IPv6 datagrams during %d NodePort connections: not the BPF path", d, n)
			}
		})
	}
}

// dualStackWebLab brings up a two-node dual-stack lab (`lab up --ip-family
// dual`, torn down at cleanup) with pods be1 on node 1 and be2 on node 2
// (namespace shop, app=web, port http=8080/TCP) answering `lab tcp-whoami`
// on [::]:8080 (both families), and the extra pods. It returns the CLI
// runner, the CLI's path and the named pods.
func dualStackWebLab(t *testing.T, extra ...labPodSpec) (func(t *testing.T, args ...string) (string, error), string, map[string]NamedPod) {
	t.Helper()
	lk, cli := labCLIPath(t)
	t.Cleanup(func() {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Errorf("cleanup lab down: %v", err)
		}
	})
	if _, err := lk(t, "lab", "up", "--nodes", "2", "--pods-per-node", "1", "--ip-family", "dual"); err != nil {
		t.Fatal(err)
	}
	pods := addLabPods(t, lk, append([]labPodSpec{
		{name: "be1", ns: "shop", node: 1, labels: "app=web", ports: "http=8080/TCP"},
		{name: "be2", ns: "shop", node: 2, labels: "app=web", ports: "http=8080/TCP"},
	}, extra...))
	for _, be := range []string{"be1", "be2"} {
		srv := exec.Command("ip", "netns", "exec", NamedPodNS(be), cli, "lab", "tcp-whoami", "--listen", "[::]:8080", "--for", "3m")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	}
	return lk, cli, pods
}

// askWhoamiFrom runs `lanekit lab tcp-ask` in netns ns: n connections to
// addr, the answers counted by the backend address that gave them.
func askWhoamiFrom(t *testing.T, cli, ns, addr string, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := inNS(ctx, ns, cli, "lab", "tcp-ask", addr, "--count", fmt.Sprint(n))
	if err != nil {
		t.Fatalf("tcp-ask %s from %s: %v: %s", addr, ns, err, out)
	}
	var got map[string]int
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
		t.Fatalf("tcp-ask output %q: %v", out, err)
	}
	t.Logf("%s -> %s: %v", ns, addr, got)
	return got
}

// applyDualStackWeb applies, on both nodes' agents, the dual-stack Service
// shop/web (cluster IPs vip4 and vip6, port http 80 -> be1's and be2's
// 8080 in an IPv4 and an IPv6 EndpointSlice; nodePort when not 0) with the
// spec lines spec.
func applyDualStackWeb(t *testing.T, lk func(t *testing.T, args ...string) (string, error), pods map[string]NamedPod,
	vip4, vip6, spec string, nodePort int) {
	t.Helper()
	np := ""
	if nodePort != 0 {
		np = fmt.Sprintf(", nodePort: %d", nodePort)
	}
	objs := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: %s
  clusterIPs: [%s, "%s"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
%s
  ports: [{name: http, port: 80, targetPort: http%s}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [%s]}, {addresses: [%s]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["%s"]}, {addresses: ["%s"]}]
`, vip4, vip4, vip6, spec, np, pods["be1"].IP, pods["be2"].IP, pods["be1"].IP6, pods["be2"].IP6)
	file := writeTemp(t, "web.yaml", objs)
	for node := 1; node <= 2; node++ {
		if _, err := lk(t, "service", "apply", "-f", file, "--socket", AgentSocket(node)); err != nil {
			t.Fatal(err)
		}
	}
}
