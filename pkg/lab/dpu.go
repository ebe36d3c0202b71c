package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/dpu"
)

// The mixed lab (issue 28, `lab up --dpu-nodes N`): nodes 1..N get a DPU,
// the others stay as they are. A DPU is a namespace lk-n<i>-d1 between the
// node's namespace and the wire, a router like a SmartNIC's eswitch in
// front of its host: the wire port eth0 (the datapath's uplink) carries the
// DPU's own address (DPUIP) and answers ARP for the node's underlay address
// (proxy ARP), the host's PF (lk-pf, the node's eth0 on the other end) has
// the node's address routed to it. What is not for a pod passes through the
// DPU's stack to the host; pods are the datapath's. The DPU agent (lanekitd
// --mode dpu) owns the node's pod CIDR and the BPF datapath, with VFs made
// as veth pairs into the node's namespace; the node's agent is lanekitd
// --mode host. The link is mutual TLS with certificates the lab makes (a CA
// per DPU).

// DPU is a node's DPU in the lab state.
type DPU struct {
	NS       string `json:"netns"`
	IP       string `json:"ip"`
	AgentPID int    `json:"agent_pid,omitempty"`
}

// DPU names and addresses.
const (
	DPUPF   = "lk-pf" // the host PF's representor on the DPU
	DPUPort = 7443    // the link's TCP port
	maxDPUs = 19
)

// DPUNS is node i's DPU namespace.
func DPUNS(i int) string { return fmt.Sprintf("lk-n%d-d1", i) }

// DPUIP is node i's DPU address on the underlay.
func DPUIP(i int) string { return fmt.Sprintf("10.77.0.%d", 230+i) }

// DPUDir holds the DPU agent's pid, log, socket, state and certificates.
func DPUDir(i int) string { return filepath.Join(RunDir, DPUNS(i)) }

// DPUSocket is the DPU agent's API socket (the CLI on the DPU side).
func DPUSocket(i int) string { return filepath.Join(DPUDir(i), "agent.sock") }

// DPULog is the DPU agent's log.
func DPULog(i int) string { return filepath.Join(DPUDir(i), "agent.log") }

// DPUBPFDir is the DPU's pin directory (under the node's name, so lab down
// removes it with the nodes').
func DPUBPFDir(i int) string { return filepath.Join(BPFRoot, NodeNS(i)+"-dpu") }

func dpuCerts(i int) dpu.CertSet { return dpu.CertSet{Dir: filepath.Join(DPUDir(i), "certs")} }

// IsDPUNode says whether node i has a DPU (its namespace exists).
func IsDPUNode(i int) bool { return netnsExists(DPUNS(i)) }

func (cfg Config) checkDPU() error {
	if cfg.DPUNodes == 0 {
		return nil
	}
	switch {
	case cfg.DPUNodes < 0 || cfg.DPUNodes > cfg.Nodes || cfg.DPUNodes > maxDPUs:
		return fmt.Errorf("--dpu-nodes %d: want 0..%d (at most --nodes)", cfg.DPUNodes, min(cfg.Nodes, maxDPUs))
	case cfg.Kubelet:
		return errors.New("--dpu-nodes: not with --kubelet (real nodes run the DaemonSet's local agents; --k8s runs the DPU agent against the API server)")
	case cfg.BaselineOnly:
		return errors.New("--dpu-nodes needs the agents (not --baseline-only)")
	case cfg.IPFamily != "" && cfg.IPFamily != IPFamilyIPv4:
		return errors.New("--dpu-nodes: IPv4 only")
	case cfg.routing() != RoutingNative || cfg.underlay() == UnderlayRouted:
		return errors.New("--dpu-nodes: native routing on the bridged underlay only")
	case cfg.VM && cfg.K8s && cfg.vmNode() <= cfg.DPUNodes:
		return errors.New("--dpu-nodes: a KubeVirt VM (--k8s --vm) on a DPU node is not supported yet (CNI VM attachments on the DPU)")
	}
	return nil
}

