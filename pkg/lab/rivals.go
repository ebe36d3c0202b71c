package lab

// The rivals on the real-node lab (`lab up --k8s --kubelet --cni ...`): the
// network plugins lanekit is measured against, built from their own sources
// (scripts/k8s-node-bins.sh) and installed the way their users install them.
// kube-proxy-iptables and kube-proxy-nftables run upstream kube-proxy
// (kubeadm's DaemonSet and KubeProxyConfiguration, mode iptables or nftables)
// beside flannel (its kube-flannel.yml: flanneld --kube-subnet-mgr, backend
// host-gw for native routing, vxlan for --routing tunnel) and no lanekit
// agent. The seam is the CNI value: a rival is a set of manifests the lab
// renders and applies, and what a node needs beside them (for flannel: the
// CNI plugins and the conflist its plugin would delegate to).

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/bench"
)

// The values of --cni.
const (
	CNILanekit           = "lanekit"
	CNIKubeProxyIptables = "kube-proxy-iptables"
	CNIKubeProxyNftables = "kube-proxy-nftables"
)

// CNIs are the values --cni takes.
var CNIs = []string{CNILanekit, CNIKubeProxyIptables, CNIKubeProxyNftables, CNICilium}

// Images of the rivals (internal/tools/lkimages: make k8s-rival-images).
const (
	kubeProxyImage = "registry.k8s.io/kube-proxy:" + nodeKubeVersion
	flannelVersion = "v0.28.10"
	flannelImage   = "ghcr.io/flannel-io/flannel:" + flannelVersion
	// FlannelConflist is the conflist the lab writes on a flannel node.
	FlannelConflist = "10-flannel.conflist"
)

//go:embed manifests/kube-proxy.yaml
var kubeProxyTemplate string

//go:embed manifests/flannel.yaml
var flannelTemplate string

// rival is one --cni value's install.
type rival struct {
	// ProxyMode is kube-proxy's mode (iptables, nftables).
	ProxyMode string
	// FlannelBackend is flannel's backend type (host-gw, vxlan).
	FlannelBackend string
	// Cilium: Cilium instead of kube-proxy + flannel (rivals_cilium.go).
	Cilium bool
	// Routing is the lab's routing mode.
	Routing string
	// Images are the archive names a node imports for it.
	Images []string
	// Bins are the node binaries it needs.
	Bins []string
	// Plugins are the reference CNI plugins (bin/cni) each node gets.
	Plugins []string
}

// podPath is what a pod-to-pod row of the rival crosses.
func (r rival) podPath() bench.Includes {
	if r.Cilium {
		return bench.Includes{Conntrack: true, Detail: "Cilium " + ciliumVersion + ": its BPF programs at the pod veths and the uplink (" +
			r.ciliumRouting() + "), BPF conntrack"}
	}
	return bench.Includes{Netfilter: true, Conntrack: true,
		Detail: fmt.Sprintf("flannel %s: pod veth, cni0 bridge, node forwarding through kube-proxy's %s rules", r.FlannelBackend, r.ProxyMode)}
}

// svcPath is what a Service row of the rival crosses.
func (r rival) svcPath() bench.Includes {
	if r.Cilium {
		return bench.Includes{Conntrack: true, Detail: "Cilium kube-proxy replacement: BPF service map, per-packet LB at the pod veth (socket LB host netns only)"}
	}
	return bench.Includes{Netfilter: true, Conntrack: true, Detail: "kube-proxy " + r.ProxyMode + " DNAT, flannel bridge"}
}

func (r rival) ciliumRouting() string {
	if r.Routing == RoutingTunnel {
		return "VXLAN"
	}
	return "native routing"
}

