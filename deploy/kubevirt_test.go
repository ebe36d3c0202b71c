package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	kvv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/pkg/deviceplugin"
	"github.com/lanekit/lanekit/pkg/kubevirt"
)

// bindingPlugin mirrors kubevirt.io/api core/v1 InterfaceBindingPlugin, so
// the strict decode catches a misspelt key.
type bindingPlugin struct {
	SidecarImage                string `json:"sidecarImage,omitempty"`
	NetworkAttachmentDefinition string `json:"networkAttachmentDefinition,omitempty"`
	DomainAttachmentType        string `json:"domainAttachmentType,omitempty"`
	Migration                   *struct {
		Method string `json:"method,omitempty"`
	} `json:"migration,omitempty"`
	DownwardAPI             string                       `json:"downwardAPI,omitempty"`
	ComputeResourceOverhead *corev1.ResourceRequirements `json:"computeResourceOverhead,omitempty"`
}

type bindingPatch struct {
	Spec struct {
		Configuration struct {
			Network struct {
				Binding map[string]bindingPlugin `json:"binding"`
			} `json:"network"`
		} `json:"configuration"`
	} `json:"spec"`
}

// hostPathAt is the host directory the agent container sees at dir (its
// mount exactly there), or "".
func hostPathAt(spec corev1.PodSpec, dir string) string {
	dir = strings.TrimSuffix(dir, "/")
	for _, c := range spec.Containers {
		if c.Name != "agent" {
			continue
		}
		for _, vm := range c.VolumeMounts {
			if vm.MountPath != dir {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil {
					return v.HostPath.Path
				}
			}
		}
	}
	return ""
}

type nad struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Config string `json:"config"`
	} `json:"spec"`
}

