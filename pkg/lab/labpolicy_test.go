package lab

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// TestLabPolicy: a NetworkPolicy on node 1 lets only pods labelled
// role=client (on node 2: a remote identity known from the Pod objects `lab
// pod add` pushed) reach app=web pods on the named port; another pod on node
// 2 is dropped, with the policy's verdict counters and the endpoint's policy
// drop reason saying so. Skips while the datapath has no policy.
func TestLabPolicy(t *testing.T) {
	lk, cli := upLabCLI(t)
	if !agentStatus(t, 1).GetControlPlane().GetPolicyDatapath() {
		t.Skip("the datapath has no network policy (PolicyDatapath) yet")
	}
	for _, p := range [][]string{{"web", "1", "app=web"}, {"client", "2", "role=client"}, {"other", "2", "role=other"}} {
		if _, err := lk(t, "lab", "pod", "add", p[0], "--node", p[1], "--namespace", "shop", "--labels", p[2], "--port", "http=8080/TCP"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := LoadState()
	if err != nil {
		t.Fatal(err)
	}
	web := st.NamedPods[0].IP
	webFromClientsPolicy(t, lk, cli)
	ask := func(from string) map[string]int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := inNS(ctx, NamedPodNS(from), cli, "lab", "tcp-ask", web+":8080", "--count", "3", "--timeout", "1s")
		if err != nil {
			t.Fatalf("tcp-ask from %s: %v: %s", from, err, out)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s -> web: %v", from, got)
		return got
	}
	if got := ask("client"); got[web+":8080"] != 3 {
		t.Errorf("client -> web:8080 = %v, want 3 answers", got)
	}
	if got := ask("other"); got[web+":8080"] != 0 {
		t.Errorf("other -> web:8080 = %v, want none", got)
	}
	c, closeFn, err := agentClient(AgentSocket(1))
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	resp, err := c.ListPolicies(context.Background(), &apiv1.ListPoliciesRequest{})
	if err != nil || len(resp.GetPolicies()) != 1 {
		t.Fatalf("list policies: %v %v", resp, err)
	}
	if p := resp.GetPolicies()[0]; p.GetAllowedPackets() == 0 || p.GetDeniedPackets() == 0 {
		t.Errorf("policy verdicts on node 1: %+v", p)
	}
	out, err := lk(t, "endpoint", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, "policy-ingress=") {
		t.Errorf("endpoint list on node 1 shows no policy drops: %v: %s", err, out)
	}
	out, err = lk(t, "policy", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, "shop/web-from-clients") {
		t.Errorf("policy list = %v: %s", err, out)
	}
}

// webFromClientsPolicy starts a TCP whoami server on :8080 in the named pod
// "web" and applies, on both nodes' agents, a NetworkPolicy in namespace shop
// that admits only role=client pods to app=web on the port named http.
func webFromClientsPolicy(t *testing.T, lk func(t *testing.T, args ...string) (string, error), cli string) {
	t.Helper()
	srv := exec.Command("ip", "netns", "exec", NamedPodNS("web"), cli, "lab", "tcp-whoami", "--listen", "0.0.0.0:8080", "--for", "3m")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	pol := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: http}]
`
	file := filepath.Join(t.TempDir(), "pol.yaml")
	if err := os.WriteFile(file, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	for node := 1; node <= 2; node++ {
		if _, err := lk(t, "policy", "apply", "-f", file, "--socket", AgentSocket(node)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
}
