package lab

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// TestLabHostPortForeignHostIP: from the attacker's side. In a dual-stack
// lab, pod evil/attacker on node 1 declares hostPorts whose hostIP is not
// node 1's: the address (IPv4 and IPv6) of be1, a pod beside it, of be2, a
// pod on node 2, and 169.254.169.254, each on the port those pods serve. Its
// node's agent programs none of them (the frontends it holds), so a pod on
// node 1 connecting to be1 and be2 reaches them, not the attacker, and node
// 1's load balancer translates none of those connections (its new-flow
// counter). The attacker's hostPort on node 1's own addresses still works:
// node 2's stack reaches it there, through node 1's NodePort path. Root;
// brings up the global lab.
func TestLabHostPortForeignHostIP(t *testing.T) {
	_, cli, pods := dualStackWebLab(t,
		labPodSpec{name: "attacker", ns: "evil", node: 1, ports: "http=8080/TCP"},
		labPodSpec{name: "client", ns: "shop", node: 1})
	att := pods["attacker"]
	srv := exec.Command("ip", "netns", "exec", NamedPodNS("attacker"), cli, "lab", "tcp-whoami", "--listen", "[::]:8080", "--for", "3m")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })

	const nodePort = 18080
	foreign := []string{pods["be1"].IP, pods["be1"].IP6, pods["be2"].IP, pods["be2"].IP6, "169.254.169.254"}
	var ports []string
	for _, ip := range foreign {
		ports = append(ports, fmt.Sprintf(`{containerPort: 8080, hostPort: 8080, hostIP: "%s"}`, ip))
	}
	for _, ip := range []string{UnderlayIP(1), UnderlayIP6(1)} {
		ports = append(ports, fmt.Sprintf(`{containerPort: 8080, hostPort: %d, hostIP: "%s"}`, nodePort, ip))
	}
	// The attacker's own Pod object, as its owner may write it.
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: attacker, namespace: evil}
spec:
  nodeName: %s
  containers:
  - name: app
    image: lab
    ports: [%s]
status:
  phase: Running
  podIP: %s
  podIPs: [{ip: %s}, {ip: "%s"}]
`, NodeNS(1), strings.Join(ports, ", "), att.IP, att.IP, att.IP6)
	// Node 1's agent gets it as from the API server's Pod watcher (the lab
	// applies its Pod objects so; `service apply` takes Services only).
	callAgent(t, AgentSocket(1), "apply the attacker's pod", func(ctx context.Context, c apiv1.AgentClient) (*apiv1.ApplyObjectsResponse, error) {
		return c.ApplyObjects(ctx, &apiv1.ApplyObjectsRequest{Data: []byte(pod)})
	})
	time.Sleep(300 * time.Millisecond) // whoami servers listening

	// The agent's frontends: none on a foreign address, both on node 1's.
	fes := callAgent(t, AgentSocket(1), "list services", func(ctx context.Context, c apiv1.AgentClient) ([]*apiv1.ServiceFrontend, error) {
		resp, err := c.ListServices(ctx, &apiv1.ListServicesRequest{})
		return resp.GetFrontends(), err
	})
	own := 0
	for _, f := range fes {
		for _, ip := range foreign {
			if f.GetAddress() == ip {
				t.Errorf("node 1 programs a frontend on %s (another's address): %s/%s -> %v", ip, f.GetNamespace(), f.GetName(), f.GetBackends())
			}
		}
		if f.GetName() == "hostport/attacker" && f.GetPort() == nodePort {
			own++
		}
	}
	if own != 2 {
		t.Errorf("node 1 programs %d hostPort frontends on its own addresses, want 2 (IPv4 and IPv6)", own)
	}

	newFlows := func() uint64 { return agentStatus(t, 1).GetControlPlane().GetLbCounters()["new-flow"] }
	attacker := []string{net.JoinHostPort(att.IP, "8080"), net.JoinHostPort(att.IP6, "8080")}
	const n = 5
	for _, c := range []struct{ what, addr string }{
		{"be1 (beside the attacker) over IPv4", net.JoinHostPort(pods["be1"].IP, "8080")},
		{"be1 over IPv6", net.JoinHostPort(pods["be1"].IP6, "8080")},
		{"be2 (node 2) over IPv4", net.JoinHostPort(pods["be2"].IP, "8080")},
		{"be2 over IPv6", net.JoinHostPort(pods["be2"].IP6, "8080")},
	} {
		t.Run(c.what, func(t *testing.T) {
			before := newFlows()
			got := askWhoamiFrom(t, cli, NamedPodNS("client"), c.addr, n)
			if got[c.addr] != n {
				t.Errorf("client -> %s: answers %v, want all %d from %s (the attacker is %v)", c.addr, got, n, c.addr, attacker)
			}
			if d := newFlows() - before; d != 0 {
				t.Errorf("node 1's load balancer translated %d new flows to %s: a frontend captured them", d, c.addr)
			}
		})
	}
	for _, addr := range []string{net.JoinHostPort(UnderlayIP(1), fmt.Sprint(nodePort)), net.JoinHostPort(UnderlayIP6(1), fmt.Sprint(nodePort))} {
		t.Run("hostPort on node 1's "+addr, func(t *testing.T) {
			got := askWhoamiFrom(t, cli, NodeNS(2), addr, n)
			if got[attacker[0]]+got[attacker[1]] != n {
				t.Errorf("node 2 -> %s: answers %v, want all %d from the attacker %v", addr, got, n, attacker)
			}
		})
	}
}