// rivalFor returns the install of a --cni value other than lanekit
// (ok false: lanekit itself) on the given routing mode.
func rivalFor(cni, routing string) (r rival, ok bool, err error) {
	switch cni {
	case "", CNILanekit:
		return rival{}, false, nil
	case CNICilium:
		return rival{Cilium: true, Routing: routing, Images: []string{"cilium", "cilium-operator"},
			Bins:    []string{"cilium-agent", "cilium-operator-generic", "cilium-cni", "cilium-dbg", ciliumChartSubdir + "/Chart.yaml"},
			Plugins: []string{"loopback"}}, true, nil
	case CNIKubeProxyIptables, CNIKubeProxyNftables:
		r = rival{ProxyMode: strings.TrimPrefix(cni, "kube-proxy-"), FlannelBackend: "host-gw", Routing: routing,
			Images: []string{"kube-proxy", "flannel"}, Bins: []string{"kube-proxy", "flanneld"}, Plugins: flannelPlugins}
		if routing == RoutingTunnel {
			r.FlannelBackend = "vxlan"
		}
		return r, true, nil
	}
	return rival{}, false, fmt.Errorf("--cni %q: want one of %s", cni, strings.Join(CNIs, ", "))
}

// checkCNI validates Config.CNI against the rest of the configuration.
func (c Config) checkCNI() error {
	_, ok, err := rivalFor(c.CNI, c.routing())
	if err != nil || !ok {
		return err
	}
	switch {
	case !c.Kubelet:
		return fmt.Errorf("--cni %s needs real nodes (--k8s --kubelet)", c.CNI)
	case c.IPFamily != "" && c.IPFamily != IPFamilyIPv4:
		return fmt.Errorf("--cni %s: IPv4 only in the lab", c.CNI)
	case c.DPUNodes > 0:
		return fmt.Errorf("--cni %s: no DPU nodes", c.CNI)
	}
	return nil
}

// rivalManifests renders the rival's manifests (kube-proxy first: the
// Services flannel and the pods use).
func rivalManifests(r rival, srv *k8stest.Server) ([][]byte, error) {
	kp, err := renderManifest("kube-proxy", kubeProxyTemplate, map[string]any{
		"ClusterCIDR": ClusterCIDR, "Mode": r.ProxyMode, "Image": kubeProxyImage,
		"APIServer": fmt.Sprintf("%s:%d", srv.Address, srv.APIPort),
	})
	if err != nil {
		return nil, err
	}
	fl, err := renderManifest("flannel", flannelTemplate, map[string]any{
		"ClusterCIDR": ClusterCIDR, "Backend": r.FlannelBackend, "NFTables": r.ProxyMode == "nftables",
		"Image": flannelImage, "Iface": Uplink, "APIHost": srv.Address, "APIPort": srv.APIPort,
	})
	if err != nil {
		return nil, err
	}
	return [][]byte{kp, fl}, nil
}

func renderManifest(name, text string, data any) ([]byte, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s manifest: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("%s manifest: %w", name, err)
	}
	return b.Bytes(), nil
}

// checkRivalInputs verifies the rival's node binaries and image archives.
func checkRivalInputs(r rival, nodeBins string, b Bins) error {
	for _, n := range r.Bins {
		if f := filepath.Join(nodeBins, n); !executable(f) && (filepath.Ext(n) == "" || !regularFile(f)) {
			return fmt.Errorf("%s missing in %s: run `make k8s-node-bins` (scripts/k8s-node-bins.sh)", n, nodeBins)
		}
	}
	for _, n := range r.Images {
		if !regularFile(filepath.Join(b.ImagesDir(), n+".tar")) {
			return fmt.Errorf("image archive %s.tar missing in %s: run `make k8s-rival-images`", n, b.ImagesDir())
		}
	}
	for _, p := range r.Plugins {
		if !executable(filepath.Join(b.Dir, "cni", p)) {
			return fmt.Errorf("CNI plugin %s missing in %s: run `make deps`", p, filepath.Join(b.Dir, "cni"))
		}
	}
	return nil
}

// flannelPlugins are the reference CNI plugins flannel's conflist runs.
var flannelPlugins = []string{"bridge", "host-local", "portmap", "loopback"}

