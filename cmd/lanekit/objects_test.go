package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

const cliServices = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: http, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.79.0.2]
- addresses: [10.79.1.2]
  conditions: {ready: false, serving: true, terminating: true}
`

const cliPolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: shop}
spec: {podSelector: {}}
`

// TestObjectCommands drives `lanekit service|policy apply|list|delete`
// against an in-process agent with the memory datapath.
func TestObjectCommands(t *testing.T) {
	testutil.RequireRoot(t)
	node := netnstest.New(t, "cliobj")
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	dp := agenttest.NewMemoryDatapath()
	dp.SetPolicyVerdict(0, datapath.PolicyVerdict{Allowed: 0, Denied: 7})
	a, err := agent.New(agent.Config{
		StateDir: dir, Socket: sock, PodCIDR: netip.MustParsePrefix("10.79.0.0/24"), MTU: 1500,
		NodeAddrs:    []netip.Addr{netip.MustParseAddr("192.168.99.1")},
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil }, HostNetns: node.Path(),
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket did not appear")
		}
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	out, err := runCLI(t, "service", "apply", "-f", write("svc.yaml", cliServices), "--socket", sock)
	if err != nil || !strings.Contains(out, "applied Service shop/web") || !strings.Contains(out, "applied EndpointSlice shop/web-1") {
		t.Fatalf("service apply = %v: %s", err, out)
	}
	out, err = runCLI(t, "service", "list", "--json=true", "--socket", sock)
	var list struct {
		Frontends []struct {
			Namespace, Name, Address, Scope, Protocol string
			Port, MaglevSize, EligibleBackends        uint32
			FrontendID                                uint32 `json:"frontend_id"`
			Affinity                                  uint32 `json:"affinity_timeout_seconds"`
			Backends                                  []struct {
				Address, State string
				Port           uint32
			}
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Frontends) != 2 {
		t.Fatalf("service list --json = %v: %s", err, out)
	}
	f := list.Frontends[0]
	if f.Address != "10.96.0.10" || f.Port != 80 || f.Scope != "ClusterIP" || f.FrontendID == 0 || f.Affinity != 10800 ||
		len(f.Backends) != 2 || f.Backends[1].State != "terminating" || f.Backends[0].Port != 8080 {
		t.Errorf("cluster IP frontend = %+v", f)
	}
	if n := list.Frontends[1]; n.Address != "192.168.99.1" || n.Port != 30080 || n.Scope != "NodePort" {
		t.Errorf("node port frontend = %+v", n)
	}
	if !strings.Contains(out, `"maglev_size": 251`) || !strings.Contains(out, `"eligible_backends": 1`) {
		t.Errorf("maglev size / eligible backends missing: %s", out)
	}
	out, err = runCLI(t, "service", "list", "--json=false", "--socket", sock)
	if err != nil || !strings.Contains(out, "shop/web") || !strings.Contains(out, "10.79.1.2:8080(terminating)") || !strings.Contains(out, "ClientIP/10800s") {
		t.Fatalf("service list = %v: %s", err, out)
	}

	// Invalid files: the error names the document, object and field, and
	// nothing of the file is applied.
	bad := write("bad.yaml", cliPolicy+"---\n"+strings.Replace(cliServices, "10.96.0.10", "10.96.0.300", 1))
	if _, err := runCLI(t, "policy", "apply", "-f", bad, "--socket", sock); err == nil ||
		!strings.Contains(err.Error(), "document 1 (Service shop/web)") || !strings.Contains(err.Error(), "spec.clusterIP") {
		t.Errorf("apply of an invalid file = %v", err)
	}
	unknown := write("deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")
	if _, err := runCLI(t, "policy", "apply", "-f", unknown, "--socket", sock); err == nil || !strings.Contains(err.Error(), `kind "Deployment" is not supported`) {
		t.Errorf("apply of an unknown kind = %v", err)
	}
	if _, err := runCLI(t, "service", "apply", "-f", write("pol.yaml", cliPolicy), "--socket", sock); err == nil ||
		!strings.Contains(err.Error(), "NetworkPolicy shop/deny-all): this command applies Service, EndpointSlice objects") {
		t.Errorf("service apply of a policy = %v", err)
	}
	// The agent rejects what only the full set shows: a second service on
	// the same frontend.
	clash := write("clash.yaml", strings.Replace(strings.Split(cliServices, "---")[0], "name: web,", "name: web2,", 1))
	if _, err := runCLI(t, "service", "apply", "-f", clash, "--socket", sock); err == nil ||
		!strings.Contains(err.Error(), "invalid:") || !strings.Contains(err.Error(), "already belongs to service shop/web") {
		t.Errorf("apply of a clashing service = %v", err)
	}

	rootCmd.SetIn(strings.NewReader(cliPolicy))
	out, err = runCLI(t, "policy", "apply", "-f", "-", "--socket", sock)
	rootCmd.SetIn(nil)
	if err != nil || !strings.Contains(out, "applied NetworkPolicy shop/deny-all") {
		t.Fatalf("policy apply from stdin = %v: %s", err, out)
	}
	out, err = runCLI(t, "policy", "list", "--json=false", "--socket", sock)
	if err != nil || !strings.Contains(out, "shop/deny-all") || !strings.Contains(out, "Ingress") || !strings.Contains(out, "7") {
		t.Fatalf("policy list = %v: %s", err, out)
	}
	out, err = runCLI(t, "policy", "list", "--json=true", "--socket", sock)
	if err != nil || !strings.Contains(out, `"denied_packets": "7"`) || !strings.Contains(out, `"allowed_packets": "0"`) {
		t.Fatalf("policy list --json = %v: %s", err, out)
	}

	if out, err = runCLI(t, "service", "delete", "shop/web", "--socket", sock); err != nil || !strings.Contains(out, "deleted Service shop/web") {
		t.Fatalf("service delete = %v: %s", err, out)
	}
	if out, err = runCLI(t, "service", "delete", "shop/web", "--socket", sock); err != nil || !strings.Contains(out, "no Service shop/web") {
		t.Fatalf("second service delete = %v: %s", err, out)
	}
	if out, err = runCLI(t, "policy", "delete", "shop/deny-all", "--socket", sock); err != nil || !strings.Contains(out, "deleted NetworkPolicy shop/deny-all") {
		t.Fatalf("policy delete = %v: %s", err, out)
	}
	out, err = runCLI(t, "service", "list", "--json=true", "--socket", sock)
	if err != nil || !strings.Contains(out, `"frontends": []`) {
		t.Fatalf("service list after delete = %v: %s", err, out)
	}

	// Agent down.
	cancel()
	<-done
	done <- nil
	if _, err := runCLI(t, "service", "list", "--socket", sock); err == nil || !strings.Contains(err.Error(), "agent not reachable") {
		t.Errorf("service list with the agent down = %v", err)
	}
}
