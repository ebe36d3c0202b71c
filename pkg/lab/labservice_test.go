package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// TestLabServices: pods on two nodes reach a ClusterIP service whose
// backends are on both nodes, new connections spread over both backends, and
// a NodePort answers from the other node. The path is asserted with the
// datapath's LB counters (new flows, NodePort), not only connectivity. Skips
// while the datapath has no service load balancing.
func TestLabServices(t *testing.T) {
	lk, cli := upLabCLI(t)
	if !agentStatus(t, 1).GetControlPlane().GetServiceDatapath() {
		t.Skip("the datapath has no service load balancing (ServiceDatapath) yet")
	}
	for _, p := range [][]string{
		{"be1", "1", "app=web"}, {"be2", "2", "app=web"}, {"client1", "1", "role=client"}, {"client2", "2", "role=client"},
	} {
		if _, err := lk(t, "lab", "pod", "add", p[0], "--node", p[1], "--namespace", "shop", "--labels", p[2], "--port", "http=8080/TCP"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{}
	for _, p := range st.NamedPods {
		ips[p.Name] = p.IP
	}
	for _, be := range []string{"be1", "be2"} {
		srv := exec.Command("ip", "netns", "exec", NamedPodNS(be), cli, "lab", "tcp-whoami", "--listen", "0.0.0.0:8080", "--for", "3m")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	}
	objs := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.100.10
  ports: [{name: http, port: 80, targetPort: http, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [%s]
- addresses: [%s]
`, ips["be1"], ips["be2"])
	file := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(file, []byte(objs), 0o644); err != nil {
		t.Fatal(err)
	}
	// A short-lived service first takes node 1's first frontend ID, so that
	// re-adopted IDs after the agent restart below differ from freshly
	// allocated ones.
	tmp := filepath.Join(t.TempDir(), "tmp.yaml")
	if err := os.WriteFile(tmp, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: tmp, namespace: shop}\nspec: {clusterIP: 10.96.100.99, ports: [{port: 1}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := lk(t, "service", "apply", "-f", tmp, "--socket", AgentSocket(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := lk(t, "service", "delete", "shop/tmp", "--socket", AgentSocket(1)); err != nil {
		t.Fatal(err)
	}
	for node := 1; node <= 2; node++ {
		if _, err := lk(t, "service", "apply", "-f", file, "--socket", AgentSocket(node)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // whoami servers listening
	ask := func(t *testing.T, from, addr string, n int) map[string]int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := inNS(ctx, NamedPodNS(from), cli, "lab", "tcp-ask", addr, "--count", fmt.Sprint(n))
		if err != nil {
			t.Fatalf("tcp-ask %s from %s: %v: %s", addr, from, err, out)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
			t.Fatalf("tcp-ask output %q: %v", out, err)
		}
		t.Logf("%s -> %s: %v", from, addr, got)
		return got
	}
	lb := func(node int) map[string]uint64 { return agentStatus(t, node).GetControlPlane().GetLbCounters() }
	before := lb(1)
	const n = 40
	for _, client := range []string{"client1", "client2"} {
		got := ask(t, client, "10.96.100.10:80", n)
		if got[ips["be1"]+":8080"] == 0 || got[ips["be2"]+":8080"] == 0 || got[ips["be1"]+":8080"]+got[ips["be2"]+":8080"] != n {
			t.Errorf("%s -> ClusterIP: %v, want %d answers spread over %s and %s", client, got, n, ips["be1"], ips["be2"])
		}
	}
	if after := lb(1); after["new-flow"]-before["new-flow"] < n {
		t.Errorf("node 1 LB new-flow counter grew by %d for %d connections", after["new-flow"]-before["new-flow"], n)
	}
	// Agent restart on node 1: the frontend and backend IDs come back from
	// the pinned maps (DumpServices), not from a fresh allocation, and the
	// service keeps answering.
	ids := func() map[string]uint32 {
		c, closeFn, err := agentClient(AgentSocket(1))
		if err != nil {
			t.Fatal(err)
		}
		defer closeFn()
		resp, err := c.ListServices(context.Background(), &apiv1.ListServicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, f := range resp.GetFrontends() {
			out[fmt.Sprintf("%s:%d/%s", f.GetAddress(), f.GetPort(), f.GetProtocol())] = f.GetFrontendId()
		}
		return out
	}
	idsBefore := ids()
	if pid := st.Nodes[0].AgentPID; pid > 0 {
		terminate(pid, 3*time.Second)
	}
	if _, err := startAgent(context.Background(), testBins(t), 1, false); err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	if got := ids(); fmt.Sprint(got) != fmt.Sprint(idsBefore) || len(got) != 2 {
		t.Errorf("frontend IDs after restart %v, before %v", got, idsBefore)
	}
	if got := ask(t, "client1", "10.96.100.10:80", 10); got[ips["be1"]+":8080"]+got[ips["be2"]+":8080"] != 10 {
		t.Errorf("client1 -> ClusterIP after agent restart: %v", got)
	}
	// NodePort on node 2's address from a pod on node 1.
	np := lb(2)
	got := ask(t, "client1", UnderlayIP(2)+":30080", 10)
	if got[ips["be1"]+":8080"]+got[ips["be2"]+":8080"] != 10 {
		t.Errorf("client1 -> node 2 NodePort: %v", got)
	}
	after := lb(2)
	if d := (after["nodeport-local"] + after["nodeport-snat"]) - (np["nodeport-local"] + np["nodeport-snat"]); d < 10 {
		t.Errorf("node 2 NodePort counters grew by %d for 10 connections (%v -> %v)", d, np, after)
	}
	// Service delete: the VIP stops answering.
	for node := 1; node <= 2; node++ {
		if _, err := lk(t, "service", "delete", "shop/web", "--socket", AgentSocket(node)); err != nil {
			t.Fatal(err)
		}
	}
	if got := ask(t, "client1", "10.96.100.10:80", 2); got[ips["be1"]+":8080"]+got[ips["be2"]+":8080"] != 0 {
		t.Errorf("deleted service still answers: %v", got)
	}
}
