package main

import (
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/deviceplugin"
	"github.com/lanekit/lanekit/pkg/service"
)

// daemonFlags is lanekitd's command line: the agent's Config and what the
// daemon runs beside the agent.
type daemonFlags struct {
	cfg      agent.Config
	podCIDRs []string // --pod-cidr, one per family (podcidr.go)
	logJSON  bool
	verbose  bool
	metrics  string
	pprofAt  string
	memRatio float64
	kube     kubeFlags
	lb       lbFlags   // --lb-ipam, --l2-announce (lbipam.go)
	mode     modeFlags // --mode host|dpu (mode.go)

	cgroupRoot string
	sockLB     bool
	snatPorts  string

	devicePluginDir string
}

// addFlags registers every flag on fs.
func (f *daemonFlags) addFlags(fs *flag.FlagSet) {
	cfg := &f.cfg
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/lanekit", "directory for the agent's state database")
	fs.StringVar(&cfg.Socket, "socket", "/run/lanekit/agent.sock", "unix socket the API is served on (mode 0600)")
	fs.StringVar(&cfg.Uplink, "uplink", "", "the node's uplink device (default pod MTU comes from it)")
	fs.Func("pod-cidr", "this node's pod CIDR, e.g. 10.244.1.0/24; repeat once per family for dual-stack (fd00:10:244:1::/64); required without --node-name (with it, the Node's spec.podCIDRs are used)", func(v string) error {
		f.podCIDRs = append(f.podCIDRs, v)
		return nil
	})
	f.kube.addFlags(fs)
	f.lb.addFlags(fs)
	f.mode.addFlags(fs)
	fs.StringVar(&cfg.BPFDir, "bpf-dir", "/sys/fs/bpf/lanekit", "where the datapath pins programs, maps and links (on a BPF filesystem; mounted at /sys/fs/bpf if missing there)")
	fs.BoolVar(&cfg.BIGTCP, "big-tcp", true, "BIG TCP: GSO/GRO packets up to 192 KiB on pod devices and the uplink, per family where the uplink's driver (tso_max_size) and the kernel (IPv4: Linux >= 6.3) support it; off in tunnel mode")
	fs.BoolVar(&cfg.BandwidthManager, "bandwidth-manager", true, "enforce pods' kubernetes.io/egress-bandwidth in BPF (EDT, paced by an fq qdisc the agent installs on the uplink when the first pod has a limit); ingress-bandwidth is reported, not enforced")
	fs.StringVar(&cfg.DeviceMode, "device-mode", agent.DeviceAuto, "pod device: auto (netkit L3 if the kernel has it), veth, netkit (L3: no MACs, no ARP) or netkit-l2 (MACs and ARP, for workloads that need them)")
	fs.IntVar(&cfg.MTU, "mtu", 0, "pod device MTU (default: the uplink's MTU)")
	fs.Func("cluster-dns", "the cluster's DNS Service address (kubelet's clusterDNS; comma-separated or repeated, IPv4): VMs' DHCP offers it as their name server with the search list of a ClusterFirst pod of their namespace; empty: VMs get no name server", func(v string) error {
		for _, s := range strings.Split(unsetRef(v), ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				return err
			}
			cfg.ClusterDNS = append(cfg.ClusterDNS, a)
		}
		return nil
	})
	fs.Func("cluster-domain", "the cluster's DNS domain (kubelet's clusterDomain; default cluster.local): VMs' DHCP search list is <namespace>.svc.<domain>, svc.<domain>, <domain> (with --cluster-dns)", func(v string) error {
		if v = unsetRef(v); v != "" {
			cfg.ClusterDomain = v
		}
		return nil
	})
	fs.StringVar(&cfg.TxGSO, "tx-gso", agent.TxGSOKernel, "who segments a VM guest's TSO/USO frames: kernel (each backend gets an AF_PACKET GSO socket per queue; a 64 KB segment leaves as one GSO packet the kernel segments where the route leaves, after the datapath saw one packet) or software (the backend cuts it into MTU-sized AF_XDP frames)")
	fs.StringVar(&cfg.RxGSO, "rx-gso", agent.RxGSOKernel, "how frames reach a VM's backend: kernel (each backend that asks gets an AF_PACKET socket per queue and the VM's device runs no XDP program, so a pod's 64 KB (BIG TCP: 192 KB) TCP segment reaches the backend as one GSO packet) or xdp (steer_vm redirects MTU-sized frames into the AF_XDP sockets and the backend coalesces them)")
	fs.StringVar(&cfg.VMSocketDir, "vm-socket-dir", agent.DefaultVMSocketDir, "directory (mode 0700) of the per-VM sockets the vhost-user backend fetches its AF_XDP sockets from")
	fs.StringVar(&cfg.HostNetns, "host-netns", "", "path of the node's network namespace if not the agent's own")
	fs.Func("node-addr", "an address NodePort services listen on (repeatable; default: the uplink's global IPv4 and IPv6 addresses)", func(v string) error {
		a, err := netip.ParseAddr(v)
		if err != nil || a.Is4In6() || !a.IsGlobalUnicast() {
			return fmt.Errorf("want a global unicast IPv4 or IPv6 address, got %q", v)
		}
		cfg.NodeAddrs = append(cfg.NodeAddrs, a)
		return nil
	})
	fs.StringVar(&cfg.VhostBin, "vhost-bin", "", "lanekit-vhost binary run for each CNI VM attachment (default: next to lanekitd, else on PATH)")
	fs.Func("vhost-uid-range", "FIRST-LAST: each VM backend runs as its own uid (and gid) from this range (default "+agent.DefaultVhostUIDRange.String()+")", func(v string) error {
		r, err := agent.ParseUIDRange(v)
		cfg.VhostUIDRange = &r
		return err
	})
	fs.Func("kubelet-userns-range", "FIRST-LAST: the host uids kubelet gives user-namespaced pods (its 'kubelet' user's subuids), which VM backend uids must avoid; "+
		"none: user namespaces off (default "+agent.KubeletUsernsRange.String()+", kubelet's own default)", func(v string) error {
		r, err := agent.ParseUIDRange(v)
		if v == "none" {
			r, err = agent.UIDRange{}, nil
		}
		cfg.KubeletUserns = &r
		return err
	})
	fs.Func("vhost-frontend-uid", "uid granted access to each VM backend's vhost-user socket (default 107, KubeVirt's qemu user)", func(v string) error {
		u, err := strconv.ParseUint(v, 10, 32)
		u32 := uint32(u)
		cfg.VhostFrontendUID = &u32
		return err
	})
	fs.Func("vhost-user", "UID:GID every VM backend runs as, instead of a uid per VM (no isolation between backends; debugging)", func(v string) error {
		u, g, ok := strings.Cut(v, ":")
		uid, err1 := strconv.ParseUint(u, 10, 32)
		gid, err2 := strconv.ParseUint(g, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("want UID:GID, got %q", v)
		}
		uid32, gid32 := uint32(uid), uint32(gid)
		cfg.VhostUID, cfg.VhostGID = &uid32, &gid32
		return nil
	})
	fs.StringVar(&f.devicePluginDir, "device-plugin-dir", deviceplugin.DefaultDir, "kubelet's device plugin directory: with --node-name the agent advertises "+
		"one "+deviceplugin.ResourceName+" device per VM backend it can run (the size of --vhost-uid-range); a VM network whose NetworkAttachmentDefinition "+
		"asks for it (k8s.v1.cni.cncf.io/resourceName) gets a device ID, for which Multus takes the vhost-user device-info the CNI plugin writes; empty: off")
	fs.StringVar(&cfg.KubeletRootDir, "kubelet-root-dir", agent.DefaultKubeletRootDir, "kubelet's --root-dir: VM attachments find the launcher pod's socket volume under <dir>/pods/<uid>/volumes")
	fs.Func("vm-host-socket-root", "a directory a VM attachment's hostSocketDir (CNI config) may be beneath (repeatable; default: <kubelet-root-dir>/pods and "+
		agent.DefaultVMHostSocketRoot+")", func(v string) error {
		if !filepath.IsAbs(v) {
			return fmt.Errorf("want an absolute path, got %q", v)
		}
		cfg.VMHostSocketRoots = append(cfg.VMHostSocketRoots, filepath.Clean(v))
		return nil
	})
	fs.IntVar(&cfg.LBFrontends, "lb-frontends", datapath.DefaultLBFrontends, "entries of the service frontend maps (lk_lb_svc, lk_lb_svc6, lk_lb_revnat(6), lk_lb_maglev): one per Service port and address (ClusterIP, each node address of a NodePort, external and ingress IPs); "+
		"what does not fit is reported (lanekit status, lanekit_map_* metrics, an Event on the Service) and programmed when room returns")
	fs.IntVar(&cfg.LBBackends, "lb-backends", datapath.DefaultLBBackends, "entries of the service backend maps (lk_lb_backends, lk_lb_backends6): one per endpoint of each frontend")
	fs.IntVar(&cfg.PolicyMaps.IPCache, "policy-ipcache", datapath.DefaultPolicyIPCache, "entries of the policy address maps (lk_policy_ipcache, lk_policy_ipcache6): one per pod address in the cluster and node address, per family; when full, this node's pods come first and the remote addresses left out are reported (lanekit status, lanekit_map_unprogrammed_entries) and get no podSelector allow")
	fs.IntVar(&cfg.PolicyMaps.Identities, "policy-identities", datapath.DefaultPolicyIdentities, "entries of the identity maps (lk_policy_isolation, lk_tunnel_vni, lk_tunnel_ident): one per label set a policy isolates; when full, this node's label sets come first")
	fs.IntVar(&cfg.PolicyMaps.Rules, "policy-rules", datapath.DefaultPolicyRules, "entries of the policy rule map (lk_policy_rules): one per allowed identity, port prefix and direction; a NetworkPolicy whose rules do not fit is left out whole (oldest first keep their room): its pods stay isolated, it is reported (lanekit status, policy list, a PolicyMapFull Event, lanekit_map_unprogrammed_policies) and programmed when room returns")
	fs.IntVar(&cfg.PolicyMaps.CIDRs, "policy-cidrs", datapath.DefaultPolicyCIDRs, "entries of the ipBlock prefix maps (lk_policy_cidrs, lk_policy_cidrs6), per family; a NetworkPolicy whose prefixes do not fit is left out whole, like --policy-rules")
	fs.IntVar(&cfg.PolicyMaps.TunnelNodes, "tunnel-nodes", datapath.DefaultTunnelNodes, "entries of the tunnel peer maps (lk_tunnel_nodes, lk_tunnel_peers): one per node of the cluster")
	fs.DurationVar(&cfg.MaintenanceInterval, "conntrack-gc-interval", agent.DefaultMaintenanceInterval, "how often expired conntrack entries are collected (and failed datapath updates retried)")
	fs.StringVar(&f.cgroupRoot, "cgroup-root", "/run/lanekit/cgroupv2", "cgroup2 directory the socket load balancer (services for the node's processes and hostNetwork pods) attaches to; cgroup2 is mounted there if it is not on one")
	fs.StringVar(&f.snatPorts, "nodeport-snat-ports", fmt.Sprintf("%d-%d", datapath.DefaultSNATPortMin, datapath.DefaultSNATPortMax),
		"source ports (MIN-MAX) for NodePort-to-remote-backend and hairpin SNAT and tunnel mode's masquerading; not the node's ephemeral range: reserve them with sysctl net.ipv4.ip_local_reserved_ports")
	fs.Func("routing-mode", "how pod traffic reaches other nodes: native (the node's routes; default) or tunnel (VXLAN driven by the datapath, for networks that cannot route pod CIDRs; what pods send outside the cluster is masqueraded to the node's address)", func(v string) error {
		cfg.RoutingMode = unsetRef(v)
		return nil
	})
	fs.Func("tunnel-port", fmt.Sprintf("VXLAN UDP port in tunnel mode (default %d)", agent.DefaultTunnelPort), func(v string) error {
		if v = unsetRef(v); v == "" {
			return nil
		}
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil || p == 0 {
			return fmt.Errorf("want a UDP port 1-65535, got %q", v)
		}
		cfg.TunnelPort = int(p)
		return nil
	})
	fs.Func("tunnel-node", "POD_CIDR=UNDERLAY_IP: another node of the tunnel (repeatable; without --node-name: with it, the Node objects say)", func(v string) error {
		n, err := agent.ParseTunnelNode(v)
		cfg.TunnelNodes = append(cfg.TunnelNodes, n)
		return err
	})
	fs.Func("encryption", "node-to-node encryption: none (default); ipsec and wireguard are refused (not implemented; the agent probes the kernel and says why)", func(v string) error {
		cfg.Encryption = unsetRef(v)
		return nil
	})
	fs.BoolVar(&f.sockLB, "socket-lb", true, "load-balance services for the node's own processes and hostNetwork pods (cgroup BPF at --cgroup-root)")
	fs.BoolVar(&cfg.ServiceHealthChecks, "service-health-checks", true, "serve the healthCheckNodePort of LoadBalancer Services with externalTrafficPolicy Local (HTTP on every node address, as kube-proxy)")
	fs.Func("external-ips", "which Services' spec.externalIPs are served: all (default, as kube-proxy and Cilium; anyone who may create a Service can then capture the cluster's traffic to any address, CVE-2020-8554), none, or a comma-separated list of CIDRs they must be in", func(v string) error {
		p, err := service.ParseExternalIPPolicy(v)
		cfg.ExternalIPs = p
		return err
	})
	fs.StringVar(&cfg.PodCongestionControl, "pod-congestion-control", "", "TCP congestion control of every new pod's namespace, e.g. bbr (recommended with kubernetes.io/egress-bandwidth limits); empty: the kernel's default. Refused at start when the kernel lacks it")
	fs.StringVar(&f.metrics, "metrics-listen", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9964); empty: off")
	fs.StringVar(&f.pprofAt, "pprof-address", "", "serve Go's runtime profiles (go tool pprof http://ADDR/debug/pprof/heap) on this address, e.g. 127.0.0.1:6060; "+
		"not authenticated: keep it on 127.0.0.1; empty: off")
	fs.Float64Var(&f.memRatio, "memory-limit-ratio", 0.9, "set Go's soft memory limit (GOMEMLIMIT) to this fraction of the agent's cgroup memory limit, so the heap does not double past the container's limit during a large sync; 0: off; "+
		"ignored when GOMEMLIMIT is set or the cgroup has no limit")
	fs.BoolVar(&f.logJSON, "log-json", true, "log JSON (false: text)")
	fs.BoolVar(&f.verbose, "v", false, "debug logging")
}

