package lab

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/bench"
)

// TCGNote labels the guest rows: QEMU here has no KVM, so the guest CPU is
// emulated and the guest, not the datapath, bounds these figures.
const TCGNote = "guest under TCG (software-emulated CPU, no KVM): the guest is the bottleneck; compare VM rows with each other, not with pods"

// BenchPaths returns the cross-node rows the lab offers (node1 -> node2; VMs are on the last node):
// host, bridge-iptables and lanekit-pod when their pods exist, and with
// `lab up --vm` lanekit-vm (lanekit pod -> the fast-lane guest) and
// bridge-tap-vm (baseline pod -> the tap guest), whose servers run inside
// the guests. The second value lists rows that were skipped and why.
func (s *State) BenchPaths() ([]bench.Path, []string) {
	if len(s.Nodes) < 2 {
		return nil, []string{"the lab has fewer than 2 nodes"}
	}
	n1, n2 := s.Nodes[0], s.Nodes[1]
	paths := []bench.Path{{Name: bench.HostPath, ClientNS: n1.NS, ServerNS: n2.NS, ServerIP: n2.UnderlayIP}}
	var skipped []string
	for _, row := range []struct{ name, kind string }{
		{"bridge-iptables", KindBaseline},
		{"lanekit-pod", KindLanekit},
	} {
		c, okc := firstPod(n1, row.kind)
		sv, oks := firstPod(n2, row.kind)
		if !okc || !oks {
			skipped = append(skipped, fmt.Sprintf("%s: no %s pods on %s and %s", row.name, row.kind, n1.NS, n2.NS))
			continue
		}
		paths = append(paths, bench.Path{Name: row.name, ClientNS: c.NS, ServerNS: sv.NS, ServerIP: sv.IP})
	}
	vmRows := []struct {
		name, kind string
		vms        []LabVM
	}{
		{"lanekit-vm", KindLanekit, s.VMs},
		{"bridge-tap-vm", KindBaseline, s.TapVMs},
	}
	for _, row := range vmRows {
		if len(row.vms) == 0 {
			continue
		}
		v := row.vms[0]
		c, ok := firstPod(n1, row.kind)
		switch {
		case !ok:
			skipped = append(skipped, fmt.Sprintf("%s: no %s pod on %s", row.name, row.kind, n1.NS))
		case v.Node == n1.Index:
			skipped = append(skipped, fmt.Sprintf("%s: %s is on %s, not across nodes", row.name, v.Name, n1.NS))
		case v.IP == "" || v.SerialSocket == "":
			skipped = append(skipped, fmt.Sprintf("%s: %s has no address or console", row.name, v.Name))
		default:
			paths = append(paths, bench.Path{Name: row.name, ClientNS: c.NS, ServerNS: v.NS, ServerIP: v.IP,
				Guest: &bench.Guest{Name: v.Name, Serial: v.SerialSocket}, Note: TCGNote})
		}
	}
	return paths, skipped
}

// HasVM reports whether the lab runs a fast-lane guest.
func (s *State) HasVM() bool { return len(s.VMs) > 0 }

func firstPod(n Node, kind string) (Pod, bool) {
	for _, p := range n.Pods {
		if p.Kind == kind && p.IP != "" {
			return p, true
		}
	}
	return Pod{}, false
}
