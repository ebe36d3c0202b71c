package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/lanekit/lanekit/internal/socktest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/service"
)

func TestMain(m *testing.M) {
	socktest.MaybeClient()
	os.Exit(m.Run())
}

// sockCgroup is a child cgroup2 of the test's own (never the root of the
// hierarchy: that would translate every process's connections).
// attachSockLB attaches the socket LB of e's datapath to a fresh cgroup
// (detached at the end of t) and returns the cgroup and a reader of its
// per-hook counters.
func attachSockLB(t *testing.T, e *liveEnv) (string, func() map[string]SockCounters) {
	t.Helper()
	cg := sockCgroup(t)
	var err error
	e.in(t, e.node, func() {
		err = e.dp.AttachSockLB(SockLBConfig{Cgroup: cg, NodeAddr: netip.MustParseAddr("10.77.0.1")})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.dp.DetachSockLB(); err != nil {
			t.Errorf("detach: %v", err)
		}
	})
	return cg, func() map[string]SockCounters {
		s, err := e.dp.SockLBStats()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func sockCgroup(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := EnsureCgroup2(mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	cg := filepath.Join(mnt, fmt.Sprintf("lk-test-sock-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove cgroup %s: %v", cg, err)
		}
	})
	return cg
}

// runClient runs ops as a socktest client in netns ns and, when cg is not
// empty, in cgroup cg, and returns its output lines.
func runClient(t *testing.T, ns netns.NsHandle, cg string, ops ...string) []string {
	t.Helper()
	lines, err := socktest.Run(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)), cg, ops...)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// backendServers answers TCP and UDP on ip:8080 in ns with ip itself.
func (e *liveEnv) backendServers(t *testing.T, ns netns.NsHandle, ip string) {
	t.Helper()
	e.lineServer(t, ns, ip+":8080", func(c net.Conn, _ string) { fmt.Fprintf(c, "%s\n", ip) })
	var pc net.PacketConn
	e.in(t, ns, func() {
		var err error
		if pc, err = net.ListenPacket("udp4", ip+":8080"); err != nil {
			t.Fatalf("listen udp: %v", err)
		}
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 128)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(ip+"\n"), from)
		}
	}()
}

// attachedCount is how many programs are attached to cgroup cg at at.
func attachedCount(t *testing.T, cg string, at ebpf.AttachType) int {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
	if err != nil {
		t.Fatal(err)
	}
	return len(r.Programs)
}

func repeat(op string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = op
	}
	return out
}

