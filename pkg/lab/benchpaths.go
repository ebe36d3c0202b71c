package lab

import (
	"fmt"
	"os"

	"github.com/lanekit/lanekit/pkg/bench"
)

// TCGNote labels the guest rows: QEMU here has no KVM, so the guest CPU is
// emulated and the guest, not the datapath, bounds these figures.
const TCGNote = "guest under TCG (software-emulated CPU, no KVM): the guest is the bottleneck; compare VM rows with each other, not with pods"

// BenchPaths returns the cross-node rows the lab offers (node1 -> node2; VMs are on the last node, or
// on node 1 with `--vm-node 1`, then from node 2):
// host, bridge-iptables and lanekit-pod when their pods exist, and with
// `lab up --vm` lanekit-vm (lanekit pod -> the fast-lane guest) and
// bridge-tap-vm (baseline pod -> the tap guest), whose servers run inside
// the guests. The second value lists rows that were skipped and why.
func (s *State) BenchPaths() ([]bench.Path, []string) {
	if len(s.Nodes) < 2 {
		return nil, []string{"the lab has fewer than 2 nodes"}
	}
	n1, n2 := s.Nodes[0], s.Nodes[1]
	var paths []bench.Path
	var skipped []string
	if n1.RawNS != "" && n2.RawNS != "" {
		paths = append(paths, bench.Path{Name: bench.RawPath, ClientNS: n1.RawNS, ServerNS: n2.RawNS, ServerIP: n2.RawIP,
			Includes: IncludesRaw})
	} else {
		skipped = append(skipped, bench.RawPath+": the lab has no raw hosts (brought up by an older lanekit)")
	}
	paths = append(paths, bench.Path{Name: bench.HostPath, ClientNS: n1.NS, ServerNS: n2.NS, ServerIP: n2.UnderlayIP,
		Includes: IncludesHost})
	for _, row := range []struct {
		name, kind string
		includes   bench.Includes
	}{
		{"bridge-iptables", KindBaseline, IncludesBridge},
		{"lanekit-pod", KindLanekit, IncludesLanekitPod},
	} {
		c, okc := firstPod(n1, row.kind)
		sv, oks := firstPod(n2, row.kind)
		if !okc || !oks {
			skipped = append(skipped, fmt.Sprintf("%s: no %s pods on %s and %s", row.name, row.kind, n1.NS, n2.NS))
			continue
		}
		paths = append(paths, bench.Path{Name: row.name, ClientNS: c.NS, ServerNS: sv.NS, ServerIP: sv.IP, Includes: row.includes})
	}
	p6, skipped6 := s.ipv6BenchPaths(n1, n2) // bench6.go: the IPv6 rows
	paths, skipped = append(paths, p6...), append(skipped, skipped6...)
	vmRows := []struct {
		name, kind string
		vms        []LabVM
		includes   bench.Includes
	}{
		{bench.VMPath, KindLanekit, s.VMs, includesLanekitVM()},
		{bench.TapVMPath, KindBaseline, s.TapVMs, IncludesTapVM},
	}
	for _, row := range vmRows {
		if len(row.vms) == 0 {
			continue
		}
		v := row.vms[0]
		from := n1
		if v.Node == n1.Index { // `lab up --vm-node 1`: the client is node 2's
			from = n2
		}
		c, ok := firstPod(from, row.kind)
		switch {
		case !ok:
			skipped = append(skipped, fmt.Sprintf("%s: no %s pod on %s", row.name, row.kind, from.NS))
		case v.Node == from.Index:
			skipped = append(skipped, fmt.Sprintf("%s: %s is on %s, not across nodes", row.name, v.Name, from.NS))
		case v.IP == "" || v.SerialSocket == "":
			skipped = append(skipped, fmt.Sprintf("%s: %s has no address or console", row.name, v.Name))
		default:
			note := TCGNote
			if v.BackendNS != "" && v.BackendNS != v.NS {
				note = fmt.Sprintf("to %s on %s, whose fast lane runs on its DPU %s; %s", v.Name, NodeNS(v.Node), v.BackendNS, TCGNote)
			}
			paths = append(paths, bench.Path{Name: row.name, ClientNS: c.NS, ServerNS: v.NS, ServerIP: v.IP,
				Guest: &bench.Guest{Name: v.Name, Serial: v.SerialSocket}, Note: note, Includes: row.includes,
				CPUParts: vmCPUParts(v)})
		}
	}
	return s.routingRows(s.dpuRows(paths)), skipped
}

// vmCPUParts are the processes of a guest whose host CPU the bench reports
// on its own: its backend (the fast lane) and its QEMU without the vCPUs
// (main loop, I/O; with a tap, QEMU's own virtio-net).
func vmCPUParts(v LabVM) []bench.CPUPart {
	var parts []bench.CPUPart
	if v.BackendPID > 0 {
		parts = append(parts, bench.CPUPart{Name: "lanekit-vhost", PID: v.BackendPID})
	}
	if v.QEMUPID > 0 {
		parts = append(parts, bench.CPUPart{Name: "qemu without vCPUs", PID: v.QEMUPID})
	}
	return parts
}

// includesLanekitVM is the VM row's label for the receive path the lab's
// backends run (RxGSOEnv).
func includesLanekitVM() bench.Includes {
	if os.Getenv(RxGSOEnv) == "xdp" {
		return IncludesLanekitVM
	}
	return IncludesLanekitVMKernel
}

// What each row's traffic goes through between the two endpoints (the
// bench table prints these labels): only host-raw is the bare link.
var (
	IncludesRaw  = bench.Includes{Detail: "raw hosts on the wire bridge, no rules: the physical limit"}
	IncludesHost = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "node to node through both nodes' kube-proxy-style rules (OUTPUT/INPUT chains; the lab's stand-in, not kube-proxy)"}
	IncludesBridge = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "pod veth, Linux bridge, node forwarding with kube-proxy-style (the lab's stand-in) + bridge plugin rules on both nodes"}
	IncludesLanekitPod = bench.Includes{BPF: true,
		Detail: "tcx redirect_neigh/redirect_peer past both nodes' netfilter; packets the program hands to the kernel pay it"}
	IncludesLanekitVM = bench.Includes{BPF: true,
		Detail: "lanekit pod to the fast-lane guest: tcx + steer_vm + AF_XDP, TCG guest"}
	// IncludesLanekitVMKernel: the VM path with --rx-gso kernel (the
	// default; IncludesLanekitVM: RxGSOEnv=xdp).
	IncludesLanekitVMKernel = bench.Includes{BPF: true,
		Detail: "lanekit pod to the fast-lane guest: tcx + AF_PACKET (whole GSO packets, --rx-gso kernel), TCG guest"}
	IncludesTapVM = bench.Includes{Netfilter: true, Conntrack: true,
		Detail: "baseline pod to a tap guest on the baseline bridge, TCG guest"}
)

// HasVM reports whether the lab runs a fast-lane guest.
func (s *State) HasVM() bool { return len(s.VMs) > 0 }

// GuestQEMUPIDs are the QEMU processes of every guest in the lab (fast
// lane and tap): the bench's host CPU figures exclude their vCPU threads.
func (s *State) GuestQEMUPIDs() []int {
	var pids []int
	for _, v := range append(append([]LabVM(nil), s.VMs...), s.TapVMs...) {
		if v.QEMUPID > 0 {
			pids = append(pids, v.QEMUPID)
		}
	}
	return pids
}

func firstPod(n Node, kind string) (Pod, bool) {
	for _, p := range n.Pods {
		if p.Kind == kind && p.IP != "" {
			return p, true
		}
	}
	return Pod{}, false
}
