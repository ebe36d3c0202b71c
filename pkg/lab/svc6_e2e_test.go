package lab

import (
	"net"
	"testing"
	"time"
)

// TestDualStackLabServices: in a dual-stack lab (`lab up --ip-family dual`),
// pods on both nodes reach the IPv6 ClusterIP of a dual-stack Service whose
// backends are on both nodes (an IPv4 and an IPv6 EndpointSlice): new
// connections spread over both backends, which answer from their IPv6
// addresses, and the client node's LB counters account for every
// connection (new flows) and its replies (rev-NAT). The IPv4 ClusterIP of
// the same Service keeps working. Root; brings up the global lab.
func TestDualStackLabServices(t *testing.T) {
	lk, cli, pods := dualStackWebLab(t,
		labPodSpec{name: "client1", ns: "shop", node: 1, labels: "role=client", ports: "http=8080/TCP"},
		labPodSpec{name: "client2", ns: "shop", node: 2, labels: "role=client", ports: "http=8080/TCP"})
	const vip4, vip6 = "10.96.100.20", "fd00:96::20"
	applyDualStackWeb(t, lk, pods, vip4, vip6, "", 0)
	time.Sleep(300 * time.Millisecond) // whoami servers listening
	lb := func(node int) map[string]uint64 { return agentStatus(t, node).GetControlPlane().GetLbCounters() }
	const n = 40
	be1 := net.JoinHostPort(pods["be1"].IP6, "8080")
	be2 := net.JoinHostPort(pods["be2"].IP6, "8080")
	for node, client := range map[int]string{1: "client1", 2: "client2"} {
		before := lb(node)
		got := askWhoamiFrom(t, cli, NamedPodNS(client), net.JoinHostPort(vip6, "80"), n)
		if got[be1] == 0 || got[be2] == 0 || got[be1]+got[be2] != n {
			t.Errorf("%s -> [%s]:80: %v, want %d answers spread over %s and %s", client, vip6, got, n, be1, be2)
		}
		after := lb(node)
		t.Logf("node %d LB counters: new-flow +%d, rev-nat +%d", node, after["new-flow"]-before["new-flow"], after["rev-nat"]-before["rev-nat"])
		if d := after["new-flow"] - before["new-flow"]; d < n {
			t.Errorf("node %d: LB new-flow counter grew by %d for %d connections to the IPv6 ClusterIP", node, d, n)
		}
		if d := after["rev-nat"] - before["rev-nat"]; d < n {
			t.Errorf("node %d: LB rev-nat counter grew by %d for %d connections' replies", node, d, n)
		}
	}
	got := askWhoamiFrom(t, cli, NamedPodNS("client1"), vip4+":80", n)
	if got[pods["be1"].IP+":8080"]+got[pods["be2"].IP+":8080"] != n {
		t.Errorf("client1 -> %s:80 (IPv4 ClusterIP of the same Service): %v, want %d answers from the IPv4 backends", vip4, got, n)
	}
}
