package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// webFromClientsPolicy starts a TCP whoami server on :8080 in the named pod
// "web" and applies, on both nodes' agents, a NetworkPolicy in namespace shop
// that admits only role=client pods to app=web on the port named http.
func webFromClientsPolicy(t *testing.T, lk func(t *testing.T, args ...string) (string, error), cli string) {
	t.Helper()
	webPolicies(t, lk, cli, []string{"0.0.0.0:8080"}, "")
}

// webPolicies starts a TCP whoami server on each of listen in the named pod
// "web" and applies, on both nodes' agents, web-from-clients (the policy of
// webFromClientsPolicy) and the NetworkPolicy documents of extra.
func webPolicies(t *testing.T, lk func(t *testing.T, args ...string) (string, error), cli string, listen []string, extra string) {
	t.Helper()
	for _, l := range listen {
		srv := exec.Command("ip", "netns", "exec", NamedPodNS("web"), cli, "lab", "tcp-whoami", "--listen", l, "--for", "3m")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	}
	pol := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: http}]
`
	if extra != "" {
		pol += "---\n" + extra
	}
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
