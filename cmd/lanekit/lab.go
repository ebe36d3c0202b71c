//go:build !nolab

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/lab"
)

var labCmd = &cobra.Command{
	Use:   "lab",
	Short: "Multi-node lab in network namespaces (lk-*) and side-by-side benchmarks",
}

func init() {
	rootCmd.AddCommand(labCmd)
	labCmd.AddCommand(labUpCmd(), labDownCmd(), labStatusCmd(), labCheckCmd(), labBenchCmd(), labPodCmd(), labApplyCmd(), labKubeletCmd(), labNodeCmd(), labScaleCmd())
}

// signalContext is cancelled on SIGINT/SIGTERM so that bounded runs stop cleanly.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func labUpCmd() *cobra.Command {
	var cfg lab.Config
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the lab: underlay, nodes with agents and kube-proxy rules, lanekit and baseline pods",
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			cfg.Bins, cfg.Out = bins, cmd.OutOrStdout()
			ctx, cancel := signalContext()
			defer cancel()
			if _, err := lab.Up(ctx, cfg); err != nil {
				return fmt.Errorf("%w (the partial lab stays for inspection; `lanekit lab down` removes it)", err)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&cfg.Nodes, "nodes", 2, "number of nodes")
	cmd.Flags().IntVar(&cfg.PodsPerNode, "pods-per-node", 2, "pods of each kind per node")
	cmd.Flags().BoolVar(&cfg.BaselineOnly, "baseline-only", false, "no agents and no lanekit pods: only the underlay, nodes and bridge+iptables pods")
	cmd.Flags().BoolVar(&cfg.VM, "vm", false, "add a QEMU guest (TCG) on the last node, on the VM fast lane (vhost-user + AF_XDP)")
	cmd.Flags().IntVar(&cfg.VMQueues, "vm-queues", 1, "the guest's virtio-net queue pairs")
	cmd.Flags().IntVar(&cfg.VMNode, "vm-node", 0, "the node of the fast-lane guest with --vm (default: the last); on a --dpu-nodes node its fast lane runs on the DPU")
	cmd.Flags().BoolVar(&cfg.NoStdVM, "no-std-vm", false, "with --vm: no vm-std, the standard-path guest (bridge + tap, QEMU virtio-net) that lab bench compares against: one TCG guest less")
	cmd.Flags().IntVar(&cfg.VMs, "vms", 1, "fast-lane guests with --vm: 1 on the last node, or 2 (a second on node 1: VM to VM across nodes)")
	cmd.Flags().StringVar(&cfg.Routing, "routing", "", "agents' routing mode: native (a bridged underlay, routes to every pod CIDR; the default, unless $"+lab.RoutingEnv+" says) or tunnel (VXLAN in BPF, on a routed underlay whose router knows no pod CIDR)")
	cmd.Flags().StringVar(&cfg.Underlay, "underlay", "", "bridged or routed (default: routed with --routing tunnel, else bridged); --routing native --underlay routed shows native routing failing there")
	cmd.Flags().BoolVar(&cfg.K8s, "k8s", false, "run against a real kube-apiserver (make k8s-bins): Nodes, agents with --kubeconfig/--node-name, a lab kubelet per node attaching Pods through CNI")
	cmd.Flags().BoolVar(&cfg.Kubelet, "kubelet", false, "with --k8s: real nodes, containerd + kubelet per node (make k8s-node-bins, make k8s-node-images), "+
		"kube-controller-manager, kube-scheduler, lanekit installed with kubectl apply -k deploy/, CoreDNS; no kube-proxy")
	cmd.Flags().BoolVar(&cfg.KubeVirt, "kubevirt", false, "with --kubelet: real KubeVirt "+lab.KubeVirtVersion+" and Multus (make kubevirt-bins, make kubevirt-images), "+
		"lanekit registered as its network binding plugin (deploy/kubevirt/), TCG guests (useEmulation)")
	cmd.Flags().StringVar(&cfg.Install, "install", lab.InstallKustomize, "with --kubelet: how lanekit is installed: kustomize (kubectl apply -k deploy/ through an overlay) or helm (the commands of docs/install.md's \"Install with Helm\", run as written there)")
	cmd.Flags().StringVar(&cfg.LBPool, "lb-pool", "", "with --kubelet: LoadBalancer addresses for lanekit's LB IPAM (CIDRs or FIRST-LAST ranges on the underlay, comma-separated, e.g. 10.77.0.200-10.77.0.239, plus fd00:77::c8-fd00:77::ef with --ip-family dual): deploy/lb applied, lb-ipam and l2-announce on; the underlay namespace reaches the pool from 10.78.0.254 (IPv6: fd00:78::fe), outside the nodes' subnet (every node routes it back), as a client beyond a router")
	cmd.Flags().StringVar(&cfg.CNI, "cni", lab.CNILanekit, "with --kubelet: the cluster's network: "+strings.Join(lab.CNIs, ", ")+
		" (the kube-proxy values: upstream kube-proxy in that mode + flannel, host-gw or with --routing tunnel vxlan; cilium: Cilium v1.19.0 from its Helm chart, kube-proxy replacement, native routing or with --routing tunnel VXLAN, no Envoy; no lanekit agent; make k8s-node-bins k8s-rival-images)")
	cmd.Flags().StringSliceVar(&cfg.Zones, "zones", nil, "with --kubelet: topology.kubernetes.io/zone labels the nodes give themselves, round robin (e.g. a,b,c with --nodes 3: the Topology Hints and Traffic Distribution tests need three zones)")
	cmd.Flags().StringVar(&cfg.ServiceCIDR, "service-cidr", "", "with --k8s: the API server's IPv4 Service range (default 10.96.0.0/16); a wider one holding it, /12 to /16, for lab scale runs past 65,000 Services (e.g. 10.96.0.0/14)")
	cmd.Flags().StringVar(&cfg.IPFamily, "ip-family", lab.IPFamilyIPv4, "address families: ipv4, dual (IPv6 underlay addresses and pod CIDRs beside IPv4; lanekit pods get both) or ipv6 (IPv6-only lanekit pods: the agents get only an IPv6 pod CIDR; no --k8s, --vm or --routing tunnel yet)")
	cmd.Flags().IntVar(&cfg.DPUNodes, "dpu-nodes", 0, "nodes 1..N get a DPU namespace between the node and the wire: the datapath runs there (lanekitd --mode dpu), the node runs lanekitd --mode host (VFs are veth pairs)")
	return cmd
}

