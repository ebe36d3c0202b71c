package kubevirt

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kvv1 "kubevirt.io/api/core/v1"
)

// The binding reads VMIs with its own small struct; this keeps its JSON
// names honest against kubevirt.io/api (v1.9.0): a VMI marshalled by
// KubeVirt's types must come out the same through ParseVMI.
func TestParseVMIMatchesKubeVirtAPI(t *testing.T) {
	yes := true
	boot := uint(3)
	vmi := kvv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns1"},
		Spec: kvv1.VirtualMachineInstanceSpec{
			Domain: kvv1.DomainSpec{
				CPU: &kvv1.CPU{Cores: 2, Sockets: 3, Threads: 1},
				Resources: kvv1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("6")},
				},
				Devices: kvv1.Devices{
					NetworkInterfaceMultiQueue: &yes,
					UseVirtioTransitional:      &yes,
					Interfaces: []kvv1.Interface{
						{Name: "default", InterfaceBindingMethod: kvv1.InterfaceBindingMethod{Masquerade: &kvv1.InterfaceMasquerade{}}},
						{Name: "fast", Binding: &kvv1.PluginBinding{Name: BindingName}, MacAddress: "02:00:00:aa:00:01",
							Model: "virtio", PciAddress: "0000:02:05.0", BootOrder: &boot, ACPIIndex: 4},
					},
				},
			},
			Networks: []kvv1.Network{*kvv1.DefaultPodNetwork(), {Name: "fast", NetworkSource: kvv1.NetworkSource{Multus: &kvv1.MultusNetwork{NetworkName: "lanekit-vm"}}}},
		},
	}
	data, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseVMI(data)
	if err != nil {
		t.Fatal(err)
	}
	if v.Metadata.Name != "vm1" || v.Metadata.Namespace != "ns1" || v.VCPUs() != 6 || v.Queues() != 6 ||
		v.Spec.Domain.Devices.UseVirtioTransitional == nil || !*v.Spec.Domain.Devices.UseVirtioTransitional ||
		len(v.Spec.Networks) != 2 || v.Spec.Networks[1].Name != "fast" {
		t.Fatalf("parsed %+v", v)
	}
	b := v.BoundInterfaces(BindingName)
	if len(b) != 1 {
		t.Fatalf("bound %+v", b)
	}
	i := b[0]
	if i.Name != "fast" || i.MacAddress != "02:00:00:aa:00:01" || i.Model != "virtio" || i.PciAddress != "0000:02:05.0" ||
		i.BootOrder == nil || *i.BootOrder != 3 || i.ACPIIndex != 4 {
		t.Fatalf("interface %+v", i)
	}
	if l, ok := v.Spec.Domain.Resources.Limits["cpu"]; !ok || l.Value() != 6 {
		t.Fatalf("limits %+v", v.Spec.Domain.Resources.Limits)
	}
}
