package lab

import (
	"context"
	"fmt"
)

// A DPU node in `lab up --k8s --dpu-nodes N` (issue 28): the DPU agent is
// the node's Kubernetes agent. It runs the Kubernetes source under its
// host's node name (KubeNodeName(i), not the DPU's own name): the pod CIDR
// from that Node's spec.podCIDR, the routes to the other nodes' pod CIDRs
// from their Nodes (in the DPU's namespace, which forwards the host's
// traffic), Services, EndpointSlices, NetworkPolicies and the Pods (their
// labels and IPs: those of its host's pods are what its representors
// carry). It reaches the API server over the wire at its own address with
// the lab's kubeconfig (the server's address, no ClusterIP: nothing needs
// kube-proxy). The host agent (--mode host) stays the thin CNI server; the
// lab kubelet in the node's namespace attaches the host's Pods through it,
// and reports their IPs as on any node.

// labK8s says whether the lab being built or running is `lab up --k8s`.
func labK8s() bool {
	st, err := LoadState()
	return err == nil && st.K8s
}

// dpuPodCIDRArgs are the DPU agent's pod-CIDR flags: the static range, or
// with --k8s the host's Node (pod CIDR, routes and objects come from the
// API server), and the PF representor where the host's own ClusterIP
// traffic is load-balanced (from_host).
func dpuPodCIDRArgs(i int) []string {
	if labK8s() {
		return []string{"--kubeconfig", Kubeconfig, "--node-name", KubeNodeName(i), "--dpu-host-pf", DPUPF}
	}
	return []string{"--pod-cidr", PodCIDR(i)}
}

// buildDPUK8s adjusts node i's DPU (buildDPU) for --k8s: the routes to the
// other nodes' pod CIDRs in the DPU come from their Node objects (the DPU
// agent's route source), so the static ones go; the host sends them
// through its PF to the DPU (on hardware, its default route), as the host
// of a plain node in a --k8s lab would have them from its agent.
func buildDPUK8s(ctx context.Context, i, n int) error {
	// The host's own ClusterIP traffic: through its PF to the DPU, whose
	// from_host on lk-pf load-balances it (on hardware: the default route).
	if err := ip(ctx, "-n", NodeNS(i), "route", "add", ServiceCIDR, "via", DPUIP(i), "dev", Uplink); err != nil {
		return fmt.Errorf("dpu %s (k8s): %w", DPUNS(i), err)
	}
	for j := 1; j <= n; j++ {
		if j == i {
			continue
		}
		for _, args := range [][]string{
			{"-n", DPUNS(i), "route", "del", PodCIDR(j), "via", UnderlayIP(j), "dev", Uplink},
			{"-n", NodeNS(i), "route", "add", PodCIDR(j), "via", UnderlayIP(j), "dev", Uplink},
		} {
			if err := ip(ctx, args...); err != nil {
				return fmt.Errorf("dpu %s (k8s): %w", DPUNS(i), err)
			}
		}
	}
	return nil
}