// labNodeCmd is a real node's init (PID 1 of the node) that lab up --kubelet starts.
func labNodeCmd() *cobra.Command {
	var spec string
	cmd := &cobra.Command{
		Use:    "node",
		Short:  "A real node's init: mounts, containerd, images, kubelet (started by lab up --k8s --kubelet)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.RunNode(context.Background(), spec, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)))
		},
	}
	cmd.Flags().StringVar(&spec, "spec", "", "the node's node.json")
	_ = cmd.MarkFlagRequired("spec")
	return cmd
}

// labKubeletCmd is the per-node lab kubelet `lab up --k8s` starts.
func labKubeletCmd() *cobra.Command {
	var node int
	cmd := &cobra.Command{
		Use:    "kubelet",
		Short:  "Lab kubelet for one node: attach the Pods bound to it through CNI (started by lab up --k8s)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", lab.Kubeconfig)
			if err != nil {
				return err
			}
			c, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			dc, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			k := &lab.Kubelet{Index: node, Client: c, Dynamic: dc, Bins: bins,
				Log: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("node", lab.KubeNodeName(node))}
			return k.Run(ctx)
		},
	}
	cmd.Flags().IntVar(&node, "node", 0, "lab node index (1-based)")
	_ = cmd.MarkFlagRequired("node")
	return cmd
}

func labDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove everything the lab created (idempotent, also after a failed up)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out := cmd.OutOrStdout()
			err = lab.Down(ctx, lab.DownOptions{Bins: bins, Out: func(f string, a ...any) { fmt.Fprintf(out, f+"\n", a...) }})
			if err == nil {
				fmt.Fprintln(out, "lab: down")
			}
			return err
		},
	}
}

func labStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show nodes, agents and pods with their addresses",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.WriteStatus(context.Background(), cmd.OutOrStdout())
		},
	}
}

func labCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Prove the connectivity matrix (ICMP + TCP) of every pod kind; non-zero exit on any failure",
		RunE: func(cmd *cobra.Command, _ []string) error {
			bins, err := lab.FindBins()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			return lab.Check(ctx, bins, cmd.OutOrStdout())
		},
	}
}

// benchFlags are `lab bench`'s flags.
type benchFlags struct {
	asJSON           bool
	opts             bench.Options
	chart            string
	vmBackend        string
	vhostBin         string
	vmBackendOwnOnly bool
	from             string
	svcCounts        []int
	svcModes         []string
	servicesOnly     bool
	svcTimeout       time.Duration
	svcRepeat        int
	policyCounts     []int
	policiesOnly     bool
	routings         []string
	cnis             []string
	noHostCPU        bool
	bigTCP           bool
	bigTCPOnly       bool
	vmOnly           bool
	noKubeVirt       bool
}

func labBenchCmd() *cobra.Command {
	b := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark host-raw, host, bridge-iptables, lanekit-pod and VM paths side by side (node1 -> node2), and the VM backend vs DPDK",
		Long: `Benchmark the lab's datapaths side by side, interleaved, --repeat times: host-raw (two raw hosts
on the wire: no netfilter rules, no conntrack, the physical limit), host (node to node through the
nodes' kube-proxy rules and conntrack), bridge-iptables, lanekit-pod and, with a lab brought up with
--vm, lanekit-vm (lanekit pod -> fast-lane guest) and bridge-tap-vm (baseline pod -> guest on a tap
on the baseline bridge). On a lab up with --kubevirt, kubevirt-lanekit-vm and kubevirt-bridge-vm: the
same guest booted by real KubeVirt on lanekit's binding and on KubeVirt's bridge and masquerade
bindings over lanekit's pod network (kubevirt-*-vm rows; --no-kubevirt skips them). Guests run under TCG: their rows are bounded by the emulated guest CPU.

Every row is labelled with what its traffic pays for (BPF, netfilter, conntrack). Ratios are paired:
each repetition measures every path back to back, the ratio is taken per repetition, and the table
shows their median (min–max) against host-raw, with the targets checked against it. --busy-cpus
keeps every CPU busy (SCHED_IDLE spinners) during RR so latencies exclude idle-exit.

--vm-backend runs the backend comparison (no lab needed, root + dpdk-testpmd): 64-byte packets/s
and 1500-byte Gbit/s through lanekit-vhost vs DPDK testpmd forwarding between its vhost and af_xdp
PMDs, in a throwaway netns. auto: when the lab has a VM; on: always (also without a lab); off: never;
only: the comparison alone, even with a lab up (vhost/bench/compare.sh runs this).

--big-tcp adds the BIG TCP rows: lanekit pod to pod on node 1 and from node 1 to node 2, 1 and 8
streams (iperf3 -P), per family of the lab, with BIG TCP as the agents set it and off (64 KiB
GSO/GRO on both ends of the pods' veths and the nodes' uplinks, restored as found afterwards, also
on failure or interrupt), interleaved in every repetition; the sending pod's from-pod bytes per
packet show which sizes crossed the datapath. --big-tcp-only measures them alone.`,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(cmd) },
	}
	cmd.Flags().BoolVar(&b.asJSON, "json", false, "print one JSON document instead of the table")
	cmd.Flags().IntVar(&b.opts.Repeat, "repeat", 3, "repetitions (paths interleaved within each)")
	cmd.Flags().DurationVar(&b.opts.Duration, "duration", 5*time.Second, "duration of each measurement")
	cmd.Flags().StringVar(&b.chart, "chart", "", "write a PNG chart (TCP, RR and conn/s panels; guests in their own row) to this file")
	cmd.Flags().IntVar(&b.opts.CPUTCPMbps, "cpu-tcp-mbps", bench.DefaultCPUTCPMbps, "guest rows' host CPU per byte: the fixed TCP rate (Mbit/s) it is measured at, both directions")
	cmd.Flags().BoolVar(&b.noKubeVirt, "no-kubevirt", false, "on a lab up with --kubevirt: skip the KubeVirt rows ("+lab.KubeVirtBenchLanekit+", "+lab.KubeVirtBenchBridge+" and "+lab.KubeVirtBenchMasquerade+
		": a real pod on node 1 to the same guest booted by KubeVirt on node 2 on lanekit's binding and on KubeVirt's bridge and masquerade bindings; VMIs made for the run and deleted after it)")
	cmd.Flags().BoolVar(&b.noHostCPU, "no-host-cpu", false, "skip the guest rows' host CPU measurements (cpu-tcp, cpu-tcp-rev, cpu-rr)")
	cmd.Flags().BoolVar(&b.opts.BusyCPUs, "busy-cpus", false, "keep every CPU busy with SCHED_IDLE spinners during RR, so latencies exclude idle-exit")
	cmd.Flags().BoolVar(&b.opts.BPFCost, "bpf-cost", true, "read every BPF program's run time during each conn/s and RR (sockperf) run (BPF_ENABLE_STATS, root) and report it per connection and per round trip: the datapath's own cost, apart from the client's and the kernel's TCP work; the statistics add a few tens of ns per program run")
	cmd.Flags().StringVar(&b.vmBackend, "vm-backend", "auto", "VM backend vs DPDK comparison: auto (when the lab has a VM), on, off, only (no lab rows)")
	cmd.Flags().StringVar(&b.from, "from", "", "measure nothing: print the table (or --json) and draw --chart of this saved --json report")
	cmd.Flags().BoolVar(&b.vmBackendOwnOnly, "vm-backend-own-only", false, "VM backend comparison: only guest→wire with lanekit-vhost's own sockets (skip the agent path: steer_vm, socket handover, wire→guest)")
	cmd.Flags().IntSliceVar(&b.svcCounts, "services", nil, "service rows: these service counts (e.g. 10,1000,10000), kube-proxy iptables and nftables modes vs lanekit through a VIP")
	cmd.Flags().StringSliceVar(&b.svcModes, "svc-modes", []string{bench.SvcModeIptables, bench.SvcModeNftables, bench.SvcModeLanekit,
		bench.SvcModeIptablesHost, bench.SvcModeNftablesHost, bench.SvcModeLanekitHost},
		"service rows: which datapaths (a -host mode: the client is a process in the node netns, e.g. socket LB vs kube-proxy's nat OUTPUT rules)")
	cmd.Flags().BoolVar(&b.servicesOnly, "services-only", false, "with --services: skip the pod rows")
	cmd.Flags().DurationVar(&b.svcTimeout, "svc-program-timeout", 5*time.Minute, "service rows: bound on one timed full programming step (one iptables-restore of 10,000 services takes longer; the rules are then loaded in chunks, untimed)")
	cmd.Flags().IntVar(&b.svcRepeat, "svc-repeat", 0, "service rows: repetitions (default --repeat)")
	cmd.Flags().IntSliceVar(&b.policyCounts, "policies", nil, "policy rows: lanekit pod to pod with each count of NetworkPolicies selecting the pods (e.g. 0,1000), interleaved with the other pod rows; with --cni, the cross-node row of each network that enforces NetworkPolicy (lanekit, cilium), the policies written through the API server and enforced before each measurement")
	cmd.Flags().BoolVar(&b.policiesOnly, "policies-only", false, "with --policies: skip the other pod rows")
	cmd.Flags().BoolVar(&b.bigTCP, "big-tcp", false, "BIG TCP rows: lanekit pod to pod on one node and across nodes, 1 and 8 streams, with BIG TCP as the agents set it and off (64 KiB GSO/GRO sizes on the same devices, restored after), interleaved")
	cmd.Flags().BoolVar(&b.bigTCPOnly, "big-tcp-only", false, "the BIG TCP rows alone (no other pod rows)")
	cmd.Flags().BoolVar(&b.vmOnly, "vm-only", false, "the guest rows alone (lanekit-vm, bridge-tap-vm, the KubeVirt rows) with host-raw, the baseline of every ratio")
	cmd.Flags().StringSliceVar(&b.routings, "routing", nil, "measure these routing modes' labs (e.g. native,tunnel) interleaved: each repetition brings up a 2-node lab per mode in turn, measures its rows, takes it down (needs no lab up)")
	cmd.Flags().StringSliceVar(&b.cnis, "cni", nil, "measure these networks' real-node labs (lab up --k8s --kubelet --cni, e.g. lanekit,cilium,kube-proxy-iptables,kube-proxy-nftables) lab after lab: each repetition brings up a 2-node lab per network in turn with the same pods, measures host-raw, host, pod-same-node and pod-cross-node, takes it down (needs no lab up; one --routing applies to all); with --services, the service rows instead: per network one lab, API-created Services (first answer of a new one, conn/s, RR through its ClusterIP)")
	cmd.Flags().StringVar(&b.vhostBin, "vhost-bin", "", "lanekit-vhost for the VM backend comparison (default: next to the other binaries)")
	return cmd
}

