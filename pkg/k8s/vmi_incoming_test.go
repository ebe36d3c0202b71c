package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/pkg/k8sobj"
)

// TestVMIResolverMigrationTarget: on a real API server, the target launcher
// pod of a VMI's migration in progress resolves as incoming with the
// address and MAC the VM has on the source (the VMI's status), claimed at
// the migration's start; the source launcher pod, and the target once the
// migration is over, resolve as ordinary VM attachments; a target whose VMI
// reports no address is an error (the ADD retries, no new address).
func TestVMIResolverMigrationTarget(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	vms := &vmStore{}
	run(t, Config{NodeName: "node-b", Client: e.c, Dynamic: e.dc, VMs: vms})
	if err := k8stest.InstallKubeVirtCRD(ctx, e.srv.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	// The Nodes' pod CIDRs: 10.244.1.0/24 (node-a), 10.244.2.0/24 (node-b).
	for _, n := range []string{"node-a", "node-b"} {
		mustCreate(t, e.c.CoreV1().Nodes().Create, claimNode(n, ""))
	}
	vmis := e.dc.Resource(VMIResource).Namespace("default")
	created, err := vmis.Create(ctx, fakeVMI(map[string]string{labelVMINode: "node-a"}, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setStatus := func(addr string, state map[string]any) {
		t.Helper()
		cur, err := vmis.Get(ctx, "vm1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Object["status"] = withIfaces(fakeVMI(nil, state), addr).Object["status"]
		if _, err := vmis.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	launcher := func(name, node string, ips ...string) (string, string) {
		lp := pod("default", name, node, map[string]string{"kubevirt.io": "virt-launcher", labelCreatedBy: string(created.GetUID())})
		lp.Annotations = map[string]string{annotationDomain: "vm1", k8sobj.NetworkStatusAnnotation: launcherStatus(ips...)}
		p := mustCreate(t, e.c.CoreV1().Pods("default").Create, lp)
		return p.Name, string(p.UID)
	}
	src, srcUID := launcher("virt-launcher-vm1-aaaaa", "node-a", "10.244.1.5")
	dst, dstUID := launcher("virt-launcher-vm1-bbbbb", "node-b")

	// The guest reports another pod's address: the source launcher pod was
	// not given it, so the target refuses it (the ADD fails, nothing moves).
	setStatus("10.244.1.9", running())
	if got, _, err := vms.resolve("default", dst, dstUID); err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Errorf("target of a VMI reporting an address lanekit did not give it: %+v %v, want refused", got, err)
	}
	setStatus("10.244.1.5", running())
	got, ok, err := vms.resolve("default", dst, dstUID)
	if err != nil || !ok {
		t.Fatalf("resolve target: %v %v", ok, err)
	}
	if !got.Incoming || got.Address != netip.MustParseAddr("10.244.1.5") || got.Generation != 1795654800_000000000 ||
		got.MAC != "02:00:00:00:00:05" || got.Name != "vm1" {
		t.Errorf("target resolved %+v: want incoming with 10.244.1.5, the guest's MAC, generation 1795654800 s in ns", got)
	}
	// given rewrites the source launcher pod's network-status (what the
	// target trusts) and waits until the target's resolution fails with want.
	given := func(want string, ips ...string) {
		t.Helper()
		sp, err := e.c.CoreV1().Pods("default").Get(ctx, src, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sp.Annotations[k8sobj.NetworkStatusAnnotation] = launcherStatus(ips...)
		if _, err := e.c.CoreV1().Pods("default").Update(ctx, sp, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("the target refuses the source given %v", ips), func() bool {
			_, _, err := vms.resolve("default", dst, dstUID)
			return err != nil && strings.Contains(err.Error(), want)
		})
	}
	// A namespace editor rewrote the source launcher pod's network-status to
	// name a running pod's address: kubelet's status.podIPs of that pod
	// still says whose it is, and the target refuses it.
	victim := mustCreate(t, e.c.CoreV1().Pods("default").Create, pod("default", "victim", "node-a", nil))
	victim.Status.Phase, victim.Status.PodIP, victim.Status.PodIPs = corev1.PodRunning, "10.244.1.9", []corev1.PodIP{{IP: "10.244.1.9"}}
	if _, err := e.c.CoreV1().Pods("default").UpdateStatus(ctx, victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setStatus("10.244.1.9", running())
	given("10.244.1.9 is held by pod default/victim", "10.244.1.9")
	// Even an address the source launcher pod holds is refused when no
	// Node's IPAM could have given it: node-a's broadcast and network
	// addresses, an address outside every pod CIDR.
	for _, bad := range []string{"10.244.1.255", "10.244.1.0", "10.99.0.5"} {
		setStatus(bad, running())
		given(bad+" is not a usable address of any Node's pod CIDR", bad)
	}
	setStatus("10.244.1.5", running())
	// A dual-stack VM (its source launcher has an IPv6 address on the
	// lanekit network too) is refused: its IPv6 address cannot move here.
	given("IPv6 address fd00:10:244:1::5", "10.244.1.5", "fd00:10:244:1::5")
	if got, ok, err := vms.resolve("default", src, srcUID); err != nil || !ok || got.Incoming || got.Address.IsValid() {
		t.Errorf("source resolved %+v %v %v: want an ordinary attachment", got, ok, err)
	}
	setStatus("", running())
	if _, _, err := vms.resolve("default", dst, dstUID); err == nil || !strings.Contains(err.Error(), "IPv4 addresses") {
		t.Errorf("target of a VMI without an address: %v, want an error", err)
	}
	done := running()
	done["completed"], done["endTimestamp"] = true, "2026-11-26T01:00:07Z"
	setStatus("10.244.1.5", done)
	if got, _, err := vms.resolve("default", dst, dstUID); err != nil || got.Incoming {
		t.Errorf("target after completion resolved %+v %v: want an ordinary attachment", got, err)
	}
}

// TestVMIResolverPendingMigrationTarget: KubeVirt names the target pod in
// the VMI's migrationState only after that pod runs, i.e. after its CNI
// ADD. A launcher pod with KubeVirt's migration job label resolves as
// incoming, with the address the VM has in its launcher pod on the VMI's
// node, when the VirtualMachineInstanceMigration it names exists with that
// UID, moves this VMI and is not over; otherwise it is refused (a forged
// label) or an ordinary attachment (a migration that is over).
func TestVMIResolverPendingMigrationTarget(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	vms := &vmStore{}
	run(t, Config{NodeName: "node-b", Client: e.c, Dynamic: e.dc, VMs: vms})
	for _, install := range []func(context.Context, *rest.Config) error{k8stest.InstallKubeVirtCRD, k8stest.InstallKubeVirtMigrationCRD} {
		if err := install(ctx, e.srv.RESTConfig()); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		mustCreate(t, e.c.CoreV1().Nodes().Create, claimNode(n, ""))
	}
	vmis := e.dc.Resource(VMIResource).Namespace("default")
	created, err := vmis.Create(ctx, fakeVMI(nil, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Object["status"] = withIfaces(fakeVMI(nil, nil), "10.244.1.5").Object["status"] // nodeName node-a
	if _, err := vmis.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	migs := e.dc.Resource(VMIMResource).Namespace("default")
	mig := func(name, vmi string) *unstructured.Unstructured {
		t.Helper()
		m, err := migs.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec":     map[string]any{"vmiName": vmi}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	launcher := func(name, node string, job *unstructured.Unstructured, jobUID string, ips ...string) (string, string) {
		lp := pod("default", name, node, map[string]string{"kubevirt.io": "virt-launcher", labelCreatedBy: string(created.GetUID())})
		lp.Annotations = map[string]string{annotationDomain: "vm1", k8sobj.NetworkStatusAnnotation: launcherStatus(ips...)}
		if job != nil {
			lp.Labels["kubevirt.io/migrationJobUID"] = jobUID
			lp.Annotations["kubevirt.io/migrationJobName"] = job.GetName()
		}
		p := mustCreate(t, e.c.CoreV1().Pods("default").Create, lp)
		return p.Name, string(p.UID)
	}
	launcher("virt-launcher-vm1-aaaaa", "node-a", nil, "", "10.244.1.5")
	m1 := mig("mig1", "vm1")
	dst, dstUID := launcher("virt-launcher-vm1-bbbbb", "node-b", m1, string(m1.GetUID()))
	got, ok, err := vms.resolve("default", dst, dstUID)
	if err != nil || !ok {
		t.Fatalf("resolve the pending target: %v %v", ok, err)
	}
	if !got.Incoming || got.Address != netip.MustParseAddr("10.244.1.5") || got.Generation != uint64(m1.GetCreationTimestamp().UnixNano()) {
		t.Errorf("pending target resolved %+v: want incoming with 10.244.1.5 at the migration's creation (%d)", got, m1.GetCreationTimestamp().UnixNano())
	}

	// A label naming another migration's UID, or a migration of another VMI.
	forged, forgedUID := launcher("virt-launcher-vm1-ccccc", "node-b", m1, "0f0f0f0f-0000-0000-0000-000000000000")
	if _, _, err := vms.resolve("default", forged, forgedUID); err == nil || !strings.Contains(err.Error(), "the pod's label says") {
		t.Errorf("target with a forged migration UID: %v, want refused", err)
	}
	m2 := mig("mig2", "vm9")
	other, otherUID := launcher("virt-launcher-vm1-ddddd", "node-b", m2, string(m2.GetUID()))
	if _, _, err := vms.resolve("default", other, otherUID); err == nil || !strings.Contains(err.Error(), `not "vm1"`) {
		t.Errorf("target of a migration of another VMI: %v, want refused", err)
	}
	// Once the migration is over the pod is an ordinary attachment.
	m1.Object["status"] = map[string]any{"phase": "Succeeded"}
	if _, err := migs.UpdateStatus(ctx, m1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _, err := vms.resolve("default", dst, dstUID); err != nil || got.Incoming {
		t.Errorf("target after the migration succeeded: %+v %v, want an ordinary attachment", got, err)
	}
}
