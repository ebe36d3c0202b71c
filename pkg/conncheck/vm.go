package conncheck

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

var (
	vmiGVR      = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	kubevirtGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}
)

// VMNetwork is the NetworkAttachmentDefinition ("namespace/name") the
// VMI's fast-lane NIC joins (deploy/kubevirt/nad-example.yaml).
const VMNetwork = "default/lanekit-vm"

// vmCheck starts a VMI with a NIC on the lanekit binding and checks the
// client pod reaches the guest through it (a refused connection counts:
// the guest's kernel answered). Skipped with the reason when KubeVirt or
// the binding is not installed.
func (r *run) vmCheck(ctx context.Context) {
	const name = "vm: pod-to-VMI (lanekit binding)"
	if r.Dynamic == nil {
		r.add(name, Skip, "no dynamic client")
		return
	}
	if _, err := r.Client.Discovery().ServerResourcesForGroupVersion("kubevirt.io/v1"); err != nil {
		r.add(name, Skip, "no VirtualMachineInstance CRD (KubeVirt not installed)")
		return
	}
	kvs, err := r.Dynamic.Resource(kubevirtGVR).List(ctx, metav1.ListOptions{})
	if err != nil || len(kvs.Items) == 0 {
		r.add(name, Skip, "the VMI CRD is there but no KubeVirt CR: no virt-controller runs VMs")
		return
	}
	if _, ok, _ := unstructured.NestedMap(kvs.Items[0].Object, "spec", "configuration", "network", "binding", "lanekit"); !ok {
		r.add(name, Skip, "KubeVirt has no lanekit binding (apply deploy/kubevirt/binding-patch.yaml)")
		return
	}
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm", "namespace": r.Namespace},
		"spec": map[string]any{
			"domain": map[string]any{
				"memory": map[string]any{"guest": "256Mi"},
				"devices": map[string]any{
					"disks":      []any{map[string]any{"name": "disk", "disk": map[string]any{"bus": "virtio"}}},
					"interfaces": []any{map[string]any{"name": "default", "masquerade": map[string]any{}}, map[string]any{"name": "fast", "binding": map[string]any{"name": "lanekit"}}},
				},
			},
			"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}, map[string]any{"name": "fast", "multus": map[string]any{"networkName": VMNetwork}}},
			"volumes":  []any{map[string]any{"name": "disk", "containerDisk": map[string]any{"image": r.VMImage}}},
		},
	}}
	if _, err := r.Dynamic.Resource(vmiGVR).Namespace(r.Namespace).Create(ctx, vmi, metav1.CreateOptions{}); err != nil {
		r.add(name, Fail, "create VMI: "+err.Error())
		return
	}
	var ip, phase string
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(wctx, time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := r.Dynamic.Resource(vmiGVR).Namespace(r.Namespace).Get(ctx, "vm", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(got.Object, "status", "phase")
		ifs, _, _ := unstructured.NestedSlice(got.Object, "status", "interfaces")
		for _, i := range ifs {
			if m, ok := i.(map[string]any); ok && m["name"] == "fast" {
				ip, _ = m["ipAddress"].(string)
			}
		}
		return phase == "Running" && ip != "", nil
	})
	if err != nil {
		r.add(name, Fail, fmt.Sprintf("VMI not running with a fast-lane address (phase %q): %v", phase, err))
		return
	}
	r.expect(ctx, name, r.client, ProbeReach, hostPort(ip, 22), true)
}
