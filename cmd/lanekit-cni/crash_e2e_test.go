package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestE2ECrashDuringAdd kills lanekitd (SIGKILL, through its test-only
// crash hook) after each step of an ADD, restarts it on the same state and
// pins, and checks that nothing leaked (endpoint map entries, counters,
// pinned links, records, addresses, devices) and that the same container
// and a new one can be added, carry traffic and be deleted.
func TestE2ECrashDuringAdd(t *testing.T) {
	e := setup(t)
	cni, list := e.libcni(t)
	ctx := context.Background()
	pod := netnstest.New(t, "ecpod")
	pod2 := netnstest.New(t, "ecpod2")
	e.stopAgent(t)
	for _, step := range agent.AddSteps {
		rt := &libcni.RuntimeConf{ContainerID: "crash-" + step, NetNS: pod.Path(), IfName: "eth0"}
		e.startAgentEnv(t, agent.CrashEnv+"="+step)
		if _, err := cni.AddNetworkList(ctx, list, rt); err == nil {
			t.Fatalf("step %s: add succeeded, want the agent killed", step)
		}
		waitErr := make(chan error, 1)
		go func() { waitErr <- e.agent.Wait() }()
		select {
		case err := <-waitErr:
			if err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("step %s: agent exit = %v, want killed\n%s", step, err, e.agentLog)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("step %s: agent still running after the crash point", step)
		}

		e.startAgent(t)
		if step == agent.StepCommitted {
			// The ADD completed before the kill: the endpoint is kept.
			if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("step %s: check after restart: %v", step, err)
			}
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("step %s: del: %v", step, err)
			}
		} else if !strings.Contains(e.agentLog.String(), `"rolled_back":1`) {
			t.Fatalf("step %s: restarted agent did not roll the add back:\n%s", step, e.agentLog)
		}
		e.assertClean(t)

		// The same container again and a new one: both forward and go away.
		r1, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			t.Fatalf("step %s: add after restart: %v", step, err)
		}
		rt2 := &libcni.RuntimeConf{ContainerID: "fresh-" + step, NetNS: pod2.Path(), IfName: "eth0"}
		r2, err := cni.AddNetworkList(ctx, list, rt2)
		if err != nil {
			t.Fatalf("step %s: add of a new container: %v", step, err)
		}
		res1, _ := current.NewResultFromResult(r1)
		res2, _ := current.NewResultFromResult(r2)
		e.talkThrough(t, pod.Path(), res1.IPs[0].Address.IP.String(), pod2.Path(), res2.IPs[0].Address.IP.String())
		for _, r := range []*libcni.RuntimeConf{rt, rt2} {
			if err := cni.DelNetworkList(ctx, list, r); err != nil {
				t.Fatalf("step %s: del %s: %v", step, r.ContainerID, err)
			}
		}
		e.assertClean(t)
		e.stopAgent(t)
	}
}
