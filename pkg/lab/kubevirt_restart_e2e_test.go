package lab

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	kvv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8s"
)

// kubevirtTestVM renders a VirtualMachine (runStrategy Always: KubeVirt
// starts a new VMI when one ends) whose template is KubeVirtVMI's.
func kubevirtTestVM(t *testing.T, name, node, binding, mac string) []byte {
	t.Helper()
	var vmi kvv1.VirtualMachineInstance
	if err := yaml.UnmarshalStrict([]byte(KubeVirtVMI(name, node, binding, mac)), &vmi); err != nil {
		t.Fatal(err)
	}
	always := kvv1.RunStrategyAlways
	vm := kvv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: PodNamespace},
		Spec: kvv1.VirtualMachineSpec{RunStrategy: &always, Template: &kvv1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: vmi.Labels}, Spec: vmi.Spec}},
	}
	out, err := yaml.Marshal(vm)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubevirtLauncherRestart: a VirtualMachine on lanekit's binding whose
// virt-launcher pod goes (deleted, as a crash or an eviction ends it:
// KubeVirt does not restart a launcher, it fails the VMI and the VM's
// runStrategy starts a new one) comes back on the fast lane: the new
// launcher's CNI ADD makes a VM endpoint, the guest (configured again, as
// cloud-init would at boot) answers HTTP from a pod on node 1 at the
// address lanekit's IPAM gave the new endpoint, and node 2's agent holds
// one VM endpoint for it — the old one released with its BPF entry when its
// address changed.
func kubevirtLauncherRestart(t *testing.T, ctx context.Context, kc kubernetes.Interface, nodeBins string) {
	const name, mac = "kv-restart", "02:00:00:aa:00:21"
	if _, err := kubectl(ctx, nodeBins, kubevirtTestVM(t, name, KubeNodeName(2), BindingLanekit, mac), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kubectl(context.Background(), nodeBins, nil, "delete", "vm", name, "-n", PodNamespace, "--ignore-not-found", "--wait=false") //nolint:errcheck
	})
	client := agnhostPausePod(t, ctx, kc, "kv-restart-client", KubeNodeName(1))
	up := func(what string, old *corev1.Pod) (*corev1.Pod, string) {
		t.Helper()
		var pod *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := waitVMILauncher(ctx, kc, name)
			if err != nil || (old != nil && p.UID == old.UID) || p.DeletionTimestamp != nil {
				return false, nil
			}
			pod = p
			return true, nil
		})
		if err != nil {
			vm, _ := kubectl(ctx, nodeBins, nil, "get", "vm,vmi", name, "-n", PodNamespace, "-o", "yaml")
			t.Fatalf("%s: no running launcher for VM %s: %v\n%s", what, name, err, tail(vm, 3000))
		}
		addr, con, err := kubevirtGuestUp(ctx, 2, pod, BindingLanekit, mac)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer con.Close()
		var got string
		if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err = kubectl(ctx, nodeBins, nil, "exec", "-n", PodNamespace, client.Name, "--", "curl", "-sS", "-m", "5", "http://"+addr+"/")
			return err == nil && strings.Contains(got, "lanekit guest"), nil
		}); err != nil {
			t.Fatalf("%s: the guest at %s does not answer HTTP from %s: %q %v", what, addr, client.Name, got, err)
		}
		return pod, addr
	}
	first, addr1 := up("first launcher", nil)
	start := time.Now()
	if err := kc.CoreV1().Pods(PodNamespace).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second, addr2 := up("after the launcher pod was deleted", first)
	t.Logf("launcher %s deleted: VM %s answered again from launcher %s at %s (was %s) %.0f s later",
		first.Name, name, second.Name, addr2, addr1, time.Since(start).Seconds())
	sock, err := RealNodeAgentSocket(2)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := findAgentVM(ctx, sock, k8s.VMName(PodNamespace, name))
	if err != nil {
		t.Fatal(err)
	}
	if a, _, _ := strings.Cut(vm.GetAddress(), "/"); a != addr2 {
		t.Errorf("node 2's agent holds VM %s at %s, the new launcher's network-status says %s", name, vm.GetAddress(), addr2)
	}
	if addr1 != addr2 {
		root, err := nodeRoot(2)
		if err != nil {
			t.Fatal(err)
		}
		old := netip.MustParseAddr(addr1)
		if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
			_, _, err := datapath.PinnedCounters(filepath.Join(root, "sys/fs/bpf/lanekit"), old)
			return err != nil, nil
		}); err != nil {
			t.Errorf("the old launcher's address %s is still in node 2's endpoint map a minute after it went", addr1)
		}
	}
}
