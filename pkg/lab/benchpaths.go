package lab

import (
	"fmt"

	"github.com/lanekit/lanekit/pkg/bench"
)

// BenchPaths returns the cross-node rows (node1 -> node2) the lab offers:
// host, bridge-iptables and lanekit-pod when its pods exist. The second value
// lists rows that were skipped and why.
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
	return paths, skipped
}

func firstPod(n Node, kind string) (Pod, bool) {
	for _, p := range n.Pods {
		if p.Kind == kind && p.IP != "" {
			return p, true
		}
	}
	return Pod{}, false
}
