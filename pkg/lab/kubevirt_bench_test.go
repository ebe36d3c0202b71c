package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	kvv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestKubeVirtBenchProcs: the bench finds a VM's lanekit-vhost by its --vm
// argument and a VMI's QEMU by libvirt's -name guest=ns_name, as this
// machine numbers them, and nothing for another VM's name.
func TestKubeVirtBenchProcs(t *testing.T) {
	dir := t.TempDir()
	start := func(name string, args ...string) int {
		bin := filepath.Join(dir, name)
		if err := os.Symlink("/bin/sh", bin); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, append([]string{"-c", "sleep 30; true"}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	vh := start("lanekit-vhost", "--vm", "default/kv-a")
	qe := start("qemu-system-x86_64", "-name", "guest=default_kv-a,debug-threads=on")
	if got := vhostOf("default/kv-a"); got != vh {
		t.Errorf("vhostOf(default/kv-a) = %d, want %d", got, vh)
	}
	if got := qemuOf("default", "kv-a"); got != qe {
		t.Errorf("qemuOf(default, kv-a) = %d, want %d", got, qe)
	}
	if got := vhostOf("default/kv-b"); got != 0 {
		t.Errorf("vhostOf(default/kv-b) = %d, want 0", got)
	}
	if got := qemuOf("default", "kv"); got != 0 {
		t.Errorf("qemuOf(default, kv) = %d (a prefix of kv-a), want 0", got)
	}
}

// TestKubeVirtVMI: the bench's VMIs — lanekit's binding on the Multus
// network with the VMI's MAC, KubeVirt's bridge on the pod network with
// the MAC left to KubeVirt (the launcher pod's, which lanekit's programs
// admit).
func TestKubeVirtVMI(t *testing.T) {
	l := KubeVirtVMI("a", "lk-node2", BindingLanekit, "02:00:00:aa:00:11")
	for _, want := range []string{"name: a\n", "binding:\n            name: lanekit", `macAddress: "02:00:00:aa:00:11"`, "networkName: " + VMNetwork, "values: [lk-node2]",
		`kernelArgs: "console=ttyS0 quiet panic=-1 lk.ip=dhcp lk.mac=02:00:00:aa:00:11"`} {
		if !strings.Contains(l, want) {
			t.Errorf("lanekit VMI lacks %q:\n%s", want, l)
		}
	}
	b := KubeVirtVMI("b", "lk-node2", BindingBridge, "")
	for _, want := range []string{"bridge: {}", "pod: {}"} {
		if !strings.Contains(b, want) {
			t.Errorf("bridge VMI lacks %q:\n%s", want, b)
		}
	}
	if m := KubeVirtVMI("m", "lk-node2", BindingMasquerade, ""); !strings.Contains(m, "masquerade: {}") || !strings.Contains(m, "pod: {}") {
		t.Errorf("masquerade VMI:\n%s", m)
	}
	if strings.Contains(b, "macAddress") || strings.Contains(b, "multus") || strings.Contains(b, "lk.ip") {
		t.Errorf("bridge VMI has a MAC or a Multus network:\n%s", b)
	}
	// Both are VMIs to KubeVirt's own types (strict: no unknown field).
	for _, doc := range []string{l, b} {
		var vmi kvv1.VirtualMachineInstance
		if err := yaml.UnmarshalStrict([]byte(doc), &vmi); err != nil {
			t.Fatalf("%v:\n%s", err, doc)
		}
		ifs, nets := vmi.Spec.Domain.Devices.Interfaces, vmi.Spec.Networks
		if len(ifs) != 1 || len(nets) != 1 || ifs[0].Name != nets[0].Name || vmi.Spec.Domain.Firmware.KernelBoot == nil {
			t.Errorf("VMI %s: interfaces %+v, networks %+v", vmi.Name, ifs, nets)
		}
	}
	var vmi kvv1.VirtualMachineInstance
	_ = yaml.Unmarshal([]byte(b), &vmi)
	if ifs := vmi.Spec.Domain.Devices.Interfaces; len(ifs) != 1 || ifs[0].Bridge == nil || vmi.Spec.Networks[0].Pod == nil {
		t.Errorf("bridge VMI: %+v %+v", ifs, vmi.Spec.Networks)
	}
}
