// Package lab builds a multi-node lanekit lab out of network namespaces: an
// underlay bridge (lk-wire), one namespace per node with its agent and
// kube-proxy-like iptables rules, lanekit pods created through the real CNI
// plugin and baseline pods through the reference bridge + host-local plugins.
package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Names and addresses. Everything the lab creates is named lk-; traffic only
// uses the addresses below.
const (
	WireNS      = "lk-wire"
	WireBridge  = "lk-br0"
	BaseBridge  = "lk-cni0"
	RunDir      = "/run/lanekit/lab"
	BPFRoot     = "/sys/fs/bpf/lanekit"
	StateFile   = RunDir + "/lab.json"
	Uplink      = "eth0"
	PodIfName   = "eth0"
	ServiceCIDR = "10.96.0.0/16"
)

// Kinds of pods.
const (
	KindLanekit  = "lanekit"
	KindBaseline = "baseline"
)

// Config describes the lab to build.
type Config struct {
	Nodes        int
	PodsPerNode  int
	BaselineOnly bool // skip agents and lanekit pods
	VM           bool // a QEMU guest on the last node through the fast lane
	VMQueues     int  // its queue pairs (default 1)
	// VMs: fast-lane guests (with VM): 1 (0 too) on the last node; 2 adds
	// "vm2" on node 1, so that VM to VM crosses nodes (lab check).
	VMs int
	// VMNode is the node of the fast-lane VM "vm1" (0: the last node); a
	// DPU node places its fast lane on the DPU (dpu.go).
	VMNode int
	// NoStdVM (with VM): no vm-std, the bridge + tap guest of the standard
	// path (lab bench's bridge-tap-vm row, lab check's baseline VM): one
	// TCG guest less where only the fast lane matters.
	NoStdVM bool
	// K8s runs the lab against a real API server (k8s.go): agents watch
	// it, lab kubelets attach the lanekit pods.
	K8s bool
	// Kubelet (with K8s) runs real nodes instead: containerd and kubelet
	// per node, lanekit installed from deploy/ (realnode.go).
	Kubelet bool
	// Install (with Kubelet): how lanekit is installed, InstallKustomize
	// ("" too) or InstallHelm (realnode_install.go).
	Install string
	// LBPool (with Kubelet and the kustomize install): LoadBalancer addresses
	// (a CIDR or FIRST-LAST on the underlay) for lanekit's LB IPAM, announced
	// by L2 (deploy/lb applied, lb-ipam and l2-announce on).
	LBPool string
	// IPFamily: IPFamilyIPv4 ("" too) or IPFamilyDual (ipfamily.go).
	IPFamily string
	// ServiceCIDR (with K8s): the API server's IPv4 Service range, ""
	// ServiceCIDR; a wider one holding it for scale runs (k8s.go).
	ServiceCIDR string
	// Zones (with Kubelet): node i's topology.kubernetes.io/zone is
	// Zones[(i-1) % len] (realnode.go).
	Zones []string
	// Routing is the agents' routing mode (RoutingNative, RoutingTunnel;
	// "" native) and Underlay the network between the nodes
	// (UnderlayBridged, UnderlayRouted; "": routed with the tunnel): see
	// tunnel.go.
	Routing  string
	Underlay string
	// DPUNodes: nodes 1..DPUNodes get a DPU (dpu.go).
	DPUNodes int
	// KubeVirt (with Kubelet) adds real KubeVirt and Multus, lanekit
	// registered as a network binding plugin (kubevirt.go).
	KubeVirt bool
	// CNI (with Kubelet) is the cluster's network: CNILanekit ("" too) or
	// a rival (rivals.go: kube-proxy + flannel, no lanekit agent).
	CNI  string
	Bins Bins
	Out  io.Writer // progress lines
}

// State is what `lab up` built, kept in StateFile for status, check, bench
// and down.
type State struct {
	Nodes        []Node `json:"nodes"`
	BaselineOnly bool   `json:"baseline_only"`
	K8s          bool   `json:"k8s,omitempty"`
	Kubelet      bool   `json:"kubelet,omitempty"`
	// KubeVirt: real KubeVirt and Multus run (Config.KubeVirt).
	KubeVirt bool `json:"kubevirt,omitempty"`
	// CNI is Config.CNI ("": lanekit).
	CNI      string `json:"cni,omitempty"`
	IPFamily string `json:"ip_family,omitempty"` // "": ipv4
	// Routing and Underlay as configured (empty: native, bridged).
	Routing  string  `json:"routing,omitempty"`
	Underlay string  `json:"underlay,omitempty"`
	VMs      []LabVM `json:"vms,omitempty"`
	// TapVMs are guests on the standard path (tap on the baseline bridge,
	// QEMU's userspace virtio-net), for the benchmark; see vmtap.go.
	TapVMs []LabVM `json:"tap_vms,omitempty"`
	// NamedPods were added with `lanekit lab pod add` (labpod.go).
	NamedPods []NamedPod `json:"named_pods,omitempty"`
}

