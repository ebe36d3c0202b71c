package lab

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Up builds the lab described by cfg. A previous lab (or the debris of a
// failed one) is torn down first. On failure the partial lab stays for
// inspection; Down removes it.
func Up(ctx context.Context, cfg Config) (*State, error) {
	beforeLab()
	family, err := cfg.check()
	if err != nil {
		return nil, fmt.Errorf("lab up: %w", err)
	}
	if Exists() {
		progress(cfg.Out, "lab: removing the previous lab")
		if err := Down(ctx, DownOptions{Bins: cfg.Bins}); err != nil {
			return nil, fmt.Errorf("lab up: clean previous lab: %w", err)
		}
	}
	start := time.Now()
	if err := os.MkdirAll(CNICacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("lab up: %w", err)
	}
	st := &State{BaselineOnly: cfg.BaselineOnly, K8s: cfg.K8s, Kubelet: cfg.Kubelet, KubeVirt: cfg.KubeVirt, CNI: cfg.CNI, Routing: cfg.routing(), Underlay: cfg.underlay()}
	if family != IPFamilyIPv4 {
		st.IPFamily = family
	}
	if err := st.save(); err != nil {
		return nil, fmt.Errorf("lab up: %w", err)
	}

	build := buildWire
	progress(cfg.Out, "lab: underlay %s with bridge %s", WireNS, WireBridge)
	if cfg.underlay() == UnderlayRouted {
		build = buildRouter
		progress(cfg.Out, "lab: routed underlay: router %s (%s), a /32 per node, no pod routes; agents route %s", WireNS, RouterIP, cfg.routing())
	}
	if err := build(ctx); err != nil {
		return st, fmt.Errorf("lab up: %w", err)
	}
	var kc kubernetes.Interface
	if cfg.K8s {
		var err error
		if kc, err = upK8s(ctx, cfg); err != nil {
			return st, fmt.Errorf("lab up: %w", err)
		}
	}
	if err := upNodes(ctx, cfg, st); err != nil {
		return st, fmt.Errorf("lab up: %w", err)
	}
	if cfg.Kubelet {
		// Real nodes: the agents are the DaemonSet's pods, pods come from
		// the cluster's users.
		if err := upRealNodes(ctx, cfg, st, kc); err != nil {
			return st, fmt.Errorf("lab up: %w", err)
		}
		progress(cfg.Out, "lab: up in %s: %d real nodes", time.Since(start).Round(100*time.Millisecond), len(st.Nodes))
		return st, nil
	}
	if err := upAgents(ctx, cfg, st); err != nil {
		return st, fmt.Errorf("lab up: %w", err)
	}
	if err := upPods(ctx, cfg, st, kc); err != nil {
		return st, fmt.Errorf("lab up: %w", err)
	}
	if cfg.VM {
		if err := upVMs(ctx, cfg, st, kc); err != nil {
			return st, fmt.Errorf("lab up: %w", err)
		}
	}
	progress(cfg.Out, "lab: up in %s: %d nodes, %d pods, %d VMs", time.Since(start).Round(100*time.Millisecond),
		len(st.Nodes), len(st.PodsOf(KindLanekit))+len(st.PodsOf(KindBaseline)), len(st.VMs)+len(st.TapVMs))
	return st, nil
}

// check refuses a configuration lab up cannot build, before anything is
// made, and returns the lab's IP family.
func (cfg Config) check() (string, error) {
	if cfg.Nodes < 1 || cfg.Nodes > 200 {
		return "", fmt.Errorf("--nodes must be 1..200, got %d", cfg.Nodes)
	}
	if cfg.PodsPerNode < 1 || cfg.PodsPerNode > 100 {
		return "", fmt.Errorf("--pods-per-node must be 1..100, got %d", cfg.PodsPerNode)
	}
	if err := cfg.Bins.checkBaseline(); err != nil {
		return "", err
	}
	if cfg.Kubelet && (!cfg.K8s || cfg.VM || cfg.BaselineOnly) {
		return "", fmt.Errorf("--kubelet needs --k8s, and no --vm or --baseline-only")
	}
	if err := cfg.checkKubeVirt(); err != nil {
		return "", err
	}
	if err := cfg.checkInstall(); err != nil {
		return "", err
	}
	if err := cfg.checkRouting(); err != nil {
		return "", err
	}
	if err := cfg.checkCNI(); err != nil {
		return "", err
	}
	if err := cfg.checkServiceCIDR(); err != nil {
		return "", err
	}
	if err := cfg.checkDPU(); err != nil {
		return "", err
	}
	if err := cfg.checkVMNode(); err != nil {
		return "", err
	}
	if cfg.K8s && cfg.BaselineOnly {
		return "", fmt.Errorf("--k8s needs the agents (not --baseline-only)")
	}
	if cfg.VM && cfg.BaselineOnly {
		return "", fmt.Errorf("--vm needs the agents (not --baseline-only)")
	}
	if !cfg.BaselineOnly {
		if err := cfg.Bins.checkLanekit(); err != nil {
			return "", err
		}
	}
	return checkIPFamily(cfg)
}

// upNodes builds the nodes' namespaces (and their DPUs, IPv6 and raw
// hosts), recording each in st as it goes.
func upNodes(ctx context.Context, cfg Config, st *State) error {
	for i := 1; i <= cfg.Nodes; i++ {
		progress(cfg.Out, "lab: node %s underlay %s, pods %s, baseline %s", NodeNS(i), UnderlayIP(i), PodCIDR(i), BaseCIDR(i))
		if err := os.MkdirAll(NodeDir(i), 0o755); err != nil {
			return err
		}
		st.Nodes = append(st.Nodes, Node{Index: i, NS: NodeNS(i), UnderlayIP: UnderlayIP(i),
			PodCIDR: PodCIDR(i), BaseCIDR: BaseCIDR(i)})
		if err := st.save(); err != nil {
			return err
		}
		buildN, buildRaw := buildNode, buildRawHost
		if cfg.underlay() == UnderlayRouted {
			buildN, buildRaw = func(ctx context.Context, i, n int, _, standIns bool) error {
				return buildRoutedNode(ctx, i, n, standIns)
			}, buildRoutedRawHost
		}
		if err := buildN(ctx, i, cfg.Nodes, cfg.K8s, !cfg.Kubelet); err != nil {
			return err
		}
		if i <= cfg.DPUNodes {
			progress(cfg.Out, "lab: DPU %s (%s) between %s and the wire", DPUNS(i), DPUIP(i), NodeNS(i))
			if err := buildDPU(ctx, i, cfg.Nodes); err != nil {
				return err
			}
			if cfg.K8s {
				if err := buildDPUK8s(ctx, i, cfg.Nodes); err != nil { // dpu_k8s.go
					return err
				}
			}
		}
		if st.HasIPv6() {
			n := &st.Nodes[len(st.Nodes)-1]
			n.UnderlayIP6, n.PodCIDR6 = UnderlayIP6(i), PodCIDR6(i)
			if err := buildNodeIPv6(ctx, i, cfg.Nodes, cfg.K8s); err != nil {
				return err
			}
		}
		if cfg.Nodes >= 2 && i <= RawHosts {
			if err := buildRaw(ctx, i); err != nil {
				return err
			}
			n := &st.Nodes[len(st.Nodes)-1]
			n.RawNS, n.RawIP = RawNS(i), RawIP(i)
			if st.HasIPv6() && cfg.underlay() != UnderlayRouted {
				if err := buildRawHostIPv6(ctx, i); err != nil { // bench6.go
					return err
				}
				n.RawIP6 = RawIP6(i)
			}
			if err := st.save(); err != nil {
				return err
			}
		}
	}
	return nil
}

// upAgents starts each node's agent (and its DPU's) and, with --k8s, its
// kubelet, recording their PIDs in st as they start.
func upAgents(ctx context.Context, cfg Config, st *State) error {
	if cfg.BaselineOnly {
		return nil
	}
	for k := range st.Nodes {
		n := &st.Nodes[k]
		if err := upDPUAgent(ctx, cfg, st, n); err != nil {
			return err
		}
		pid, err := startAgent(ctx, cfg.Bins, n.Index, cfg.K8s)
		n.AgentPID = pid
		if serr := st.save(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		progress(cfg.Out, "lab: agent on %s pid %d, socket %s", n.NS, pid, AgentSocket(n.Index))
		if !cfg.K8s {
			continue
		}
		pid, err = startKubelet(cfg.Bins, n.Index)
		n.KubeletPID = pid
		if serr := st.save(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		progress(cfg.Out, "lab: kubelet on %s pid %d (node %s)", n.NS, pid, KubeNodeName(n.Index))
	}
	return nil
}

// upPods makes --pods-per-node pods of each kind on every node: API-created
// (kc) lanekit pods with --k8s, CNI-added ones otherwise.
func upPods(ctx context.Context, cfg Config, st *State, kc kubernetes.Interface) error {
	kinds := []string{KindBaseline}
	if !cfg.BaselineOnly {
		kinds = []string{KindLanekit, KindBaseline}
	}
	for k := range st.Nodes {
		n := &st.Nodes[k]
		for _, kind := range kinds {
			for j := 1; j <= cfg.PodsPerNode; j++ {
				if cfg.K8s && kind == KindLanekit {
					p, err := createLabPod(ctx, kc, n.Index, j)
					if err != nil {
						return err
					}
					n.Pods = append(n.Pods, p)
					if err := st.save(); err != nil {
						return err
					}
					progress(cfg.Out, "lab: pod %s/n%d-p%d (%s, netns %s) %s", PodNamespace, n.Index, j, kind, p.NS, p.IP)
					continue
				}
				ns := PodNS(n.Index, j, kind)
				n.Pods = append(n.Pods, Pod{NS: ns, Kind: kind})
				ip, err := addPod(ctx, cfg.Bins, n.Index, ns, kind)
				n.Pods[len(n.Pods)-1].IP = ip
				if st.HasIPv6() && kind == KindLanekit {
					n.Pods[len(n.Pods)-1].IP6 = podIP6(ctx, ns)
				}
				if serr := st.save(); serr != nil && err == nil {
					err = serr
				}
				if err != nil {
					return err
				}
				progress(cfg.Out, "lab: pod %s (%s) %s", ns, kind, ip)
			}
		}
	}
	return nil
}

// upVMs boots the lab's guests: the fast-lane VM (by KubeVirt's API with
// --k8s), the second VM of a dual-stack lab and, unless --no-std-vm, the
// baseline tap VM.
func upVMs(ctx context.Context, cfg Config, st *State, kc kubernetes.Interface) error {
	up := upVM
	if cfg.K8s {
		up = func(ctx context.Context, cfg Config, st *State, i int) error {
			return upKubeVirtVM(ctx, cfg, st, i, kc)
		}
	}
	if err := up(ctx, cfg, st, cfg.vmNode()); err != nil {
		return err
	}
	if err := upSecondVM(ctx, cfg, st); err != nil { // vm6.go
		return err
	}
	if !cfg.NoStdVM {
		if err := upTapVM(ctx, cfg, st, len(st.Nodes)); err != nil {
			return err
		}
	}
	return nil
}

// Exists reports whether any part of a lab is present.
func Exists() bool {
	beforeLab()
	if _, err := os.Stat(RunDir); err == nil {
		return true
	}
	if _, err := os.Stat(realNodesFile()); err == nil {
		return true // real nodes' cgroups or mount points to remove
	}
	return len(listLabNetns()) > 0 || len(bpfNodeDirs()) > 0
}
