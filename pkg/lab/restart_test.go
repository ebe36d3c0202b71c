package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// agentKilledDuringTransfer: node 1's agent dies by SIGKILL one second into a
// 4 s iperf3 transfer from a lanekit pod on node 1 to one on node 2. The
// pinned datapath keeps forwarding, so the transfer completes with data in
// every second; a new agent re-adopts the endpoint with no duplicate attach.
func agentKilledDuringTransfer(t *testing.T, bins Bins, lk func(*testing.T, ...string) (string, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, server := PodNS(1, 1, KindLanekit), PodNS(2, 1, KindLanekit)
	serverIP := podIP(ctx, server)
	srv := nsCommand(ctx, server, "iperf3", "-s", "-1")
	if err := srv.Start(); err != nil {
		t.Fatalf("iperf3 server: %v", err)
	}
	defer srv.Process.Kill()
	go srv.Wait()
	time.Sleep(300 * time.Millisecond)

	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := nsCommand(ctx, client, "iperf3", "-c", serverIP, "-t", "4", "-J").Output()
		done <- result{out, err}
	}()
	time.Sleep(time.Second)
	pid := readPID(AgentPIDFile(1))
	if pid <= 0 || !alive(pid) {
		t.Fatalf("node 1 agent not running (pid %d)", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill agent: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("iperf3 with the agent killed mid-transfer: %v\n%s", r.err, r.out)
	}
	var rep struct {
		Intervals []struct {
			Sum struct {
				Start float64 `json:"start"`
				Bytes float64 `json:"bytes"`
			} `json:"sum"`
		} `json:"intervals"`
	}
	if err := json.Unmarshal(r.out, &rep); err != nil {
		t.Fatalf("iperf3 -J: %v", err)
	}
	if len(rep.Intervals) < 4 {
		t.Fatalf("iperf3 reported %d intervals, want 4", len(rep.Intervals))
	}
	for _, iv := range rep.Intervals {
		if iv.Sum.Bytes <= 0 {
			t.Errorf("no data in second %.0f of the transfer: forwarding stopped with the agent", iv.Sum.Start)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}

	if _, err := startAgent(ctx, bins, 1); err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	log, _ := os.ReadFile(AgentLog(1))
	if !strings.Contains(string(log), `"msg":"re-adopted endpoints","kept":1`) {
		t.Errorf("restarted agent did not re-adopt its endpoint; log:\n%s", logTail(AgentLog(1)))
	}
	out, err := lk(t, "endpoint", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, podIP(ctx, client)) {
		t.Errorf("endpoint list after restart lacks the pod: %v\n%s", err, out)
	}
	// Exactly one program on each pod device and on the uplink: re-adoption
	// updated the pinned links instead of attaching again.
	if n, err := tcxProgramsPerDevice(ctx, NodeNS(1)); err != nil {
		t.Errorf("count tcx programs: %v", err)
	} else {
		for dev, c := range n {
			if c != 1 {
				t.Errorf("%s has %d tcx programs after the restart, want 1", dev, c)
			}
		}
		if len(n) != 2 {
			t.Errorf("tcx programs on %d devices of node 1 (%v), want 2: the uplink and the pod", len(n), n)
		}
	}
}

// tcxProgramsPerDevice counts tcx ingress programs per device of a namespace
// (bpftool 7.1 does not list tcx links).
func tcxProgramsPerDevice(_ context.Context, ns string) (map[string]int, error) {
	h, err := netns.GetFromPath(netnsPath(ns))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	type res struct {
		n   map[string]int
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine, never back in the pool in ns
		if err := netns.Set(h); err != nil {
			c <- res{err: err}
			return
		}
		links, err := netlink.LinkList()
		if err != nil {
			c <- res{err: err}
			return
		}
		n := map[string]int{}
		for _, l := range links {
			q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				c <- res{err: fmt.Errorf("query %s: %w", l.Attrs().Name, err)}
				return
			}
			if len(q.Programs) > 0 {
				n[l.Attrs().Name] = len(q.Programs)
			}
		}
		c <- res{n: n}
	}()
	r := <-c
	return r.n, r.err
}

// vmAgentKilled: the agent of the VM's node dies by SIGKILL. The guest keeps
// its connectivity (pinned datapath, sockets held by the backend); a new
// agent re-adopts the VM and serves its sockets again.
func vmAgentKilled(t *testing.T, bins Bins, lk func(*testing.T, ...string) (string, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := LoadState()
	if err != nil || len(st.VMs) == 0 {
		t.Fatalf("lab state without a VM: %v", err)
	}
	vm := st.VMs[0]
	pid := readPID(AgentPIDFile(vm.Node))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill agent of node %d: %v", vm.Node, err)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	// With no agent at all on its node, pods on node 1 still reach the VM.
	client := PodNS(1, 1, KindLanekit)
	if _, err := inNS(ctx, client, append(pingCommand(), "-c", "1", "-W", "2", vm.IP)...); err != nil {
		t.Errorf("pod -> VM with the VM's agent down: %v", err)
	}
	if _, err := startAgent(ctx, bins, vm.Node); err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	out, err := lk(t, "vm", "list", "--socket", AgentSocket(vm.Node))
	if err != nil || !strings.Contains(out, vm.Name) || !strings.Contains(out, vm.IP) || !strings.Contains(out, "true") { // serving
		t.Errorf("vm list after restart: %v\n%s", err, out)
	}
}
