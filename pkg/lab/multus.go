package lab

// What Multus and kubelet's volume manager do for a pod, as far as lanekit's
// VM attachments need it: the pod's emptyDir volumes exist under the
// kubelet's pod directory before the network is set up; each network named
// in the pod's k8s.v1.cni.cncf.io/networks annotation is looked up as a
// NetworkAttachmentDefinition and its CNI config run with the interface
// name, "mac" and "CNIDeviceInfoFile" capability arguments; the results and
// device-info land in the k8s.v1.cni.cncf.io/network-status annotation. DEL
// runs the same configs in reverse from what ADD recorded.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/lanekit/lanekit/internal/k8stest"
)

// Multus' annotations.
const (
	NetworksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
)

// KubeletRootDir is the lab kubelets' --root-dir (shared by the nodes, as
// pod UIDs are unique): pod volumes live under pods/<uid>/volumes.
func KubeletRootDir() string { return filepath.Join(RunDir, "kubelet") }

// podDir is kubelet's directory of a pod (its volumes, and what the lab
// kubelet records for it).
func podDir(uid k8stypes.UID) string { return filepath.Join(KubeletRootDir(), "pods", string(uid)) }

// PodVolumeDir is where kubelet keeps a pod's emptyDir volume on the host.
func PodVolumeDir(uid k8stypes.UID, volume string) string {
	return filepath.Join(podDir(uid), "volumes", "kubernetes.io~empty-dir", volume)
}

// NetworkSelection is one entry of the networks annotation.
type NetworkSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Interface string `json:"interface,omitempty"`
	MAC       string `json:"mac,omitempty"`
}

// NetworkStatus is one entry of the network-status annotation.
type NetworkStatus struct {
	Name       string          `json:"name"`
	Interface  string          `json:"interface,omitempty"`
	IPs        []string        `json:"ips,omitempty"`
	MAC        string          `json:"mac,omitempty"`
	Default    bool            `json:"default,omitempty"`
	DeviceInfo json.RawMessage `json:"device-info,omitempty"`
}

// secondaryNet is a network ADD ran for a pod, as DEL needs it again.
type secondaryNet struct {
	Name   string            `json:"name"` // namespace/name of the NAD
	Config json.RawMessage   `json:"config"`
	IfName string            `json:"ifname"`
	Caps   map[string]string `json:"caps"`
}

// parseNetworks reads the networks annotation: a JSON list, or a comma
// list of [namespace/]name[@interface].
func parseNetworks(podNS, v string) ([]NetworkSelection, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	var out []NetworkSelection
	if strings.HasPrefix(v, "[") {
		if err := json.Unmarshal([]byte(v), &out); err != nil {
			return nil, fmt.Errorf("%s: %w", NetworksAnnotation, err)
		}
	} else {
		for _, s := range strings.Split(v, ",") {
			var n NetworkSelection
			s, n.Interface, _ = strings.Cut(strings.TrimSpace(s), "@")
			if ns, name, ok := strings.Cut(s, "/"); ok {
				n.Namespace, n.Name = ns, name
			} else {
				n.Name = s
			}
			out = append(out, n)
		}
	}
	for i := range out {
		if out[i].Name == "" {
			return nil, fmt.Errorf("%s: entry %d has no name", NetworksAnnotation, i)
		}
		if out[i].Namespace == "" {
			out[i].Namespace = podNS
		}
		if out[i].Interface == "" {
			out[i].Interface = fmt.Sprintf("net%d", i+1)
		}
	}
	return out, nil
}

// makeVolumes creates the pod's emptyDir volumes as kubelet does before the
// sandbox (mode 0777: the pod's users write there).
func makeVolumes(p *corev1.Pod) error {
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir == nil {
			continue
		}
		dir := PodVolumeDir(p.UID, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			return err
		}
	}
	return nil
}

func podStateFile(uid k8stypes.UID) string {
	return filepath.Join(podDir(uid), "lab-networks.json")
}

