package lab

import (
	"strings"
	"testing"
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