// installRival applies the rival's manifests, waits for its DaemonSets and
// gives each node its CNI: the plugins in /opt/cni/bin and, once flanneld
// has written the node's /run/flannel/subnet.env, the conflist.
func installRival(ctx context.Context, r rival, st *State, nodeBins string, b Bins, srv *k8stest.Server, kc kubernetes.Interface, out io.Writer) error {
	for _, n := range st.Nodes {
		for _, p := range r.Plugins {
			if err := copyExecutable(filepath.Join(b.Dir, "cni", p), filepath.Join(RealNodeDir(n.Index), "cni-bin", p)); err != nil {
				return fmt.Errorf("node %s: %w", n.NS, err)
			}
		}
	}
	if r.Cilium {
		return installCilium(ctx, r, st, nodeBins, b, srv, kc, out)
	}
	if err := routeServiceRange(ctx, st, srv.ServiceCIDR); err != nil {
		return err
	}
	manifests, err := rivalManifests(r, srv)
	if err != nil {
		return err
	}
	for _, m := range manifests {
		if _, err := kubectl(ctx, nodeBins, m, "apply", "-f", "-"); err != nil {
			return err
		}
	}
	if err := waitDaemonSet(ctx, kc, "kube-system", "kube-proxy", len(st.Nodes)); err != nil {
		return err
	}
	progress(out, "lab: kube-proxy %s (mode %s) Ready on every node", nodeKubeVersion, r.ProxyMode)
	if err := waitDaemonSet(ctx, kc, "kube-flannel", "kube-flannel-ds", len(st.Nodes)); err != nil {
		return err
	}
	for _, n := range st.Nodes {
		env, err := waitSubnetEnv(ctx, n.Index)
		if err != nil {
			return err
		}
		conf, err := flannelConflist(env)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.NS, err)
		}
		if err := os.WriteFile(filepath.Join(RealNodeDir(n.Index), "cni-conf", FlannelConflist), conf, 0o644); err != nil {
			return err
		}
	}
	progress(out, "lab: flannel %s (backend %s) Ready on every node; bridge + host-local conflist written", flannelVersion, r.FlannelBackend)
	return nil
}

// routeServiceRange gives every node a route for the Service ranges
// (serviceCIDR: one or two CIDRs, comma-separated) to the underlay's router.
// kube-proxy rewrites a node's own connection to a ClusterIP in the nat
// OUTPUT hook, which runs after the kernel has routed the packet to the
// ClusterIP itself: a kubeadm node finds its default route there, the lab's
// nodes have none (nothing leaves the lab), so without this route every
// hostNetwork client of a Service failed with "network unreachable" before
// kube-proxy saw it, and a pod's connection to a Service without endpoints
// got the kernel's "no route" instead of kube-proxy's REJECT. What kube-proxy
// does not rewrite goes to the router, which has no route for it either.
func routeServiceRange(ctx context.Context, st *State, serviceCIDR string) error {
	for _, cidr := range strings.Split(serviceCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(cidr))
		if err != nil {
			return fmt.Errorf("service range %q: %w", cidr, err)
		}
		for _, n := range st.Nodes {
			if p.Addr().Is6() && n.UnderlayIP6 == "" {
				continue
			}
			if err := ip(ctx, routeViaRouter(n.NS, p)...); err != nil {
				return fmt.Errorf("node %s: the Service range's route: %w", n.NS, err)
			}
		}
	}
	return nil
}

func copyExecutable(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// nodeRoot is node i's root as the machine reaches it (its init's root:
// the node's own /run, bpffs and bind mounts).
func nodeRoot(i int) (string, error) {
	pid := readPID(NodeInitPIDFile(i))
	if pid <= 0 || !alive(pid) {
		return "", fmt.Errorf("node %s: no running node init (%s)", NodeNS(i), NodeInitPIDFile(i))
	}
	return fmt.Sprintf("/proc/%d/root", pid), nil
}

// NodeRunFile is a file in node i's /run as the machine reaches it.
func NodeRunFile(i int, rel string) (string, error) {
	root, err := nodeRoot(i)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "run", rel), nil
}