// run measures what the flags ask for and prints the report.
func (b *benchFlags) run(cmd *cobra.Command) error {
	if b.from != "" {
		rep, other, err := loadReport(b.from)
		if err != nil {
			return err
		}
		if other == nil {
			return b.output(cmd, rep)
		}
		if b.chart != "" {
			return fmt.Errorf("lab bench: --chart: %s is a --cni report (no chart)", b.from)
		}
		if b.asJSON {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(other)
		}
		return other.WriteTable(cmd.OutOrStdout())
	}
	if len(b.cnis) > 0 || len(b.routings) > 0 {
		return b.runOwnLabs(cmd)
	}
	if b.vmBackend != "auto" && b.vmBackend != "on" && b.vmBackend != "off" && b.vmBackend != "only" {
		return fmt.Errorf("lab bench: --vm-backend %q: want auto, on, off or only", b.vmBackend)
	}
	bins, err := lab.FindBins()
	if err != nil {
		return err
	}
	st, err := lab.LoadState()
	switch {
	case b.vmBackend == "only":
		st = &lab.State{}
	case errors.Is(err, lab.ErrNoLab) && b.vmBackend == "on":
		st = &lab.State{}
	case err != nil:
		return fmt.Errorf("lab bench: %w", err)
	}
	b.opts.Self = bins.Self
	b.opts.Progress = cmd.ErrOrStderr()
	ctx, cancel := signalContext()
	defer cancel()
	rep := &bench.Report{Machine: bench.DescribeMachine(), Repeat: b.opts.Repeat, DurationS: b.opts.Duration.Seconds()}
	b.bigTCP = b.bigTCP || b.bigTCPOnly
	if len(st.Nodes) > 0 && !b.servicesOnly && !b.bigTCPOnly {
		if rep, err = b.podRows(ctx, cmd, st); err != nil {
			return err
		}
	}
	if b.vmBackend == "on" || b.vmBackend == "only" || (b.vmBackend == "auto" && st.HasVM()) {
		if b.vhostBin == "" {
			b.vhostBin = filepath.Join(bins.Dir, "lanekit-vhost")
		}
		rep.VMBackend, err = bench.RunBackendCompare(ctx, bench.BackendOptions{
			VhostBin: b.vhostBin, Duration: b.opts.Duration, OwnOnly: b.vmBackendOwnOnly,
			Repeat: b.opts.Repeat, Progress: cmd.ErrOrStderr()})
		switch {
		case errors.Is(err, bench.ErrBackendUnavailable) && b.vmBackend == "auto":
			fmt.Fprintln(cmd.ErrOrStderr(), "lab bench: skipping the VM backend comparison:", err)
		case err != nil:
			return fmt.Errorf("lab bench: %w", err)
		}
	}
	if len(b.svcCounts) > 0 {
		if rep.Services, err = runServiceRows(ctx, cmd, st, b.svcCounts, b.svcModes, b.svcOptions()); err != nil {
			return err
		}
	}
	if b.bigTCP {
		if rep.BigTCP, err = runBigTCPRows(ctx, cmd, st, b.opts); err != nil {
			return err
		}
	}
	if err := b.output(cmd, rep); err != nil {
		return err
	}
	if rep.Failed() {
		return errors.New("lab bench: some measurements failed (see errors)")
	}
	return nil
}

