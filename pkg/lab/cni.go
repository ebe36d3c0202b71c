package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/lanekit/lanekit/pkg/cniplugin"
)

// CNICacheDir is libcni's result cache for the lab.
const CNICacheDir = RunDir + "/cni-cache"

// netnsExec runs CNI plugins inside a node namespace with `ip netns exec`,
// so that the bridge plugin creates its bridge on that node, not the host.
type netnsExec struct {
	version.PluginDecoder
	node string
}

var _ invoke.Exec = (*netnsExec)(nil)

// DeviceInfoDir is the lab's Multus device-info directory: the lanekit
// plugin writes device-info files only beneath it (its
// cniplugin.DeviceInfoDirEnv, set by the runtime, here the lab).
const DeviceInfoDir = RunDir + "/devinfo"

// ExecPlugin runs the plugin in the node netns with the CNI environment.
func (e *netnsExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", e.node, pluginPath)
	cmd.Env = append(environ, cniplugin.DeviceInfoDirEnv+"="+DeviceInfoDir)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, pluginErr(err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// FindInPath finds a plugin binary.
func (e *netnsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

// pluginErr turns a failed plugin run into the CNI error it printed.
func pluginErr(err error, stdout, stderr []byte) error {
	emsg := types.Error{}
	switch {
	case len(stdout) == 0 && len(stderr) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	case len(stdout) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed: %q: %v", strings.TrimSpace(string(stderr)), err)
	default:
		if perr := json.Unmarshal(stdout, &emsg); perr != nil || emsg.Msg == "" {
			emsg.Msg = fmt.Sprintf("netplugin failed: %q: %v", strings.TrimSpace(string(stdout)), err)
		}
	}
	return &emsg
}

// lanekitConf is node i's lanekit network.
func lanekitConf(i int) []byte {
	plugin := map[string]any{
		"type":        "lanekit",
		"agentSocket": AgentSocket(i),
		"subnet":      PodCIDR(i),
	}
	if labIPv6Only() { // ipv6only.go: the node has no IPv4 pod CIDR
		delete(plugin, "subnet")
	}
	return mustJSON(map[string]any{
		"cniVersion": "1.1.0",
		"name":       "lanekit",
		"plugins":    []any{plugin},
	})
}

// baselineConf is node i's reference bridge + host-local network.
func baselineConf(i int) []byte {
	_, subnet, _ := net.ParseCIDR(BaseCIDR(i))
	gw := make(net.IP, 4)
	copy(gw, subnet.IP.To4())
	gw[3] = 1
	plugin := map[string]any{
		"type":      "bridge",
		"bridge":    BaseBridge,
		"isGateway": true,
		"ipMasq":    false,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": filepath.Join(NodeDir(i), "ipam"),
			"ranges":  [][]map[string]string{{{"subnet": BaseCIDR(i), "gateway": gw.String()}}},
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
		},
	}
	if mtu := baselineMTU(); mtu > 0 {
		plugin["mtu"] = mtu // behind the flannel-style VXLAN (tunnel.go)
	}
	return mustJSON(map[string]any{
		"cniVersion": "1.1.0",
		"name":       "lk-baseline",
		"plugins":    []any{plugin},
	})
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only static maps are encoded
	}
	return data
}

// cniFor returns the libcni handle and the network list for a pod kind on node i.
func cniFor(b Bins, i int, kind string) (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	conf := lanekitConf(i)
	if kind == KindBaseline {
		conf = baselineConf(i)
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return nil, nil, fmt.Errorf("cni config for %s: %w", kind, err)
	}
	return labCNI(b, i), list, nil
}

// labCNI runs CNI plugins for node i (in its netns, as its runtime would).
func labCNI(b Bins, i int) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(b.CNIPaths(), CNICacheDir, &netnsExec{node: NodeNS(i)})
}

func runtimeConf(ns string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: ns, NetNS: netnsPath(ns), IfName: PodIfName}
}

// addPod creates pod namespace ns on node i and attaches it through CNI ADD.
// It returns the pod's IPv4 address.
func addPod(ctx context.Context, b Bins, i int, ns, kind string) (string, error) {
	if err := addNetns(ctx, ns); err != nil {
		return "", fmt.Errorf("pod %s: %w", ns, err)
	}
	cni, list, err := cniFor(b, i, kind)
	if err != nil {
		return "", err
	}
	res, err := cni.AddNetworkList(ctx, list, runtimeConf(ns))
	if err != nil {
		return "", fmt.Errorf("pod %s: cni add (%s): %w", ns, kind, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return "", fmt.Errorf("pod %s: cni result: %w", ns, err)
	}
	for _, ipc := range r.IPs {
		if v4 := ipc.Address.IP.To4(); v4 != nil {
			return v4.String(), nil
		}
	}
	if kind == KindLanekit && labIPv6Only() && len(r.IPs) > 0 {
		return "", nil // an IPv6-only node: the pod's address is its IPv6 one (podIP6)
	}
	return "", fmt.Errorf("pod %s: cni result has no ipv4 address", ns)
}

// delPod runs CNI DEL for a pod (best effort, bounded).
func delPod(ctx context.Context, b Bins, i int, ns, kind string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cni, list, err := cniFor(b, i, kind)
	if err != nil {
		return err
	}
	if err := cni.DelNetworkList(ctx, list, runtimeConf(ns)); err != nil {
		return fmt.Errorf("pod %s: cni del (%s): %w", ns, kind, err)
	}
	return nil
}
