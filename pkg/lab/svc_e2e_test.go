package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const (
	e2eVIP      = "10.96.120.10"
	e2eNodePort = 30120
)

// e2eService renders the Service and its EndpointSlice with the given
// backend IPs: TCP 80 → named target port http (8080), UDP 53 → 5353,
// NodePort for http.
func e2eService(backends ...string) string {
	var eps strings.Builder
	for _, ip := range backends {
		fmt.Fprintf(&eps, "- addresses: [%s]\n", ip)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: who, namespace: svc}
spec:
  type: NodePort
  clusterIP: %s
  ports:
  - {name: http, port: 80, targetPort: http, nodePort: %d}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30153}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: who-1, namespace: svc, labels: {kubernetes.io/service-name: who}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
%s`, e2eVIP, e2eNodePort, eps.String())
}

// spread sends count requests from each client netns to addr in parallel
// (each from a new source port) and counts the answers by backend name;
// failures count under "error".
func spread(clients []string, proto, addr string, count int) map[string]map[string]int {
	var probes []netProbe
	for _, c := range clients {
		for range count {
			probes = append(probes, netProbe{From: c, Proto: proto, Addr: addr})
		}
	}
	res := askAll(probes, 16, 2*time.Second, 3)
	out := map[string]map[string]int{}
	for i, p := range probes {
		if out[p.From] == nil {
			out[p.From] = map[string]int{}
		}
		if res[i].Err != nil {
			out[p.From]["error"]++
			continue
		}
		out[p.From][res[i].Answer]++
	}
	return out
}

// checkSpread: every answer came from want (no errors, nothing else), every
// client reached every backend, and over all clients each backend got
// between half and 1.5 times its fair share. With n requests and k backends
// a backend's share is binomial(n, 1/k): for n=240, k=3 the bounds [40, 120]
// are 5.5 standard deviations from the mean (n=90, k=2: 4.7), so a failure
// is not chance.
func checkSpread(t *testing.T, what string, got map[string]map[string]int, want []string) {
	t.Helper()
	total, perBackend := 0, map[string]int{}
	for client, answers := range got {
		for name, n := range answers {
			total += n
			perBackend[name] += n
			if !contains(want, name) {
				t.Errorf("%s: %s got %d answers from %q, want only %v", what, client, n, name, want)
			}
		}
		for _, b := range want {
			if answers[b] == 0 {
				t.Errorf("%s: %s never reached %s (%v)", what, client, b, answers)
			}
		}
	}
	fair := float64(total) / float64(len(want))
	for _, b := range want {
		if n := float64(perBackend[b]); n < fair/2 || n > fair*1.5 {
			t.Errorf("%s: %s got %d of %d answers, want within [%.0f, %.0f]", what, b, perBackend[b], total, fair/2, fair*1.5)
		}
	}
	t.Logf("%s: %d answers by backend %v (by client %v)", what, total, perBackend, got)
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func servicesE2E(t *testing.T, lk func(t *testing.T, args ...string) (string, error)) {
	pods := addLabPods(t, lk, []labPodSpec{
		{name: "be1", ns: "svc", node: 1, labels: "app=who", ports: "http=8080/TCP"},
		{name: "be2", ns: "svc", node: 2, labels: "app=who", ports: "http=8080/TCP"},
		{name: "be3", ns: "svc", node: 1, labels: "app=who", ports: "http=8080/TCP"},
		{name: "c1", ns: "svc", node: 1}, {name: "c2", ns: "svc", node: 1},
		{name: "c3", ns: "svc", node: 2}, {name: "c4", ns: "svc", node: 2},
	})
	backends := []string{"be1", "be2", "be3"}
	for _, b := range backends {
		startNameServer(t, pods[b].NS, b, []int{8080}, []int{5353})
	}
	clients := []string{NamedPodNS("c1"), NamedPodNS("c2"), NamedPodNS("c3"), NamedPodNS("c4")}
	file := writeTemp(t, "who.yaml", e2eService(pods["be1"].IP, pods["be2"].IP, pods["be3"].IP))
	if _, err := lk(t, "lab", "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	lb := func(node int) map[string]uint64 { return agentStatus(t, node).GetControlPlane().GetLbCounters() }
	delta := func(a, b map[string]uint64, keys ...string) uint64 {
		var d uint64
		for _, k := range keys {
			d += a[k] - b[k]
		}
		return d
	}

	// 1. Spread: 60 TCP connections and 60 UDP requests from each of 4
	// clients (2 per node), each from its own source port.
	lb1, lb2 := lb(1), lb(2)
	const perClient = 60
	checkSpread(t, "ClusterIP TCP", spread(clients, "tcp", fmt.Sprintf("%s:80", e2eVIP), perClient), backends)
	checkSpread(t, "ClusterIP UDP", spread(clients, "udp", fmt.Sprintf("%s:53", e2eVIP), perClient), backends)
	// The clients' own nodes load-balanced them (not the backends' nodes,
	// not the host stack): new-flow grew by at least the flows they opened.
	// A new socket may reuse the source port of an earlier flow to the same
	// frontend (a conntrack hit, not a new flow): allow 5 %.
	for node, before := range map[int]map[string]uint64{1: lb1, 2: lb2} {
		now := lb(node)
		d := delta(now, before, "new-flow")
		t.Logf("node %d: LB new-flow +%d conntrack-hit +%d rev-nat +%d for %d flows from its clients", node,
			d, delta(now, before, "conntrack-hit"), delta(now, before, "rev-nat"), 2*2*perClient)
		if d < 2*2*perClient*95/100 || d > 2*2*perClient {
			t.Errorf("node %d: LB new-flow grew by %d for %d flows from its clients", node, d, 2*2*perClient)
		}
	}

	// 2. Long-lived connections, held across a backend removal.
	var held []*heldConn
	defer func() {
		for _, h := range held {
			h.c.Close()
		}
	}()
	perBackend := map[string]int{}
	for i := 0; i < 60 && (perBackend["be1"] < 2 || perBackend["be2"] < 2 || perBackend["be3"] < 2 || len(held) < 24); i++ {
		h, err := dialHeld(clients[i%len(clients)], fmt.Sprintf("%s:80", e2eVIP))
		if err != nil {
			t.Fatalf("held connection %d: %v", i, err)
		}
		held = append(held, h)
		perBackend[h.backend]++
	}
	for _, b := range backends {
		if perBackend[b] < 2 {
			t.Fatalf("held connections by backend %v: want at least 2 on each", perBackend)
		}
	}
	for i, h := range held {
		if name, err := h.echo(fmt.Sprintf("before-%d", i)); err != nil || name != h.backend {
			t.Fatalf("held connection %d to %s before the change: echo from %q: %v", i, h.backend, name, err)
		}
	}
	const removed = "be3"
	lb1, lb2 = lb(1), lb(2)
	// Remove be3 (node 1): the EndpointSlice update every agent gets. be1
	// (node 1) and be2 (node 2) remain, so the NodePort below has a local
	// and a remote backend.
	file = writeTemp(t, "who-2.yaml", e2eService(pods["be1"].IP, pods["be2"].IP))
	if _, err := lk(t, "lab", "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	kept, moved := 0, 0
	for i, h := range held {
		name, err := h.echo(fmt.Sprintf("after-%d", i))
		if h.backend == removed {
			// Its flow is gone with the backend: the next packet is
			// re-balanced to a survivor, which knows no such connection.
			moved++
			if err == nil {
				t.Errorf("held connection %d to the removed %s still echoes (from %s)", i, removed, name)
			}
			continue
		}
		kept++
		if err != nil || name != h.backend {
			t.Errorf("held connection %d to %s after removing %s: echo from %q: %v", i, h.backend, removed, name, err)
		}
	}
	t.Logf("held connections: %d kept their backend, %d were on the removed one", kept, moved)
	// Only the removed backend's flows were re-selected (their conntrack entries named a
	// backend that is gone); the others hit conntrack.
	if d := delta(lb(1), lb1, "reselected") + delta(lb(2), lb2, "reselected"); d < uint64(moved) {
		t.Errorf("LB reselected grew by %d for %d flows of the removed backend", d, moved)
	}
	if d := delta(lb(1), lb1, "conntrack-hit") + delta(lb(2), lb2, "conntrack-hit"); d < uint64(kept) {
		t.Errorf("LB conntrack-hit grew by %d for %d kept flows", d, kept)
	}
	remaining := []string{"be1", "be2"}
	checkSpread(t, "ClusterIP TCP without "+removed, spread(clients, "tcp", fmt.Sprintf("%s:80", e2eVIP), perClient), remaining)
	checkSpread(t, "ClusterIP UDP without "+removed, spread(clients, "udp", fmt.Sprintf("%s:53", e2eVIP), perClient), remaining)
	for i, h := range held {
		if h.backend == removed {
			continue
		}
		if name, err := h.echo(fmt.Sprintf("later-%d", i)); err != nil || name != h.backend {
			t.Errorf("held connection %d to %s after new traffic: echo from %q: %v", i, h.backend, name, err)
		}
	}

	// 3. NodePort on node 1's underlay address from the other node (its host
	// stack and a pod on it) and from an external host.
	routeRawHosts(t)
	np := lb(1)
	addr := fmt.Sprintf("%s:%d", UnderlayIP(1), e2eNodePort)
	from := []string{NodeNS(2), NamedPodNS("c3"), RawNS(2)}
	got := spread(from, "tcp", addr, 30)
	checkSpread(t, "NodePort on node 1", got, remaining)
	after := lb(1)
	if d := delta(after, np, "nodeport-local", "nodeport-snat"); d < uint64(30*len(from)) {
		t.Errorf("node 1 NodePort counters grew by %d for %d connections", d, 30*len(from))
	}
	if delta(after, np, "nodeport-local") == 0 || delta(after, np, "nodeport-snat") == 0 {
		t.Errorf("node 1 NodePort: want flows to the local backend and SNATed ones to the remote backend: %v -> %v", np, after)
	}
}