// svcOptions are the service rows' options.
func (b *benchFlags) svcOptions() bench.SvcOptions {
	so := bench.SvcOptions{Options: b.opts, ProgramTimeout: b.svcTimeout}
	if b.svcRepeat > 0 {
		so.Repeat = b.svcRepeat
	}
	return so
}

// runOwnLabs measures --cni's real-node labs or --routing's labs, each
// brought up and down by the bench.
func (b *benchFlags) runOwnLabs(cmd *cobra.Command) error {
	if len(b.cnis) == 0 {
		if len(b.svcCounts) > 0 || len(b.policyCounts) > 0 || b.bigTCP || b.bigTCPOnly || (b.vmBackend != "auto" && b.vmBackend != "off") {
			return errors.New("lab bench: --routing measures the pod rows of its own labs: no --services, --policies, --big-tcp or --vm-backend on|only with it")
		}
		return runRoutingBench(cmd, b.routings, b.opts, b.asJSON, b.chart)
	}
	if (len(b.policyCounts) > 0 && len(b.svcCounts) > 0) || b.bigTCP || b.bigTCPOnly || (b.vmBackend != "auto" && b.vmBackend != "off") || len(b.routings) > 1 {
		return errors.New("lab bench: --cni measures the pod (or --policies) and service rows of its own real-node labs: --policies not with --services, no --big-tcp or --vm-backend on|only, at most one --routing")
	}
	routing := lab.RoutingNative
	if len(b.routings) == 1 {
		routing = b.routings[0]
	}
	if len(b.svcCounts) > 0 {
		return runCNIServiceBench(cmd, b.cnis, routing, b.svcCounts, b.svcOptions(), b.asJSON)
	}
	return runCNIBench(cmd, b.cnis, routing, b.policyCounts, b.policiesOnly, b.opts, b.asJSON, b.chart)
}