// check validates the flags that need nothing of the node.
func (f *daemonFlags) check() error {
	if f.memRatio < 0 || f.memRatio > 1 {
		return fmt.Errorf("--memory-limit-ratio %v: want 0 (off) or a fraction in (0, 1]", f.memRatio)
	}
	if err := f.kube.validate(); err != nil {
		return err
	}
	if err := f.lb.validate(f.kube); err != nil {
		return err
	}
	if err := f.mode.validate(); err != nil {
		return err
	}
	return f.mode.validateKube(f.kube, f.cfg.Uplink)
}

// agentConfig sets what the flags decide in f.cfg and returns the
// --pod-cidr values per family (with --node-name, the Node's decide).
func (f *daemonFlags) agentConfig() (cidr4, cidr6 string, err error) {
	cidr4, cidr6, err = splitPodCIDRs(f.podCIDRs)
	if err != nil {
		return "", "", fmt.Errorf("--pod-cidr: %w", err)
	}
	if cidr4 == "" && cidr6 == "" && f.kube.nodeName == "" {
		return "", "", fmt.Errorf("--pod-cidr is required (or --node-name to take it from the Node)")
	}
	lo, hi, err := parsePortRange(f.snatPorts)
	if err != nil {
		return "", "", fmt.Errorf("--nodeport-snat-ports: %w", err)
	}
	f.cfg.SNATPortMin, f.cfg.SNATPortMax = lo, hi
	if f.sockLB {
		if f.cgroupRoot == "" {
			return "", "", fmt.Errorf("--socket-lb needs --cgroup-root")
		}
		f.cfg.SockLBCgroup = f.cgroupRoot
	}
	return cidr4, cidr6, nil
}

// parsePortRange parses "MIN-MAX" (1 <= MIN <= MAX <= 65535).
func parsePortRange(s string) (uint16, uint16, error) {
	a, b, ok := strings.Cut(s, "-")
	lo, err1 := strconv.ParseUint(a, 10, 16)
	hi, err2 := strconv.ParseUint(b, 10, 16)
	if !ok || err1 != nil || err2 != nil || lo == 0 || hi < lo {
		return 0, 0, fmt.Errorf("%q: want MIN-MAX with 1 <= MIN <= MAX <= 65535", s)
	}
	return uint16(lo), uint16(hi), nil
}
