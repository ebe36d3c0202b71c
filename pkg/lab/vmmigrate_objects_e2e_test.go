package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// Services and policies that select the VM across its moves (issue 27 item
// 2): applied once before the first move, never re-applied, checked before
// and after every move.

// migrationVIP is the ClusterIP whose one backend is the lab VM.
const migrationVIP = "10.96.127.10"

// migrationObjects are a ClusterIP Service (TCP 80 -> the guest's
// responder on GuestEchoPort) whose EndpointSlice holds the VM's address, and
// a NetworkPolicy selecting the VM by kubevirt.io/domain that admits pods
// labelled role=vm-client plus the migration's pingers (the lab's first
// lanekit pod of each node, by address) and refuses everything else.
type migrationObjects struct {
	vmIP             string
	allowed, refused NamedPod // role=vm-client on node 1, role=other on node 2
}

func setupMigrationObjects(t *testing.T, ctx context.Context, bins Bins, st *State) *migrationObjects {
	t.Helper()
	vm := st.VMs[0]
	o := &migrationObjects{vmIP: vm.IP}
	for _, p := range []struct {
		name string
		node int
		role string
		into *NamedPod
	}{{"vm-client", 1, "vm-client", &o.allowed}, {"vm-other", 2, "other", &o.refused}} {
		np, err := AddPod(ctx, PodOptions{Name: p.name, Node: p.node, Labels: map[string]string{"role": p.role}, Bins: bins})
		if err != nil {
			t.Fatalf("pod %s: %v", p.name, err)
		}
		*p.into = *np
	}
	pingers := ""
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			if p.Kind == KindLanekit {
				pingers += fmt.Sprintf("    - ipBlock: {cidr: %s/32}\n", p.IP)
				break
			}
		}
	}
	yaml := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: vm-migrating, namespace: default}
spec:
  clusterIP: %[1]s
  ports:
  - {name: hello, port: 80, targetPort: %[2]d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: vm-migrating-1, namespace: default, labels: {kubernetes.io/service-name: vm-migrating}}
addressType: IPv4
ports: [{name: hello, port: %[2]d}]
endpoints:
- addresses: ["%[3]s"]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: vm-clients-only, namespace: default}
spec:
  podSelector: {matchLabels: {%[4]s: %[5]s}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: vm-client}}
%[6]s`, migrationVIP, GuestEchoPort, vm.IP, VMLabelDomain, vm.Name, pingers)
	if err := ApplyEverywhere(ctx, []byte(yaml)); err != nil {
		t.Fatalf("apply the Service and NetworkPolicy selecting the VM: %v", err)
	}
	// The agents program the datapath asynchronously: wait until the
	// refused pod is refused.
	addr := net.JoinHostPort(vm.IP, fmt.Sprint(GuestEchoPort))
	deadline := time.Now().Add(15 * time.Second)
	for guestHello(o.refused.NS, addr, 1500*time.Millisecond) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s (role=other) still reaches %s under the policy", o.refused.Name, addr)
		}
	}
	return o
}

// check asserts, with the VM on node vmNode: the ClusterIP answers a pod on
// the other node with the guest's greeting, that node's BPF load balancer
// took a new flow per connection and the VM's endpoint on vmNode received
// them; the pod labelled role=vm-client reaches the guest, the role=other
// pod does not and vmNode's VM endpoint counts its SYNs as policy-ingress
// drops.
func (o *migrationObjects) check(t *testing.T, vmNode int) {
	t.Helper()
	other := 3 - vmNode
	client := PodNS(other, 1, KindLanekit)
	lbNew := func() uint64 { return agentStatus(t, other).GetControlPlane().GetLbCounters()["new-flow"] }
	vmTo := func() uint64 { return endpointCounters(t, vmNode)[o.vmIP].GetToPackets() }
	drops := func() uint64 { return endpointCounters(t, vmNode)[o.vmIP].GetDrops()["policy-ingress"] }

	lb0, to0 := lbNew(), vmTo()
	const n = 3
	vip := net.JoinHostPort(migrationVIP, "80")
	for i := range n {
		if err := guestHello(client, vip, 5*time.Second); err != nil {
			t.Errorf("service: %s -> %s (connection %d): %v", client, vip, i, err)
		}
	}
	lb, to := since(lbNew(), lb0), since(vmTo(), to0)
	t.Logf("service %s from %s: node %d LB new-flow +%d, vm endpoint on node %d +%d packets", vip, client, other, lb, vmNode, to)
	if lb < n {
		t.Errorf("service: node %d's load balancer took %d new flows for %d connections to %s", other, lb, n, vip)
	}
	if to < 2*n {
		t.Errorf("service: the VM's endpoint on node %d received %d packets for %d connections", vmNode, to, n)
	}

	addr := net.JoinHostPort(o.vmIP, fmt.Sprint(GuestEchoPort))
	if err := guestHello(o.allowed.NS, addr, 5*time.Second); err != nil {
		t.Errorf("policy: %s (role=vm-client, node %d) -> %s: %v", o.allowed.Name, o.allowed.Node, addr, err)
	}
	d0 := drops()
	refusedErr := guestHello(o.refused.NS, addr, 1500*time.Millisecond)
	if refusedErr == nil {
		t.Errorf("policy: %s (role=other, node %d) reaches %s on node %d", o.refused.Name, o.refused.Node, addr, vmNode)
	}
	d := since(drops(), d0)
	t.Logf("policy: %s -> %s: %v; vm endpoint on node %d policy-ingress drops +%d", o.refused.Name, addr, refusedErr, vmNode, d)
	if d < 1 {
		t.Errorf("policy: the VM's endpoint on node %d counted no policy-ingress drop for %s", vmNode, o.refused.Name)
	}
}

// guestHello connects from netns ns to addr and reads the lab guest's
// greeting (its responder on GuestEchoPort), within timeout.
func guestHello(ns, addr string, timeout time.Duration) error {
	var conn net.Conn
	err := inNetns(ns, func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		conn = c
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if !strings.HasPrefix(line, "LK-HELLO") {
		return fmt.Errorf("greeting %q, want LK-HELLO", line)
	}
	return nil
}