// podRows measures the lab's pod and VM rows (with the KubeVirt and policy
// rows when asked), and removes what they added (the KubeVirt rows' VMIs,
// the policies) before it returns.
func (b *benchFlags) podRows(ctx context.Context, cmd *cobra.Command, st *lab.State) (*bench.Report, error) {
	paths, skipped := st.BenchPaths()
	if !b.noHostCPU {
		b.opts.GuestPIDs = st.GuestQEMUPIDs()
	}
	if st.KubeVirt && !b.noKubeVirt && !b.policiesOnly {
		kb, err := st.KubeVirtBenchRows(ctx, func(f string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "lab bench: "+f+"\n", a...) })
		if err != nil {
			return nil, fmt.Errorf("lab bench: the KubeVirt rows: %w", err)
		}
		defer func() {
			if err := kb.Close(); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "lab bench: removing the KubeVirt rows' VMIs:", err)
			}
		}()
		paths = append(paths, kb.Paths...)
		if !b.noHostCPU {
			b.opts.GuestPIDs = append(b.opts.GuestPIDs, kb.GuestPIDs...)
		}
	}
	if b.policiesOnly {
		paths = nil
	}
	if b.vmOnly {
		paths = guestPaths(paths)
	}
	if len(b.policyCounts) > 0 {
		var pskipped []string
		var pcleanup func()
		paths, pskipped, pcleanup = st.PolicyRows(b.policyCounts, paths)
		defer pcleanup()
		skipped = append(skipped, pskipped...)
	}
	for _, s := range skipped {
		fmt.Fprintln(cmd.ErrOrStderr(), "lab bench: skipping", s)
	}
	return bench.Run(ctx, paths, b.opts)
}

// guestPaths keeps the guest rows and host-raw (--vm-only).
func guestPaths(paths []bench.Path) []bench.Path {
	return slices.DeleteFunc(paths, func(p bench.Path) bool { return p.Guest == nil && p.Name != bench.RawPath })
}

