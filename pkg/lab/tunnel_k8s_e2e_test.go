package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestTunnelK8s: `lab up --k8s --routing tunnel`: the agents get no
// --tunnel-node; their node maps come from the Node objects (pod CIDR →
// InternalIP). lab check passes for the pods the lab kubelets attached,
// bulk TCP between them is carried by the BPF tunnel (0 kernel-forwarded,
// encapsulations for what BPF forwarded), and once node 2's Node object is
// deleted node 1's map forgets it and its pod is unreachable: the map was
// the Node objects'. Root only; brings up the global lab.
func TestTunnelK8s(t *testing.T) {
	bins := pathTestBins(t)
	k8stest.RequireBins(t)
	bins.Self = CLIForTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	st := upLab(t, ctx, Config{Nodes: 2, PodsPerNode: 1, K8s: true, Routing: RoutingTunnel, Bins: bins})
	peerOf := func(node int) map[string]string {
		got := map[string]string{}
		for _, n := range agentStatus(t, node).GetRouting().GetTunnelNodes() {
			if !n.GetSelf() {
				got[n.GetPodCidr()] = n.GetUnderlay()
			}
		}
		return got
	}
	for i, j := range map[int]int{1: 2, 2: 1} {
		waitFor(t, fmt.Sprintf("node %d's tunnel map to hold node %d from its Node object", i, j), 30*time.Second, func() bool {
			return peerOf(i)[PodCIDR(j)] == UnderlayIP(j)
		})
	}

	t.Run("lab check", func(t *testing.T) {
		var out bytes.Buffer
		err := Check(ctx, bins, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
	})

	pods, ips := map[int]string{}, map[int]netip.Addr{}
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			if p.Kind == KindLanekit && pods[n.Index] == "" {
				pods[n.Index], ips[n.Index] = p.NS, netip.MustParseAddr(p.IP)
			}
		}
	}
	t.Run("bulk TCP node1 pod to node2 pod", func(t *testing.T) {
		b1, b2 := samplePath(t, ctx, 1, pods[1], ips[1]), samplePath(t, ctx, 2, pods[2], ips[2])
		tb := tunnelStats(t, 1)
		bulkTCP(t, ctx, pods[1], pods[2], ips[2].String())
		d := judgeBulkPath(t, "node1 pod", b1, samplePath(t, ctx, 1, pods[1], ips[1]), true, 0, "datagrams")
		judgeBulkPath(t, "node2 pod", b2, samplePath(t, ctx, 2, pods[2], ips[2]), false, 0, "datagrams")
		if enc := since(tunnelStats(t, 1)[datapath.TunnelEncap], tb[datapath.TunnelEncap]); float64(enc) < (1-maxKernelShare)*float64(d.bpfFwd) {
			t.Errorf("node1: %d encapsulations for %d packets BPF forwarded", enc, d.bpfFwd)
		}
	})

	t.Run("node 2's Node object deleted: node 1 forgets its pod CIDR", func(t *testing.T) {
		_, c, err := K8s()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CoreV1().Nodes().Delete(ctx, KubeNodeName(2), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "node 1's tunnel map to drop node 2", 30*time.Second, func() bool { _, ok := peerOf(1)[PodCIDR(2)]; return !ok })
		if out, err := inNS(ctx, pods[1], "busybox", "ping", "-c", "2", "-W", "1", ips[2].String()); err == nil {
			t.Fatalf("node 1's pod still reaches %s without node 2's Node object:\n%s", ips[2], out)
		}
	})
}