// buildDPU puts a DPU between node i (built by buildNode) and the wire:
// the node's wire port moves into the DPU as its PF representor, a new
// wire port becomes the DPU's uplink, and the DPU gets its address, proxy
// ARP for the node, the routes to the node, its baseline pods and the other
// nodes, and the link's certificates. The node routes its own pod CIDR
// through the DPU.
func buildDPU(ctx context.Context, i, n int) error {
	d := DPUNS(i)
	if err := addNetns(ctx, d); err != nil {
		return fmt.Errorf("dpu %s: %w", d, err)
	}
	wirePort := fmt.Sprintf("lk-w%d", i)
	steps := [][]string{
		{"-n", WireNS, "link", "set", wirePort, "nomaster"},
		{"-n", WireNS, "link", "set", wirePort, "netns", d},
		{"-n", d, "link", "set", wirePort, "name", DPUPF},
		{"link", "add", "name", Uplink, "netns", d, "type", "veth", "peer", "name", wirePort, "netns", WireNS},
		{"-n", WireNS, "link", "set", wirePort, "master", WireBridge, "up"},
		{"-n", d, "addr", "add", DPUIP(i) + "/24", "dev", Uplink},
		{"-n", d, "link", "set", Uplink, "up"},
		{"-n", d, "link", "set", DPUPF, "up"},
		{"-n", d, "route", "add", UnderlayIP(i) + "/32", "dev", DPUPF},
		{"-n", d, "route", "add", BaseCIDR(i), "via", UnderlayIP(i), "dev", DPUPF},
		{"-n", NodeNS(i), "route", "add", PodCIDR(i), "via", DPUIP(i), "dev", Uplink},
	}
	for j := 1; j <= n; j++ {
		if j != i {
			steps = append(steps,
				[]string{"-n", d, "route", "add", PodCIDR(j), "via", UnderlayIP(j), "dev", Uplink},
				[]string{"-n", d, "route", "add", BaseCIDR(j), "via", UnderlayIP(j), "dev", Uplink})
		}
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			return fmt.Errorf("dpu %s: %w", d, err)
		}
	}
	if err := wireBIGTCP(wirePort); err != nil {
		return fmt.Errorf("dpu %s: %w", d, err)
	}
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv4.conf." + Uplink + ".proxy_arp", "net.ipv4.conf." + DPUPF + ".proxy_arp"} {
		if err := sysctl(ctx, d, k, "1"); err != nil {
			return fmt.Errorf("dpu %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(DPUDir(i), 0o755); err != nil {
		return fmt.Errorf("dpu %s: %w", d, err)
	}
	if err := dpuCerts(i).WriteCerts(DPUIP(i), []net.IP{net.ParseIP(DPUIP(i))}, NodeNS(i), 30*24*time.Hour); err != nil {
		return fmt.Errorf("dpu %s: %w", d, err)
	}
	return nil
}

// dpuAgentArgs are the DPU agent's flags for node i.
func dpuAgentArgs(i int) []string {
	c := dpuCerts(i).DPU()
	args := []string{
		"--mode", "dpu", "--dpu-listen", net.JoinHostPort(DPUIP(i), fmt.Sprint(DPUPort)),
		"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA,
		"--vf-kind", "veth", "--vf-host-netns", netnsPath(NodeNS(i)),
		"--state-dir", DPUDir(i) + "/state", "--socket", DPUSocket(i),
		"--uplink", Uplink, "--node-addr", UnderlayIP(i),
		"--bpf-dir", DPUBPFDir(i), "--socket-lb=false", "--service-health-checks=false",
		"--vm-socket-dir", DPUDir(i) + "/vm", "--dpu-name", DPUNS(i),
		// The one host whose certificate (WriteCerts: NodeNS(i)) may call.
		"--dpu-host-identity", NodeNS(i),
		// A VM's device namespace on the DPU: /run/netns/lk-n<i>-d1-<vm>
		// (lab down removes it with the lab's namespaces).
		"--vm-netns-dir", "/run/netns",
	}
	return append(args, dpuPodCIDRArgs(i)...) // --pod-cidr, or the host's Node (dpu_k8s.go)
}

