package conncheck

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/pkg/k8sobj"
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
// the guest's kernel answered). The guest takes its address by DHCP from
// its link (bpf/lib/dhcp.h); the check reads it from what lanekit assigned,
// the launcher pod's network-status (laneAddr), never from the VMI's
// status.interfaces, which the guest's agent reports. Skipped with the
// reason when KubeVirt or the binding is not installed.
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
	vmi, err := r.vmi()
	if err != nil {
		r.add(name, Fail, err.Error())
		return
	}
	if _, err := r.Dynamic.Resource(vmiGVR).Namespace(r.Namespace).Create(ctx, vmi, metav1.CreateOptions{}); err != nil {
		r.add(name, Fail, "create VMI: "+err.Error())
		return
	}
	var ip, phase, why string
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(wctx, time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := r.Dynamic.Resource(vmiGVR).Namespace(r.Namespace).Get(ctx, "vm", metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(got.Object, "status", "phase")
		if phase != "Running" {
			return false, nil
		}
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io/created-by=" + string(got.GetUID())})
		if err != nil || len(pods.Items) == 0 {
			why = fmt.Sprintf("no launcher pod (%v)", err)
			return false, nil
		}
		for i := range pods.Items {
			a, err := laneAddr(&pods.Items[i])
			if err == nil {
				ip = a.String()
				return true, nil
			}
			why = err.Error()
		}
		return false, nil
	})
	if err != nil {
		r.add(name, Fail, fmt.Sprintf("VMI not running with a fast-lane address (phase %q: %s): %v", phase, why, err))
		return
	}
	r.expect(ctx, name, r.client, ProbeReach, hostPort(ip, 22), true)
}

// vmi is the VMI the check starts: Options.VMSpec with the run's name and
// namespace, or a containerDisk guest (VMImage) with the pod network
// (masquerade) and one NIC on the lanekit binding.
func (r *run) vmi() (*unstructured.Unstructured, error) {
	if len(r.VMSpec) == 0 {
		return &unstructured.Unstructured{Object: map[string]any{
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
		}}, nil
	}
	var obj map[string]any
	if err := yaml.Unmarshal(r.VMSpec, &obj); err != nil {
		return nil, fmt.Errorf("--vm-spec: %w", err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetKind() != "VirtualMachineInstance" {
		return nil, fmt.Errorf("--vm-spec: kind %q, want VirtualMachineInstance", u.GetKind())
	}
	ifs, _, _ := unstructured.NestedSlice(obj, "spec", "domain", "devices", "interfaces")
	lanekit := false
	for _, i := range ifs {
		if m, ok := i.(map[string]any); ok {
			b, _, _ := unstructured.NestedString(m, "binding", "name")
			lanekit = lanekit || b == "lanekit"
		}
	}
	if !lanekit {
		return nil, fmt.Errorf("--vm-spec: the VMI has no interface on the lanekit binding")
	}
	meta := map[string]any{"name": "vm", "namespace": r.Namespace}
	if labels, ok, _ := unstructured.NestedMap(obj, "metadata", "labels"); ok {
		meta["labels"] = labels
	}
	obj["metadata"] = meta
	delete(obj, "status")
	return u, nil
}

// laneAddr is the address lanekit gave a launcher pod's fast-lane NIC: the
// first address of its network-status entry whose device-info is
// vhost-user (what lanekit-cni writes for a VM attachment).
func laneAddr(pod *corev1.Pod) (netip.Addr, error) {
	raw := pod.Annotations[k8sobj.NetworkStatusAnnotation]
	if raw == "" {
		return netip.Addr{}, fmt.Errorf("launcher pod %s has no network-status yet", pod.Name)
	}
	st, err := k8sobj.ParseNetworkStatus(raw)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("launcher pod %s network-status: %w", pod.Name, err)
	}
	for _, s := range st {
		if s.DeviceInfo == nil || s.DeviceInfo.Type != "vhost-user" || len(s.IPs) == 0 {
			continue
		}
		a, err := netip.ParseAddr(s.IPs[0])
		if err != nil {
			return netip.Addr{}, fmt.Errorf("launcher pod %s network-status: %w", pod.Name, err)
		}
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("launcher pod %s network-status has no vhost-user network with an address", pod.Name)
}
