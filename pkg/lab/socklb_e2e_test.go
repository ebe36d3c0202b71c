package lab

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/socktest"
)

// TestLabSockLB: the node itself and hostNetwork pods reach Services through
// the socket load balancer. A "host process" in lk-node1's netns and in its
// cgroup (NodeCgroup, where `lab up` attached the agent's cgroup programs;
// the agent itself runs there too) reaches a ClusterIP over TCP, UDP and
// connected UDP, TCP from an IPv6 socket (IPv4-mapped), and the NodePort on
// its node's address and on loopback:
// both backends (a pod on each node) answer, the client sees the service
// address (getpeername, recvfrom), and node 1's socket LB counters account
// for every call. The test process itself (same netns, not in the cgroup)
// is not translated. `lab down` removes the node cgroups.
func TestLabSockLB(t *testing.T) {
	// Registered first, so it runs after upLabCLI's lab down.
	t.Cleanup(func() {
		if _, err := os.Stat(LabCgroup); err == nil {
			t.Errorf("lab down left %s", LabCgroup)
		}
	})
	lk, _ := upLabCLI(t)
	pods := addLabPods(t, lk, []labPodSpec{
		{name: "be1", ns: "svc", node: 1, labels: "app=who", ports: "http=8080/TCP"},
		{name: "be2", ns: "svc", node: 2, labels: "app=who", ports: "http=8080/TCP"},
	})
	for _, b := range []string{"be1", "be2"} {
		startNameServer(t, pods[b].NS, b, []int{8080}, []int{5353})
	}
	file := writeTemp(t, "who.yaml", e2eService(pods["be1"].IP, pods["be2"].IP))
	if _, err := lk(t, "lab", "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	counters := func() map[string]uint64 { return agentStatus(t, 1).GetControlPlane().GetLbCounters() }

	const n = 16
	vip := e2eVIP
	cases := []struct {
		what, op, peer string
		fwd, rev       string
	}{
		{"ClusterIP TCP", "tcp " + vip + ":80", vip + ":80", "connect4", "getpeername4"},
		{"ClusterIP UDP", "udp " + vip + ":53", vip + ":53", "sendmsg4", "recvmsg4"},
		{"ClusterIP connected UDP", "udpc " + vip + ":53", vip + ":53", "connect4", "getpeername4"},
		{"ClusterIP TCP from an IPv6 socket (v4-mapped)", "tcp6m " + vip + ":80", vip + ":80", "connect6", "getpeername6"},
		{"NodePort on the node address", fmt.Sprintf("tcp %s:%d", UnderlayIP(1), e2eNodePort), fmt.Sprintf("%s:%d", UnderlayIP(1), e2eNodePort), "connect4", "getpeername4"},
		{"NodePort on loopback", fmt.Sprintf("tcp 127.0.0.1:%d", e2eNodePort), fmt.Sprintf("127.0.0.1:%d", e2eNodePort), "connect4", "getpeername4"},
	}
	for _, c := range cases {
		ops := make([]string, n)
		for i := range ops {
			ops[i] = c.op
		}
		before := counters()
		lines, err := socktest.Run(netnsPath(NodeNS(1)), NodeCgroup(1), ops...)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, line := range lines {
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "ok" {
				t.Errorf("%s: %q, want an answer", c.what, line)
				continue
			}
			seen[f[1]]++
			if f[2] != c.peer {
				t.Errorf("%s: the client sees %s, want the service address %s", c.what, f[2], c.peer)
			}
		}
		if seen["be1"] == 0 || seen["be2"] == 0 {
			t.Errorf("%s: answers %v, want both backends (pods on both nodes)", c.what, seen)
		}
		after := counters()
		for _, h := range []string{c.fwd, c.rev} {
			k := "socket-" + h + "-translated"
			if d := after[k] - before[k]; d < n {
				t.Errorf("%s: %s counted %d, want >= %d (the socket LB did not do it)", c.what, k, d, n)
			}
		}
		t.Logf("%s: answers %v", c.what, seen)
	}

	// The test process: lk-node1's netns, but not its cgroup.
	before := counters()
	if r := ask(netProbe{From: NodeNS(1), Proto: "tcp", Addr: vip + ":80"}, time.Second, 1); r.Err == nil {
		t.Errorf("a node process outside the node cgroup reached the ClusterIP (%q): translated", r.Answer)
	}
	if after := counters(); after["socket-connect4-translated"] != before["socket-connect4-translated"] {
		t.Errorf("the socket LB translated a process outside the node cgroup")
	}
}