// addSecondary runs ADD for each network the pod asks for and returns their
// network-status entries. What ran is recorded for DEL first.
func (k *Kubelet) addSecondary(ctx context.Context, p *corev1.Pod, base *libcni.RuntimeConf) ([]NetworkStatus, error) {
	sel, err := parseNetworks(p.Namespace, p.Annotations[NetworksAnnotation])
	if err != nil || len(sel) == 0 {
		return nil, err
	}
	if k.Dynamic == nil {
		return nil, errors.New("pod asks for secondary networks but the lab kubelet has no dynamic client")
	}
	var nets []secondaryNet
	for _, s := range sel {
		nad, err := k.Dynamic.Resource(k8stest.NADResource).Namespace(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("network %s/%s: %w", s.Namespace, s.Name, err)
		}
		conf, _, _ := unstructured.NestedString(nad.Object, "spec", "config")
		if conf == "" {
			return nil, fmt.Errorf("network %s/%s has no spec.config", s.Namespace, s.Name)
		}
		raw, err := k.pointAtNodeAgent([]byte(conf))
		if err != nil {
			return nil, fmt.Errorf("network %s/%s: %w", s.Namespace, s.Name, err)
		}
		caps := map[string]string{"CNIDeviceInfoFile": filepath.Join(DeviceInfoDir, string(p.UID)+"-"+s.Interface+".json")}
		if s.MAC != "" {
			caps["mac"] = s.MAC
		}
		nets = append(nets, secondaryNet{Name: s.Namespace + "/" + s.Name, Config: raw, IfName: s.Interface, Caps: caps})
	}
	state, err := json.Marshal(nets)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(podStateFile(p.UID), state, 0o600); err != nil {
		return nil, err
	}
	var out []NetworkStatus
	for _, n := range nets {
		cni, list, rt, err := k.secondaryCNI(n, base)
		if err != nil {
			return nil, err
		}
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, fmt.Errorf("network %s: cni add: %w", n.Name, err)
		}
		st := NetworkStatus{Name: n.Name, Interface: n.IfName}
		if r, err := current.NewResultFromResult(res); err == nil {
			for _, ipc := range r.IPs {
				st.IPs = append(st.IPs, ipc.Address.IP.String())
			}
			for _, itf := range r.Interfaces {
				if itf.Sandbox != "" && itf.Name == n.IfName {
					st.MAC = itf.Mac
				}
			}
		}
		if raw, err := os.ReadFile(n.Caps["CNIDeviceInfoFile"]); err == nil {
			st.DeviceInfo = raw
		}
		out = append(out, st)
		k.Log.Info("secondary network attached", "pod", p.Namespace+"/"+p.Name, "network", n.Name, "ifname", n.IfName, "ips", st.IPs)
	}
	return out, nil
}

// delSecondary runs DEL for what addSecondary recorded, last first.
func (k *Kubelet) delSecondary(ctx context.Context, uid k8stypes.UID, base *libcni.RuntimeConf) error {
	raw, err := os.ReadFile(podStateFile(uid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var nets []secondaryNet
	if err := json.Unmarshal(raw, &nets); err != nil {
		return fmt.Errorf("%s: %w", podStateFile(uid), err)
	}
	var errs []error
	for i := len(nets) - 1; i >= 0; i-- {
		cni, list, rt, err := k.secondaryCNI(nets[i], base)
		if err == nil {
			err = cni.DelNetworkList(ctx, list, rt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: cni del: %w", nets[i].Name, err))
		}
	}
	return errors.Join(errs...)
}

func (k *Kubelet) secondaryCNI(n secondaryNet, base *libcni.RuntimeConf) (*libcni.CNIConfig, *libcni.NetworkConfigList, *libcni.RuntimeConf, error) {
	list, err := libcni.NetworkConfFromBytes(n.Config)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("network %s: config: %w", n.Name, err)
	}
	rt := *base
	rt.IfName = n.IfName
	rt.CapabilityArgs = map[string]any{}
	for key, v := range n.Caps {
		rt.CapabilityArgs[key] = v
	}
	return labCNI(k.Bins, k.Index), list, &rt, nil
}

// pointAtNodeAgent makes the config a list and sets agentSocket in the config's lanekit plugins to this
// lab node's agent (on a real cluster every node has its agent at the same
// path; the lab's nodes share one filesystem).
func (k *Kubelet) pointAtNodeAgent(conf []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(conf, &m); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	plugins, ok := m["plugins"].([]any)
	if !ok {
		// A single plugin's config: Multus runs it as a list of one.
		m = map[string]any{"cniVersion": m["cniVersion"], "name": m["name"], "plugins": []any{m}}
		plugins = m["plugins"].([]any)
	}
	for _, p := range plugins {
		if pm, ok := p.(map[string]any); ok && pm["type"] == "lanekit" {
			pm["agentSocket"] = AgentSocket(k.Index)
		}
	}
	return json.Marshal(m)
}