// Node is one node namespace.
type Node struct {
	Index      int    `json:"index"`
	NS         string `json:"netns"`
	UnderlayIP string `json:"underlay_ip"`
	PodCIDR    string `json:"pod_cidr"`
	BaseCIDR   string `json:"baseline_cidr"`
	AgentPID   int    `json:"agent_pid,omitempty"`
	KubeletPID int    `json:"kubelet_pid,omitempty"`
	Pods       []Pod  `json:"pods"`
	// RawNS and RawIP: the raw host beside the node (see RawNS), if any.
	RawNS string `json:"raw_netns,omitempty"`
	RawIP string `json:"raw_ip,omitempty"`
	// RawIP6: the raw host's IPv6 address in a lab with IPv6 (bench6.go).
	RawIP6 string `json:"raw_ip6,omitempty"`
	// UnderlayIP6 and PodCIDR6: a dual-stack lab's IPv6 side.
	UnderlayIP6 string `json:"underlay_ip6,omitempty"`
	PodCIDR6    string `json:"pod_cidr6,omitempty"`
	// DPU: the node's DPU, if it has one (dpu.go).
	DPU *DPU `json:"dpu,omitempty"`
}

// Pod is one pod namespace.
type Pod struct {
	NS   string `json:"netns"`
	Kind string `json:"kind"`
	IP   string `json:"ip"`
	IP6  string `json:"ip6,omitempty"` // lanekit pods of a dual-stack lab
}

// NodeNS is the namespace of node i (1-based).
func NodeNS(i int) string { return fmt.Sprintf("lk-node%d", i) }

// PodNS is the namespace of pod j on node i of a kind.
func PodNS(i, j int, kind string) string {
	if kind == KindBaseline {
		return fmt.Sprintf("lk-n%d-b%d", i, j)
	}
	return fmt.Sprintf("lk-n%d-p%d", i, j)
}

// UnderlayIP is node i's address on the wire.
func UnderlayIP(i int) string { return fmt.Sprintf("10.77.0.%d", i) }

// PodCIDR is node i's lanekit pod range.
func PodCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// BaseCIDR is node i's baseline pod range.
func BaseCIDR(i int) string { return fmt.Sprintf("10.245.%d.0/24", i) }

// NodeDir holds node i's pid, log, socket and agent state.
func NodeDir(i int) string { return filepath.Join(RunDir, NodeNS(i)) }

// AgentSocket is node i's agent API socket.
func AgentSocket(i int) string { return filepath.Join(NodeDir(i), "agent.sock") }

// AgentPIDFile and AgentLog are the daemon's pid and log files.
func AgentPIDFile(i int) string { return filepath.Join(NodeDir(i), "agent.pid") }

// AgentLog is the agent's log file.
func AgentLog(i int) string { return filepath.Join(NodeDir(i), "agent.log") }

// BPFDir is node i's pin directory.
func BPFDir(i int) string { return filepath.Join(BPFRoot, NodeNS(i)) }

// ErrNoLab means no lab state exists.
var ErrNoLab = errors.New("no lab is up (run `lanekit lab up`)")

// LoadState reads StateFile.
func LoadState() (*State, error) {
	beforeLab()
	data, err := os.ReadFile(StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoLab
	}
	if err != nil {
		return nil, fmt.Errorf("read lab state: %w", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parse lab state %s: %w", StateFile, err)
	}
	return &s, nil
}

// save writes StateFile atomically.
func (s *State) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode lab state: %w", err)
	}
	tmp := StateFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write lab state: %w", err)
	}
	if err := os.Rename(tmp, StateFile); err != nil {
		return fmt.Errorf("write lab state: %w", err)
	}
	return nil
}

// PodsOf returns the pods of a kind across all nodes, node by node.
func (s *State) PodsOf(kind string) []Pod {
	var out []Pod
	for _, n := range s.Nodes {
		for _, p := range n.Pods {
			if p.Kind == kind {
				out = append(out, p)
			}
		}
	}
	return out
}

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
