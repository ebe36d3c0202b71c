package lab

import (
	"context"
	"fmt"
	"net/netip"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/guest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// IPv6 for the lab's fast-lane VM (issue 25): in a dual-stack lab the
// agent gives the VM endpoint an IPv6 address beside its IPv4 one (the
// second IP config of its API form); the guest's /init configures it
// (lk.ip6, lk.gw6) with the link-local gateway the datapath's NDP responder
// answers, as for pods.

// VMLabelDomain is the label the lab VM's endpoint carries (KubeVirt's
// virt-launcher pods carry it with the VMI's name), so NetworkPolicy can
// select the VM.
const VMLabelDomain = "kubevirt.io/domain"

// labVMLabels are the CNI-args labels of the lab VM name's endpoint.
func labVMLabels(name string) map[string]string {
	return map[string]string{agent.ArgLabelPrefix + VMLabelDomain: name}
}

// publishVMPod gives every agent the Pod object of lv's virt-launcher
// stand-in (namespace default, the VM's labels, its addresses), as the API
// server does for a KubeVirt VM's launcher pod: the other nodes learn the
// VM's identity (NetworkPolicy, the tunnel's VNI identities) as they do a
// named pod's (NewPod). Not in a --k8s lab: its VMs have real Pod objects.
func publishVMPod(ctx context.Context, st *State, lv LabVM) error {
	if st.K8s {
		return nil
	}
	p := NamedPod{Name: "virt-launcher-" + lv.Name, Namespace: k8sobj.DefaultNamespace, Node: lv.Node, NS: lv.NS,
		IP: lv.IP, IP6: lv.IP6, Labels: map[string]string{VMLabelDomain: lv.Name}}
	data, err := k8sobj.Encode([]k8sobj.Object{p.podObject()})
	if err != nil {
		return err
	}
	if err := applyToNodes(ctx, st, data); err != nil {
		return fmt.Errorf("push the VM's Pod object: %w", err)
	}
	return nil
}

// vmIPv6 returns the VM's IPv6 address from its API form ("" without one).
func vmIPv6(vm *apiv1.VM) string {
	for _, ipc := range vm.GetEndpoint().GetIps() {
		p, err := netip.ParsePrefix(ipc.GetAddress())
		if err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
			return p.Addr().String()
		}
	}
	return ""
}

// guestIPv6 adds lv's IPv6 address and the IPv6 gateway to the guest's
// configuration.
func guestIPv6(gc *guest.Config, lv LabVM) {
	if lv.IP6 == "" {
		return
	}
	gc.IP6, gc.Gateway6 = lv.IP6+"/128", datapath.GatewayIP6.String()
}

// vmIPv6Targets are the lab's fast-lane VMs with an IPv6 address, as check
// targets.
func vmIPv6Targets(st *State) []endpoint {
	var out []endpoint
	for _, v := range st.VMs {
		if v.IP6 != "" {
			out = append(out, endpoint{Name: v.Name, NS: vmNS(v.Name), IP: v.IP6})
		}
	}
	return out
}

// upSecondVM adds "vm2" on node 1 when cfg asks for two fast-lane VMs (the
// first is on the last node): VM to VM then crosses nodes.
func upSecondVM(ctx context.Context, cfg Config, st *State) error {
	switch {
	case cfg.VMs <= 1:
		return nil
	case cfg.VMs > 2:
		return fmt.Errorf("--vms %d: at most 2 (one on the last node, one on node 1)", cfg.VMs)
	case cfg.K8s:
		return fmt.Errorf("--vms 2 with --k8s: not yet (one KubeVirt VM)")
	case len(st.Nodes) < 2:
		return fmt.Errorf("--vms 2 needs 2 nodes")
	}
	return upVMNamed(ctx, cfg, st, 1, "vm2")
}
