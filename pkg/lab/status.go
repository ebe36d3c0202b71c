package lab

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// WriteStatus prints nodes, agents and pods with their live addresses.
func WriteStatus(ctx context.Context, w io.Writer) error {
	st, err := LoadState()
	if err != nil {
		if left := listLabNetns(); len(left) > 0 {
			return fmt.Errorf("lab status: no lab state but %d lk- netns exist (run `lanekit lab down`): %w", len(left), err)
		}
		return fmt.Errorf("lab status: %w", err)
	}
	mode := "full (lanekit + baseline pods)"
	if st.BaselineOnly {
		mode = "baseline-only"
	}
	fmt.Fprintf(w, "lab: %d nodes, %s; underlay %s bridge %s (present: %v)\n", len(st.Nodes), mode, WireNS, WireBridge, netnsExists(WireNS))
	if st.K8s {
		if srv, err := k8stest.Load(K8sDir); err == nil {
			fmt.Fprintf(w, "k8s: kube-apiserver %s (pid %d, alive %v), etcd pid %d (alive %v); kubeconfig %s; kubelets:",
				srv.Host(), srv.APIPID, alive(srv.APIPID), srv.EtcdPID, alive(srv.EtcdPID), Kubeconfig)
			for _, n := range st.Nodes {
				fmt.Fprintf(w, " %s pid %d (alive %v)", KubeNodeName(n.Index), n.KubeletPID, alive(n.KubeletPID))
			}
			fmt.Fprintln(w)
		} else {
			fmt.Fprintf(w, "k8s: no API server state in %s: %v\n", K8sDir, err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNETNS\tUNDERLAY\tPOD CIDR\tBASELINE CIDR\tAGENT PID\tAGENT\t")
	for _, n := range st.Nodes {
		agent := "-"
		pid := "-"
		if !st.BaselineOnly {
			pid = fmt.Sprint(n.AgentPID)
			agent = "dead"
			if alive(n.AgentPID) && inLabNetns(n.AgentPID) {
				agent = "alive"
			}
		}
		podCIDR := addrs(n.PodCIDR, n.PodCIDR6)
		if st.IPFamily == IPFamilyIPv6 { // the agents have no IPv4 pod CIDR
			podCIDR = n.PodCIDR6
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\t\n", n.NS, netnsExists(n.NS), addrs(n.UnderlayIP, n.UnderlayIP6), podCIDR, n.BaseCIDR, pid, agent)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("lab status: %w", err)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tKIND\tIP (live eth0)\tIP (cni result)\t")
	for _, n := range st.Nodes {
		for _, p := range n.Pods {
			live := "missing"
			if netnsExists(p.NS) {
				live = podIP(ctx, p.NS)
				if live == "" {
					live = podIP6(ctx, p.NS) // an IPv6-only lab's lanekit pod
				}
				if live == "" {
					live = "no address"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", p.NS, n.NS, p.Kind, live, addrs(p.IP, p.IP6))
		}
		if n.RawNS != "" { // the raw host beside the node: the bench's host-raw row
			live := "missing"
			if netnsExists(n.RawNS) {
				live = "present"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", n.RawNS, n.NS, "raw host (no rules)", live, addrs(n.RawIP, n.RawIP6))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("lab status: %w", err)
	}
	if len(st.VMs)+len(st.TapVMs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tPATH\tNODE\tNETNS\tIP\tMAC\tQUEUES\tBACKEND\tQEMU\tBOOT\t")
	for _, v := range append(append([]LabVM{}, st.VMs...), st.TapVMs...) {
		state := func(pid int) string {
			if alive(pid) {
				return fmt.Sprintf("%d running", pid)
			}
			return fmt.Sprintf("%d exited", pid)
		}
		path, backend := "fast lane (vhost-user, AF_XDP)", state(v.BackendPID)
		if v.BackendPID == 0 {
			path, backend = "standard (tap on lk-cni0)", "qemu virtio"
		} else if v.BackendNS != "" {
			path, backend = "fast lane on the DPU (vhost-user, AF_XDP)", state(v.BackendPID)+" in "+v.BackendNS
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%.1fs\t\n", v.Name, path, NodeNS(v.Node), v.NS, addrs(v.IP, v.IP6), v.MAC, v.Queues,
			backend, state(v.QEMUPID), v.BootSeconds)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("lab status: %w", err)
	}
	return nil
}

// addrs joins an endpoint's IPv4 and IPv6 addresses (either may be empty).
func addrs(ip, ip6 string) string {
	switch {
	case ip == "":
		return ip6
	case ip6 == "":
		return ip
	}
	return ip + " " + ip6
}
