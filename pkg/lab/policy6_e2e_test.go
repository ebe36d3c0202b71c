package lab

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestDualStackLabPolicy: NetworkPolicy over both families in a dual-stack
// lab (`lab up --ip-family dual`), through the agents (`lab pod add` pushes
// Pod objects with both addresses, `policy apply`). web on node 1 admits
// role=client pods on its named port http (8080) and the IPv6 block of node
// 2's pod CIDR except the client's own address on 9090. A truth table of
// TCP connections from node 2 over IPv4 and IPv6, then the counters: web's
// endpoint counted the denied connections as policy-ingress drops (and none
// as the retired policy-ipv6-unenforced), each policy counted what it
// allowed, and the CLI's endpoint and policy lists show it (what the IPv4-only
// TestLabPolicy checked, on this lab's IPv4 rows). Root; brings up the global
// lab.
func TestDualStackLabPolicy(t *testing.T) {
	lk, cli := labCLIPath(t)
	t.Cleanup(func() {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Errorf("cleanup lab down: %v", err)
		}
	})
	if _, err := lk(t, "lab", "up", "--nodes", "2", "--pods-per-node", "1", "--ip-family", "dual"); err != nil {
		t.Fatal(err)
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
	pods := map[string]NamedPod{}
	for _, p := range st.NamedPods {
		if p.IP6 == "" {
			t.Fatalf("pod %s has no IPv6 address in a dual-stack lab", p.Name)
		}
		pods[p.Name] = p
	}
	var cidr6 string
	for _, n := range st.Nodes {
		if n.Index == 2 {
			cidr6 = n.PodCIDR6
		}
	}
	if cidr6 == "" {
		t.Fatal("node 2 has no IPv6 pod CIDR")
	}
	web := pods["web"]
	// web-from-clients (labpolicy_test.go) and an IPv6 ipBlock with an except.
	webPolicies(t, lk, cli, []string{"[::]:8080", "[::]:9090"}, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-node2-v6, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: "`+cidr6+`", except: ["`+pods["client"].IP6+`/128"]}}]
    ports: [{port: 9090}]
`)
	webIP4 := netip.MustParseAddr(web.IP)
	_, before, err := datapath.PinnedCounters(BPFDir(1), webIP4)
	if err != nil {
		t.Fatal(err)
	}

	const n = 3 // connection attempts per row
	denied := 0
	for _, c := range []struct {
		from, family, port string
		allowed            bool
	}{
		{"client", "ipv6", "8080", true},  // identity, named port
		{"other", "ipv6", "8080", false},  // another identity
		{"client", "ipv4", "8080", true},  // the same identity over IPv4
		{"other", "ipv4", "8080", false},  //
		{"other", "ipv6", "9090", true},   // in the IPv6 ipBlock
		{"client", "ipv6", "9090", false}, // its except
		{"other", "ipv4", "9090", false},  // an IPv6 block admits no IPv4
	} {
		addr := net.JoinHostPort(web.IP, c.port)
		if c.family == "ipv6" {
			addr = net.JoinHostPort(web.IP6, c.port)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := inNS(ctx, NamedPodNS(c.from), cli, "lab", "tcp-ask", addr, "--count", "3", "--timeout", "1s")
		cancel()
		if err != nil {
			t.Fatalf("tcp-ask %s from %s: %v: %s", addr, c.from, err, out)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
			t.Fatal(err)
		}
		answers := 0
		for k, v := range got {
			if !strings.HasPrefix(k, "error: ") {
				answers += v
			}
		}
		t.Logf("%s -> web %s: %v", c.from, addr, got)
		switch {
		case c.allowed && answers != n:
			t.Errorf("%s -> %s (%s): %d of %d answered, want all", c.from, addr, c.family, answers, n)
		case !c.allowed && answers != 0:
			t.Errorf("%s -> %s (%s): %d answered, want none", c.from, addr, c.family, answers)
		}
		if !c.allowed {
			denied++
		}
	}

	_, after, err := datapath.PinnedCounters(BPFDir(1), webIP4)
	if err != nil {
		t.Fatal(err)
	}
	drops := after.Drops[datapath.DropPolicyIngress] - before.Drops[datapath.DropPolicyIngress]
	t.Logf("web's policy-ingress drops: %d (%d denied connection attempts; SYN retransmissions count too)", drops, denied*n)
	if drops < uint64(denied*n) {
		t.Errorf("web counted %d policy-ingress drops, want at least %d (one SYN per denied connection)", drops, denied*n)
	}
	if d := after.Drops[datapath.DropPolicyIPv6]; d != 0 {
		t.Errorf("web counted %d policy-ipv6-unenforced drops: IPv6 was refused, not judged", d)
	}
	c, closeFn, err := agentClient(AgentSocket(1))
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	resp, err := c.ListPolicies(context.Background(), &apiv1.ListPoliciesRequest{})
	if err != nil || len(resp.GetPolicies()) != 2 {
		t.Fatalf("list policies: %v %v", resp, err)
	}
	for _, p := range resp.GetPolicies() {
		t.Logf("policy %s/%s: allowed %d, denied %d", p.GetNamespace(), p.GetName(), p.GetAllowedPackets(), p.GetDeniedPackets())
		if p.GetAllowedPackets() < 3 {
			t.Errorf("policy %s allowed %d connections on node 1, want at least 3", p.GetName(), p.GetAllowedPackets())
		}
		if p.GetName() == "web-from-clients" && p.GetDeniedPackets() < uint64(denied*n) {
			t.Errorf("web-from-clients (the first isolating policy) denied %d packets, want at least %d", p.GetDeniedPackets(), denied*n)
		}
	}
	// What an operator sees of it through the CLI.
	out, err := lk(t, "endpoint", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, "policy-ingress=") {
		t.Errorf("endpoint list on node 1 shows no policy drops: %v: %s", err, out)
	}
	out, err = lk(t, "policy", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, "shop/web-from-clients") || !strings.Contains(out, "shop/web-from-node2-v6") {
		t.Errorf("policy list = %v: %s", err, out)
	}
}