// TestLiveSockLB: a process in the node's netns and the node's cgroup (the
// node itself or a hostNetwork pod) reaches a ClusterIP over TCP, connected
// and unconnected UDP, and a NodePort on the node's address and on loopback;
// both backends (a local pod, a pod on the other node) serve it, the client
// sees the service address (getpeername, recvfrom), and the socket LB's
// counters account for every call. No backend: ECONNREFUSED. A process
// outside the cgroup, or in the cgroup but another netns, is not translated
// by the socket LB; with the programs detached the host client fails.
func TestLiveSockLB(t *testing.T) {
	e := newLiveEnv(t)
	e.backendServers(t, e.pod2, "10.244.1.11")
	e.backendServers(t, e.remote, "10.244.2.1")
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}})
	tables := service.NewTables()
	applyYAML(t, e.dp, m, tables, svcYAML("web", "10.96.0.20", 80, "TCP", "nodePort=30090", "10.244.1.11", "10.244.2.1"))
	applyYAML(t, e.dp, m, tables, svcYAML("dns", "10.96.0.21", 53, "UDP", "", "10.244.1.11", "10.244.2.1"))
	applyYAML(t, e.dp, m, tables, svcYAML("empty", "10.96.0.22", 80, "TCP", ""))
	applyYAML(t, e.dp, m, tables, svcYAML("emptyudp", "10.96.0.23", 53, "UDP", ""))
	applyYAML(t, e.dp, m, tables, svcYAML("sticky", "10.96.0.24", 80, "TCP", "affinity=60", "10.244.1.11", "10.244.2.1"))

	cg, stats := attachSockLB(t, e)

	const n = 16
	cases := []struct {
		name, op, peer string
		fwd, rev       string // hooks that must count n translations
	}{
		{"tcp clusterip", "tcp 10.96.0.20:80", "10.96.0.20:80", "connect4", "getpeername4"},
		{"tcp nodeport", "tcp 10.77.0.1:30090", "10.77.0.1:30090", "connect4", "getpeername4"},
		{"tcp nodeport loopback", "tcp 127.0.0.1:30090", "127.0.0.1:30090", "connect4", "getpeername4"},
		{"udp clusterip", "udp 10.96.0.21:53", "10.96.0.21:53", "sendmsg4", "recvmsg4"},
		{"connected udp clusterip", "udpc 10.96.0.21:53", "10.96.0.21:53", "connect4", "getpeername4"},
		{"tcp clusterip, ipv6 socket (v4-mapped)", "tcp6m 10.96.0.20:80", "10.96.0.20:80", "connect6", "getpeername6"},
		{"connected udp clusterip, ipv6 socket (v4-mapped)", "udp6m 10.96.0.21:53", "10.96.0.21:53", "connect6", "getpeername6"},
		// The kernel sends an IPv6 socket's datagram to a mapped address
		// the IPv4 way (sendmsg4); the reply comes through recvmsg6.
		{"udp clusterip, ipv6 socket (v4-mapped)", "udp6mu 10.96.0.21:53", "10.96.0.21:53", "sendmsg4", "recvmsg6"},
	}
	for _, c := range cases {
		before := stats()
		seen := map[string]int{}
		for _, line := range runClient(t, e.node, cg, repeat(c.op, n)...) {
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "ok" {
				t.Errorf("%s: %q, want a reply", c.name, line)
				continue
			}
			seen[f[1]]++
			if f[2] != c.peer {
				t.Errorf("%s: the client sees %s, want the service address %s", c.name, f[2], c.peer)
			}
		}
		if seen["10.244.1.11"] == 0 || seen["10.244.2.1"] == 0 {
			t.Errorf("%s: backends reached %v, want both", c.name, seen)
		}
		after := stats()
		for _, h := range []string{c.fwd, c.rev} {
			if d := after[h].Translated - before[h].Translated; d < n {
				t.Errorf("%s: %s translated %d, want >= %d", c.name, h, d, n)
			}
		}
	}

	// ClientIP affinity, on the packet path's affinity map: every host
	// socket is the node's address as a client, so all go to one backend.
	lbBefore, err := e.dp.ServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range runClient(t, e.node, cg, repeat("tcp 10.96.0.24:80", n)...) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "10.96.0.24:80" {
			t.Errorf("affinity: %q, want an answer through 10.96.0.24:80", line)
			continue
		}
		seen[f[1]]++
	}
	if len(seen) != 1 {
		t.Errorf("affinity: backends %v, want one", seen)
	}
	lbAfter, err := e.dp.ServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	if d := lbAfter.AffinityHits - lbBefore.AffinityHits; d != n-1 {
		t.Errorf("affinity: %d affinity hits, want %d (the first call creates the entry)", d, n-1)
	}

	// A hostPort on the loopback hostIP (127.0.0.1:30090, the upstream
	// hostPort test's case) is its own frontend: 127.0.0.1 reaches the pod
	// that asked for it, another loopback address still means the node's
	// NodePort (both backends of web).
	hp := &k8sobj.Pod{
		Namespace: "default", Name: "hp",
		Spec: k8sobj.PodSpec{Containers: []k8sobj.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{ContainerPort: 8080, HostPort: 30090, HostIP: "127.0.0.1"}}}}},
		Status: k8sobj.PodStatus{PodIP: "10.244.2.1", Phase: corev1.PodRunning},
	}
	hpModel := service.NewModel(service.Options{LocalPrefixes: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	ch, _, err := hpModel.Batch([]service.Edit{{ID: service.HostPortID(hp), Pod: hp}})
	if err != nil || len(ch.Upserted) != 1 {
		t.Fatalf("hostPort model: %+v %v", ch, err)
	}
	if err := e.dp.ApplyServices(tables.Apply(ch)); err != nil {
		t.Fatal(err)
	}
	for op, want := range map[string]map[string]bool{
		"tcp 127.0.0.1:30090": {"10.244.2.1": true},
		"tcp 127.0.0.2:30090": {"10.244.2.1": true, "10.244.1.11": true},
	} {
		seen := map[string]bool{}
		for _, line := range runClient(t, e.node, cg, repeat(op, n)...) {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "ok" {
				seen[f[1]] = true
			} else {
				t.Errorf("%s: %q, want a reply", op, line)
			}
		}
		if fmt.Sprint(seen) != fmt.Sprint(want) {
			t.Errorf("%s: backends %v, want %v", op, seen, want)
		}
	}

	// No backend: the call fails as a closed port would.
	before := stats()
	for i, line := range runClient(t, e.node, cg, "tcp 10.96.0.22:80", "udp 10.96.0.23:53") {
		if line != "err ECONNREFUSED" {
			t.Errorf("no backend, op %d: %q, want err ECONNREFUSED", i, line)
		}
	}
	after := stats()
	if after["connect4"].NoBackend-before["connect4"].NoBackend != 1 || after["sendmsg4"].NoBackend-before["sendmsg4"].NoBackend != 1 {
		t.Errorf("no-backend counters: before %v after %v", before, after)
	}

	// loadBalancerSourceRanges: the node's processes reach a LoadBalancer
	// ingress IP only when a range holds a node address (kube-proxy's
	// allowFromNode); else the call fails with EPERM, counted. Its
	// ClusterIP is not limited.
	lbSrc := func(ranges string) string {
		return lbSvcYAML("lbsrc", "10.96.0.25", "TCP", 30091, "  loadBalancerSourceRanges: ["+ranges+"]",
			"  loadBalancer: {ingress: [{ip: 192.0.2.25}]}", "10.244.1.11")
	}
	applyYAML(t, e.dp, m, tables, lbSrc("198.51.100.0/24"))
	before = stats()
	if got := runClient(t, e.node, cg, "tcp 192.0.2.25:80", "tcp 10.96.0.25:80"); got[0] != "err EPERM" || got[1] != "ok 10.244.1.11 10.96.0.25:80" {
		t.Errorf("ranges without the node: %q, want err EPERM for the ingress IP, the ClusterIP served", got)
	}
	if d := stats()["connect4"].SrcRange - before["connect4"].SrcRange; d != 1 {
		t.Errorf("connect4 src-range refusals +%d, want 1", d)
	}
	applyYAML(t, e.dp, m, tables, lbSrc("198.51.100.0/24, 10.77.0.0/24"))
	if got := runClient(t, e.node, cg, "tcp 192.0.2.25:80")[0]; got != "ok 10.244.1.11 192.0.2.25:80" {
		t.Errorf("ranges holding the node's address: %q, want served through the ingress IP", got)
	}

	// Outside the node's cgroup: the node netns has no route to the
	// service range, so untranslated means unreachable.
	before = stats()
	if got := runClient(t, e.node, "", "tcp 10.96.0.20:80")[0]; got != "err ENETUNREACH" {
		t.Errorf("process outside the cgroup: %q, want err ENETUNREACH (not translated)", got)
	}
	// In the cgroup but another netns (a pod): the packet path serves it,
	// the socket LB leaves it alone.
	lbBefore, err = e.dp.ServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	if got := runClient(t, e.pod1, cg, "tcp 10.96.0.20:80")[0]; !strings.HasPrefix(got, "ok ") || !strings.HasSuffix(got, " 10.96.0.20:80") {
		t.Errorf("pod netns client in the node cgroup: %q, want served by the packet path", got)
	}
	lbAfter, err = e.dp.ServiceStats()
	if err != nil {
		t.Fatal(err)
	}
	if lbAfter.NewFlows == lbBefore.NewFlows {
		t.Errorf("pod client: the packet path's new-flow counter did not move")
	}
	if after := stats(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("socket LB counters moved for clients it must not translate: before %v after %v", before, after)
	}

	// Agent restart: with the loader closed (agent down) the pinned links
	// keep translating; a new loader updates them in place, one program
	// per hook.
	e.dp.Close()
	e.dp = nil
	if got := runClient(t, e.node, cg, "tcp 10.96.0.20:80")[0]; !strings.HasSuffix(got, " 10.96.0.20:80") {
		t.Errorf("agent down: %q, want served", got)
	}
	e.in(t, e.node, func() {
		e.open(t)
		err = e.dp.AttachSockLB(SockLBConfig{Cgroup: cg, NodeAddr: netip.MustParseAddr("10.77.0.1")})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range sockHooks {
		if n := attachedCount(t, cg, h.attach); n != 1 {
			t.Errorf("after restart: %d programs on %s, want 1", n, h.name)
		}
	}
	before = stats()
	if got := runClient(t, e.node, cg, "tcp 10.96.0.20:80")[0]; !strings.HasSuffix(got, " 10.96.0.20:80") {
		t.Errorf("after restart: %q, want served", got)
	}
	if after := stats(); after["connect4"].Translated != before["connect4"].Translated+1 {
		t.Errorf("after restart: connect4 translated %d -> %d, want +1", before["connect4"].Translated, after["connect4"].Translated)
	}

	// Detached: the same host client fails.
	if err := e.dp.DetachSockLB(); err != nil {
		t.Fatal(err)
	}
	if got := runClient(t, e.node, cg, "tcp 10.96.0.20:80")[0]; got != "err ENETUNREACH" {
		t.Errorf("programs detached: %q, want err ENETUNREACH", got)
	}
}