// output draws --chart and prints rep as the table or --json.
func (b *benchFlags) output(cmd *cobra.Command, rep *bench.Report) error {
	if b.chart != "" && (len(rep.Rows) > 0 || rep.Services != nil) {
		if err := writeChart(rep, b.chart); err != nil {
			return err
		}
	}
	if b.asJSON {
		return rep.WriteJSON(cmd.OutOrStdout())
	}
	return rep.WriteTable(cmd.OutOrStdout())
}

// runBigTCPRows measures the BIG TCP rows and gives every device its
// GSO/GRO sizes as found back (also on failure or interrupt).
func runBigTCPRows(ctx context.Context, cmd *cobra.Command, st *lab.State, o bench.Options) (_ *bench.BigTCPReport, err error) {
	cases, sw, setup, skipped, err := st.BigTCPRows(ctx)
	for _, s := range skipped {
		fmt.Fprintln(cmd.ErrOrStderr(), "lab bench: skipping BIG TCP", s)
	}
	if err != nil {
		return nil, fmt.Errorf("lab bench: %w", err)
	}
	defer func() {
		if rerr := sw.Restore(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("lab bench: %w", rerr))
		}
	}()
	rep, err := bench.RunBigTCP(ctx, cases, sw, setup, o)
	if err != nil {
		return nil, fmt.Errorf("lab bench: %w", err)
	}
	rep.Skipped = append(skipped, rep.Skipped...)
	return rep, nil
}

// runServiceRows builds the service rows' namespaces, measures them and
// removes the namespaces again (also on failure or interrupt).
func runServiceRows(ctx context.Context, cmd *cobra.Command, st *lab.State, counts []int, modes []string, o bench.SvcOptions) (*bench.SvcReport, error) {
	for _, n := range counts {
		if n < 1 || n > bench.MaxSvcSetSize {
			return nil, fmt.Errorf("lab bench: --services %d: want 1..%d", n, bench.MaxSvcSetSize)
		}
	}
	paths, skipped, cleanup, err := st.ServiceRows(ctx, lab.SvcBench{Counts: counts, Modes: modes})
	if err != nil {
		return nil, fmt.Errorf("lab bench: %w", err)
	}
	defer cleanup()
	for _, s := range skipped {
		fmt.Fprintln(cmd.ErrOrStderr(), "lab bench: skipping service rows", s)
	}
	if len(paths) == 0 {
		return nil, errors.New("lab bench: no service rows to measure")
	}
	rep, err := bench.RunServices(ctx, paths, o)
	if err != nil {
		return nil, fmt.Errorf("lab bench: %w", err)
	}
	return rep, nil
}

// loadReport reads a saved --json report: a lab's (rep, its ratios and
// targets recomputed from its per-repetition values), or one of --cni's own
// labs (other: the pod rows' per-network groups, their ratios recomputed
// too, or the rival service rows), told apart by their top-level keys.
func loadReport(from string) (rep *bench.Report, other interface{ WriteTable(io.Writer) error }, err error) {
	data, err := os.ReadFile(from)
	if err != nil {
		return nil, nil, fmt.Errorf("lab bench: %w", err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, nil, fmt.Errorf("lab bench: parse %s: %w", from, err)
	}
	_, groups := keys["groups"]
	_, machine := keys["machine"]
	switch {
	case groups:
		var g bench.GroupReport
		if err := json.Unmarshal(data, &g); err != nil {
			return nil, nil, fmt.Errorf("lab bench: parse %s: %w", from, err)
		}
		for _, r := range g.Groups {
			if r.Report != nil {
				r.Report.ComputeRatios()
			}
		}
		return nil, &g, nil
	case !machine && keys["rows"] != nil && strings.Contains(string(keys["rows"]), `"services"`):
		var s bench.SvcReport
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, nil, fmt.Errorf("lab bench: parse %s: %w", from, err)
		}
		return nil, &s, nil
	}
	rep = &bench.Report{}
	if err := json.Unmarshal(data, rep); err != nil {
		return nil, nil, fmt.Errorf("lab bench: parse %s: %w", from, err)
	}
	rep.ComputeRatios()
	return rep, nil, nil
}

func writeChart(rep *bench.Report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := rep.WriteChart(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}
