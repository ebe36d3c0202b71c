package lab

import (
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

func TestDPUBenchRows(t *testing.T) {
	node := func(i int, dpu bool) Node {
		n := Node{Index: i, NS: NodeNS(i), UnderlayIP: UnderlayIP(i),
			Pods: []Pod{{NS: PodNS(i, 1, KindLanekit), Kind: KindLanekit, IP: "10.244.9." + string(rune('0'+i))}}}
		if dpu {
			n.DPU = &DPU{NS: DPUNS(i), IP: DPUIP(i)}
		}
		return n
	}
	st := &State{Nodes: []Node{node(1, true), node(2, false), node(3, false)}}
	paths, _ := st.BenchPaths()
	byName := map[string]int{}
	for i, p := range paths {
		byName[p.Name] = i
	}
	lp, ok := byName["lanekit-pod"]
	if !ok || !strings.Contains(paths[lp].Note, DPUNS(1)) {
		t.Errorf("lanekit-pod row does not say it starts on a DPU node: %+v", paths)
	}
	pp, ok := byName["lanekit-pod-plain"]
	if !ok || paths[pp].ClientNS != PodNS(2, 1, KindLanekit) || paths[pp].ServerNS != PodNS(3, 1, KindLanekit) {
		t.Errorf("no plain-node row node 2 -> node 3: %+v", paths)
	}
	st.Nodes[0].DPU = nil
	paths, _ = st.BenchPaths()
	for _, p := range paths {
		if p.Name == "lanekit-pod-plain" {
			t.Error("a lab without a DPU got the plain-node row")
		}
	}
	// The fast-lane VM on the DPU node: its row starts on node 2 and says
	// where its fast lane runs.
	st.Nodes[0].DPU = &DPU{NS: DPUNS(1), IP: DPUIP(1)}
	st.VMs = []LabVM{{Name: "vm1", Node: 1, NS: VMNS(1, 1), IP: "10.244.1.9", SerialSocket: "/x", BackendNS: DPUNS(1)}}
	paths, skipped := st.BenchPaths()
	found := false
	for _, p := range paths {
		if p.Name == "lanekit-vm" {
			found = p.ClientNS == PodNS(2, 1, KindLanekit) && p.ServerIP == "10.244.1.9" && strings.Contains(p.Note, "on its DPU "+DPUNS(1))
		}
	}
	if !found {
		t.Errorf("no lanekit-vm row from node 2 to the VM on the DPU node: %+v (skipped %v)", paths, skipped)
	}
	cfg := Config{Nodes: 2, DPUNodes: 3}
	if err := cfg.checkDPU(); err == nil {
		t.Error("--dpu-nodes 3 of 2 nodes accepted")
	}
	cfg = Config{Nodes: 2, DPUNodes: 1, K8s: true}
	if err := cfg.checkDPU(); err != nil {
		t.Errorf("--dpu-nodes with --k8s refused: %v", err)
	}
	cfg = Config{Nodes: 2, DPUNodes: 1, K8s: true, Kubelet: true}
	if err := cfg.checkDPU(); err == nil {
		t.Error("--dpu-nodes with --kubelet (real nodes) accepted")
	}
}

// The fast-lane VM may go on a DPU node (--vm-node): checkDPU no longer
// refuses it; --vm-node is checked on its own.
func TestDPUVMNode(t *testing.T) {
	cfg := Config{Nodes: 2, DPUNodes: 1, VM: true, VMNode: 1}
	if err := cfg.checkDPU(); err != nil {
		t.Errorf("a VM on the DPU node refused: %v", err)
	}
	if err := cfg.checkVMNode(); err != nil || cfg.vmNode() != 1 {
		t.Errorf("--vm-node 1: %v, node %d", err, cfg.vmNode())
	}
	cfg = Config{Nodes: 2, DPUNodes: 2, VM: true}
	if err := cfg.checkDPU(); err != nil || cfg.vmNode() != 2 {
		t.Errorf("every node with a DPU and the VM on the last: %v, node %d", err, cfg.vmNode())
	}
	for _, bad := range []Config{
		{Nodes: 2, VMNode: 1},
		{Nodes: 2, VM: true, VMNode: 3},
		{Nodes: 2, VM: true, VMNode: -1},
		{Nodes: 2, VM: true, VMNode: 1, VMs: 2},
		{Nodes: 2, VM: true, VMNode: 1, K8s: true},
		{Nodes: 2, NoStdVM: true},
	} {
		if err := bad.checkVMNode(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// lab up refuses --vm with --baseline-only before it builds anything (the
// VM's fast lane needs the agents), as it refuses --k8s with it.
func TestCheckRefusesVMWithoutAgents(t *testing.T) {
	bins := testBins(t)
	if err := bins.checkBaseline(); err != nil {
		testutil.MissingDep(t, "%v", err)
	}
	cfg := Config{Nodes: 2, PodsPerNode: 1, VM: true, BaselineOnly: true, Bins: bins}
	if _, err := cfg.check(); err == nil || !strings.Contains(err.Error(), "--vm needs the agents") {
		t.Fatalf("check of --vm --baseline-only: %v", err)
	}
	cfg.BaselineOnly = false
	if _, err := cfg.check(); err != nil && strings.Contains(err.Error(), "--vm needs the agents") {
		t.Fatalf("check of --vm with the agents: %v", err)
	}
}