func TestKubeVirtBinding(t *testing.T) {
	m := load(t)
	data, err := os.ReadFile("kubevirt/binding-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var p bindingPatch
	strictYAML(t, data, &p)
	// And with KubeVirt's own types (kubevirt.io/api v1.9.0): the patch is a
	// valid piece of a KubeVirt CR.
	var kv kvv1.KubeVirt
	strictYAML(t, data, &kv)
	if kv.Spec.Configuration.NetworkConfiguration == nil || kv.Spec.Configuration.NetworkConfiguration.Binding[kubevirt.BindingName].DownwardAPI != kvv1.DeviceInfo {
		t.Fatalf("KubeVirt types see %+v", kv.Spec.Configuration.NetworkConfiguration)
	}
	b, ok := p.Spec.Configuration.Network.Binding[kubevirt.BindingName]
	if !ok || len(p.Spec.Configuration.Network.Binding) != 1 {
		t.Fatalf("binding %q not registered: %+v", kubevirt.BindingName, p.Spec.Configuration.Network.Binding)
	}
	if b.DownwardAPI != "device-info" {
		t.Errorf("downwardAPI %q: the sidecar reads the socket from device-info", b.DownwardAPI)
	}
	// Migratable (KubeVirt checks only that migration is set), with no
	// method: link-refresh flaps the guest's link for a DHCP renewal, and
	// lanekit keeps the guest's address (pkg/k8s: incoming endpoint from the
	// target's CNI ADD, claims from the VMIs' migration states).
	if kvb := kv.Spec.Configuration.NetworkConfiguration.Binding[kubevirt.BindingName]; b.Migration == nil || kvb.Migration == nil || kvb.Migration.Method != "" {
		t.Errorf("migration %+v: want migration: {} (no method)", kvb.Migration)
	}
	if b.DomainAttachmentType != "" {
		t.Error("domainAttachmentType and a sidecar are exclusive: the sidecar defines the interface")
	}
	if q, ok := b.ComputeResourceOverhead.Requests[corev1.ResourceMemory]; !ok || q.IsZero() {
		t.Error("no memory overhead for the backend")
	}
	// The sidecar image is the one the kustomization retags, with its tag.
	found := false
	for _, img := range m.kust.Images {
		if img.Name == sidecarImage {
			found = true
			if b.SidecarImage != sidecarImage+":"+img.NewTag {
				t.Errorf("sidecarImage %q, kustomization has %s:%s", b.SidecarImage, sidecarImage, img.NewTag)
			}
		}
	}
	if !found {
		t.Errorf("kustomization does not list %s", sidecarImage)
	}
	agentTag := strings.TrimPrefix(m.ds.Spec.Template.Spec.Containers[0].Image, agentImage+":")
	for _, img := range m.kust.Images {
		if img.Name == agentImage && img.NewTag != agentTag {
			t.Errorf("kustomization tags %s %q, DaemonSet uses %q", agentImage, img.NewTag, agentTag)
		}
	}

	// The NAD the binding names is the example NAD, and its config is a
	// valid lanekit network with the device-info capability.
	data, err = os.ReadFile("kubevirt/nad-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var n nad
	strictYAML(t, data, &n)
	if n.APIVersion != "k8s.cni.cncf.io/v1" || n.Kind != "NetworkAttachmentDefinition" {
		t.Errorf("NAD is %s %s", n.APIVersion, n.Kind)
	}
	// A binding's NAD is attached in addition to the VMI's own network, for
	// each interface on the binding: a second VM endpoint per interface.
	if b.NetworkAttachmentDefinition != "" {
		t.Errorf("binding names NAD %q: KubeVirt would attach it beside the VMI's lanekit network (a second VM endpoint)", b.NetworkAttachmentDefinition)
	}
	checkConflist(t, []byte(n.Spec.Config), flags(m.ds.Spec.Template.Spec.Containers[0])["socket"])
	// Multus gives the plugin a device-info file only for a network with a
	// device ID: the NAD asks for the agent's device plugin resource, whose
	// directory the DaemonSet mounts.
	if r := n.Metadata.Annotations["k8s.v1.cni.cncf.io/resourceName"]; r != deviceplugin.ResourceName {
		t.Errorf("NAD resourceName %q, want %s (without a device ID Multus passes no CNIDeviceInfoFile)", r, deviceplugin.ResourceName)
	}
	if d := flags(m.ds.Spec.Template.Spec.Containers[0])["device-plugin-dir"]; d != "" {
		t.Errorf("DaemonSet sets --device-plugin-dir %q; the agent's default is kubelet's", d)
	}
	if hostPathAt(m.ds.Spec.Template.Spec, deviceplugin.DefaultDir) != strings.TrimSuffix(deviceplugin.DefaultDir, "/") {
		t.Errorf("the agent container does not mount kubelet's device plugin directory %s", deviceplugin.DefaultDir)
	}
	list, _ := libcni.ConfListFromBytes([]byte(n.Spec.Config))
	var caps struct {
		Capabilities map[string]bool `json:"capabilities"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &caps); err != nil || !caps.Capabilities["CNIDeviceInfoFile"] {
		t.Errorf("NAD plugin lacks the CNIDeviceInfoFile capability (device-info is how the socket reaches the sidecar): %v", err)
	}

	// The example VMI uses the binding on a network that is that NAD.
	data, err = os.ReadFile("kubevirt/vmi-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatal(err)
	}
	// KubeVirt's types decode it (their custom unmarshalers hide some
	// unknown fields from the strict check; the checks below cover the
	// fields the binding needs).
	var typed kvv1.VirtualMachineInstance
	strictYAML(t, data, &typed)
	vmi, err := kubevirt.ParseVMI(j)
	if err != nil {
		t.Fatal(err)
	}
	ifs := vmi.BoundInterfaces(kubevirt.BindingName)
	if len(ifs) != 1 || ifs[0].MacAddress == "" {
		t.Fatalf("example VMI: lanekit interfaces %+v (want one, with a MAC)", ifs)
	}
	var raw struct {
		Spec struct {
			Networks []struct {
				Name   string `json:"name"`
				Multus *struct {
					NetworkName string `json:"networkName"`
				} `json:"multus"`
			} `json:"networks"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(j, &raw); err != nil {
		t.Fatal(err)
	}
	ok = false
	for _, nw := range raw.Spec.Networks {
		if nw.Name == ifs[0].Name && nw.Multus != nil && nw.Multus.NetworkName == n.Metadata.Name {
			ok = true
		}
	}
	if !ok {
		t.Errorf("example VMI's %q network is not the %s NAD", ifs[0].Name, n.Metadata.Name)
	}
}