// waitSubnetEnv waits for flanneld's /run/flannel/subnet.env on node i.
func waitSubnetEnv(ctx context.Context, i int) (subnetEnv, error) {
	var env subnetEnv
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, realNodeTimeout, true, func(context.Context) (bool, error) {
		f, err := NodeRunFile(i, "flannel/subnet.env")
		if err != nil {
			return false, err
		}
		data, err := os.ReadFile(f)
		if err != nil {
			last = err
			return false, nil
		}
		env, last = parseSubnetEnv(data)
		return last == nil, nil
	})
	if err != nil {
		return env, fmt.Errorf("node %s: flannel subnet.env: %w (last: %v)", NodeNS(i), err, last)
	}
	return env, nil
}

// subnetEnv is flanneld's /run/flannel/subnet.env.
type subnetEnv struct {
	Network netip.Prefix // FLANNEL_NETWORK: the cluster CIDR
	Subnet  netip.Prefix // FLANNEL_SUBNET: the node's range, its gateway address
	MTU     int          // FLANNEL_MTU
	IPMasq  bool         // FLANNEL_IPMASQ: flanneld masquerades itself
}

// parseSubnetEnv reads subnet.env (KEY=VALUE lines, as flanneld writes
// them); every key the CNI plugin reads must be there.
func parseSubnetEnv(data []byte) (subnetEnv, error) {
	kv := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		l := strings.TrimSpace(s.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return subnetEnv{}, fmt.Errorf("subnet.env: line %q is not KEY=VALUE", l)
		}
		kv[k] = v
	}
	var env subnetEnv
	var errs []error
	need := func(k string) string {
		v, ok := kv[k]
		if !ok {
			errs = append(errs, fmt.Errorf("subnet.env: no %s", k))
		}
		return v
	}
	var err error
	if v := need("FLANNEL_NETWORK"); v != "" {
		if env.Network, err = netip.ParsePrefix(v); err != nil {
			errs = append(errs, fmt.Errorf("subnet.env FLANNEL_NETWORK: %w", err))
		}
	}
	if v := need("FLANNEL_SUBNET"); v != "" {
		if env.Subnet, err = netip.ParsePrefix(v); err != nil {
			errs = append(errs, fmt.Errorf("subnet.env FLANNEL_SUBNET: %w", err))
		}
	}
	if v := need("FLANNEL_MTU"); v != "" {
		if env.MTU, err = strconv.Atoi(v); err != nil || env.MTU < 576 {
			errs = append(errs, fmt.Errorf("subnet.env FLANNEL_MTU %q: not an MTU", v))
		}
	}
	if v := need("FLANNEL_IPMASQ"); v != "" {
		if env.IPMasq, err = strconv.ParseBool(v); err != nil {
			errs = append(errs, fmt.Errorf("subnet.env FLANNEL_IPMASQ: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return subnetEnv{}, err
	}
	if !env.Network.Contains(env.Subnet.Addr()) {
		return subnetEnv{}, fmt.Errorf("subnet.env: FLANNEL_SUBNET %s outside FLANNEL_NETWORK %s", env.Subnet, env.Network)
	}
	return env, nil
}

// flannelConflist is the conflist flannel's CNI plugin amounts to with
// kube-flannel.yml's cni-conf.json ({"type": "flannel", "delegate":
// {"hairpinMode": true, "isDefaultGateway": true}} then portmap): the
// delegate it builds from subnet.env, a bridge (cni0, the node's gateway,
// the MTU, masquerading only when flanneld does not) with host-local IPAM
// over the node's range and a route to the cluster network.
func flannelConflist(env subnetEnv) ([]byte, error) {
	type route struct {
		Dst string `json:"dst"`
	}
	type rng struct {
		Subnet string `json:"subnet"`
	}
	conf := map[string]any{
		"cniVersion": "0.3.1",
		"name":       "cbr0",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "name": "cbr0", "bridge": "cni0",
				"hairpinMode": true, "isDefaultGateway": true, "isGateway": true,
				"ipMasq": !env.IPMasq, "mtu": env.MTU,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]rng{{{Subnet: env.Subnet.Masked().String()}}},
					"routes": []route{{Dst: env.Network.String()}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}