// hostAgentArgs are node i's agent flags when it has a DPU.
func hostAgentArgs(i int) []string {
	c := dpuCerts(i).Host()
	return []string{
		"--mode", "host", "--dpu-addr", net.JoinHostPort(DPUIP(i), fmt.Sprint(DPUPort)),
		"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA, "--host-id", NodeNS(i),
		"--socket", AgentSocket(i),
	}
}

// StartDPUAgent starts node i's DPU agent and waits for its socket.
func StartDPUAgent(ctx context.Context, b Bins, i int) (int, error) {
	if err := ensureNodeCgroup(i); err != nil {
		return 0, err
	}
	pid, err := startAgentDaemon(DPUNS(i), NodeCgroup(i), filepath.Join(DPUDir(i), "agent"), b.Agent(), dpuAgentArgs(i))
	if err != nil {
		return pid, fmt.Errorf("start the DPU agent on %s: %w", DPUNS(i), err)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return pid, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if !alive(pid) {
			return pid, fmt.Errorf("the DPU agent on %s exited; log: %s", DPUNS(i), logTail(DPULog(i)))
		}
		if c, err := net.DialTimeout("unix", DPUSocket(i), time.Second); err == nil {
			c.Close()
			return pid, nil
		}
	}
	return pid, fmt.Errorf("the DPU agent on %s: no socket after 20s; log: %s", DPUNS(i), logTail(DPULog(i)))
}

// agentArgsFor is node i's agent command line: the host agent's on a DPU
// node.
func agentArgsFor(i int, k8s bool) []string {
	if IsDPUNode(i) {
		return hostAgentArgs(i)
	}
	return append(agentArgs(i, k8s), labRoutingArgs(i)...)
}

// upDPUAgent starts the DPU agent of node n (before its host agent) and
// records it.
func upDPUAgent(ctx context.Context, cfg Config, st *State, n *Node) error {
	if !IsDPUNode(n.Index) {
		return nil
	}
	pid, err := StartDPUAgent(ctx, cfg.Bins, n.Index)
	n.DPU = &DPU{NS: DPUNS(n.Index), IP: DPUIP(n.Index), AgentPID: pid}
	if serr := st.save(); serr != nil && err == nil {
		err = serr
	}
	if err == nil {
		progress(cfg.Out, "lab: DPU agent on %s pid %d (%s:%d), socket %s", DPUNS(n.Index), pid, DPUIP(n.Index), DPUPort, DPUSocket(n.Index))
	}
	return err
}

// dpuRows marks the bench's lanekit-pod row when node 1 has a DPU (its
// sender's datapath runs there) and, with a third node, adds the same row
// between two plain nodes (node 2 -> node 3) to set next to it.
func (s *State) dpuRows(paths []bench.Path) []bench.Path {
	if len(s.Nodes) < 2 || s.Nodes[0].DPU == nil {
		return paths
	}
	for i := range paths {
		if paths[i].Name == "lanekit-pod" {
			paths[i].Note = fmt.Sprintf("from %s, whose datapath runs on its DPU %s", s.Nodes[0].NS, s.Nodes[0].DPU.NS)
		}
	}
	if len(s.Nodes) < 3 || s.Nodes[1].DPU != nil || s.Nodes[2].DPU != nil {
		return paths
	}
	c, okc := firstPod(s.Nodes[1], KindLanekit)
	sv, oks := firstPod(s.Nodes[2], KindLanekit)
	if okc && oks {
		paths = append(paths, bench.Path{Name: "lanekit-pod-plain", ClientNS: c.NS, ServerNS: sv.NS, ServerIP: sv.IP,
			Includes: IncludesLanekitPod, Note: fmt.Sprintf("%s -> %s, plain nodes: next to lanekit-pod from the DPU node", s.Nodes[1].NS, s.Nodes[2].NS)})
	}
	return paths
}
