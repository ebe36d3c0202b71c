package conncheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLaneAddr: the VM's address is the vhost-user network's in the launcher
// pod's network-status (Multus'), not the pod network's, and a pod without
// one gives an error naming why.
func TestLaneAddr(t *testing.T) {
	pod := func(status string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-vm-x"}}
		if status != "" {
			p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/network-status": status}
		}
		return p
	}
	a, err := laneAddr(pod(`[{"name":"k8s-pod-network","ips":["10.244.1.7"],"default":true},
		{"name":"default/lanekit-vm","interface":"pod0a1b","ips":["10.244.1.9"],"device-info":{"type":"vhost-user","vhost-user":{"mode":"client","path":"/var/run/kubevirt/sockets/lanekit-pod0a1b.sock"}}}]`))
	if err != nil || a.String() != "10.244.1.9" {
		t.Errorf("laneAddr = %v, %v; want 10.244.1.9", a, err)
	}
	for _, c := range []struct{ status, want string }{
		{"", "no network-status yet"},
		{`[{"name":"k8s-pod-network","ips":["10.244.1.7"],"default":true}]`, "no vhost-user network"},
		{`[{"name":"x","ips":[],"device-info":{"type":"vhost-user"}}]`, "no vhost-user network"},
		{`[{"name":"x","ips":["nonsense"],"device-info":{"type":"vhost-user"}}]`, "ParseAddr"},
		{`{`, "network-status"},
	} {
		if _, err := laneAddr(pod(c.status)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("laneAddr(%q) error %v, want one naming %q", c.status, err, c.want)
		}
	}
}

// TestVMSpec: --vm-spec's VMI runs under the check's name and namespace
// with its labels kept, and one without a lanekit interface, or not a VMI,
// is refused with the reason.
func TestVMSpec(t *testing.T) {
	r := &run{Options: Options{Namespace: "lanekit-conncheck", VMSpec: []byte(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: mine
  namespace: default
  resourceVersion: "7"
  labels: {app: kv}
spec:
  domain:
    devices:
      interfaces:
        - name: fast
          binding: {name: lanekit}
status: {phase: Running}
`)}}
	u, err := r.vmi()
	if err != nil {
		t.Fatal(err)
	}
	if u.GetName() != "vm" || u.GetNamespace() != "lanekit-conncheck" || u.GetResourceVersion() != "" || u.GetLabels()["app"] != "kv" {
		t.Errorf("metadata %v", u.Object["metadata"])
	}
	if _, ok := u.Object["status"]; ok {
		t.Errorf("status kept")
	}
	u.DeepCopy() // panics on a value unstructured cannot hold
	for spec, want := range map[string]string{
		"kind: VirtualMachineInstance\nspec: {domain: {devices: {interfaces: [{name: d, masquerade: {}}]}}}": "no interface on the lanekit binding",
		"kind: Pod": `kind "Pod"`,
		"{":         "--vm-spec",
	} {
		r.VMSpec = []byte(spec)
		if _, err := r.vmi(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("vmi(%q) error %v, want %q", spec, err, want)
		}
	}
	r.VMSpec = nil
	if u, err := r.vmi(); err != nil || u.GetName() != "vm" {
		t.Errorf("default VMI: %v, %v", u, err)
	}
}
