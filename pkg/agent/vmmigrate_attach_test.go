package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/kubevirt"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestVMAttachmentIncoming: the ADD of a VM attachment whose launcher pod
// the resolver (pkg/k8s) says is a migration target makes an incoming VM
// endpoint with the VM's address on the source, its MAC and the claim's
// generation, not a new address; an ordinary launcher gets one of the pod
// CIDR. The target's completed migration state then activates it.
func TestVMAttachmentIncoming(t *testing.T) {
	e := newAttachEnv(t)
	a := e.start(t)
	defer func() { a.Close() }()
	uid := "4f1c2d3e-0000-4000-8000-00000000beef"
	vol := filepath.Join(e.kubelet, "pods", uid, "volumes", "kubernetes.io~empty-dir", "sockets")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	moved := netip.MustParseAddr("10.244.1.5") // another node's pod CIDR
	incoming := true
	a.SetVMIResolver(func(ns, name, podUID string) (VMIInfo, bool, error) {
		info := VMIInfo{Namespace: "ns1", Name: "db", Queues: 1, MAC: "02:00:00:bb:00:05", Labels: map[string]string{"app": "db"}}
		if incoming {
			info.Incoming, info.Address, info.Generation = true, moved, 1795654800
		}
		return info, true, nil
	})
	req := VMAttachRequest{
		ContainerID: "c2", IfName: "net1", Netns: netnstest.New(t, "launcher3").Path(),
		Labels: map[string]string{argPodNamespace: "ns1", argPodName: "virt-launcher-db-bbbbb", LabelPodUID: uid},
	}
	va, err := a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach the migration target: %v", err)
	}
	ep := va.VM.Endpoint
	if ep.IP != moved || ep.MAC != "02:00:00:bb:00:05" || ep.VM.Migration == nil ||
		ep.VM.Migration.State != endpoint.VMIncoming || ep.VM.Migration.Generation != 1795654800 {
		t.Fatalf("target endpoint ip %s mac %s migration %+v: want incoming with %s at generation 1795654800",
			ep.IP, ep.MAC, ep.VM.Migration, moved)
	}
	// The follower's completed state activates it (vmimigration.go).
	a.VMIMigrationChanged(VMIMigration{Namespace: "ns1", Name: "db", VM: ep.VM.Name, Role: kubevirt.RoleTarget,
		Migration: kubevirt.Migration{UID: "mig-1", SourceNode: "node-a", TargetNode: "node-b", TargetPod: "virt-launcher-db-bbbbb",
			Start: time.Unix(1795654800, 0), End: time.Unix(1795654807, 0), Completed: true}})
	vms, err := a.ListVMs()
	if err != nil || len(vms) != 1 || vms[0].Endpoint.VM.Migration == nil || vms[0].Endpoint.VM.Migration.State != endpoint.VMActive ||
		vms[0].Endpoint.IP != moved {
		t.Fatalf("after the completed migration: %+v %v, want the endpoint active with %s", vms, err, moved)
	}
	if existed, err := a.DetachVM(req.ContainerID, req.IfName); !existed || err != nil {
		t.Fatalf("DEL: %v %v", existed, err)
	}
	incoming = false
	va, err = a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach an ordinary launcher: %v", err)
	}
	if ep := va.VM.Endpoint; !netip.MustParsePrefix("10.77.0.0/28").Contains(ep.IP) || (ep.VM.Migration != nil && ep.VM.Migration.State == endpoint.VMIncoming) {
		t.Errorf("ordinary endpoint ip %s migration %+v: want a new pod-CIDR address, active", ep.IP, ep.VM.Migration)
	}
	if existed, err := a.DetachVM(req.ContainerID, req.IfName); !existed || err != nil {
		t.Fatalf("DEL: %v %v", existed, err)
	}
}

// TestVMGuestFramesActivate: a migration target's endpoint stays incoming
// while its backend has moved nothing out of the guest, and goes active — by
// "guest-frames", before any migration state — once the backend reports the
// guest's first frames (what the guest's announcement after the switch makes).
func TestVMGuestFramesActivate(t *testing.T) { backendActivates(t, false, ActivatedByGuestFrames) }

// TestVMGuestFramesRestart: the same when the agent restarted while the
// endpoint was incoming: the new agent watches the adopted endpoint.
func TestVMGuestFramesRestart(t *testing.T) { backendActivates(t, true, ActivatedByGuestFrames) }

// TestVMDeviceStartActivates: an incoming endpoint whose backend reports
// acked virtio features (the target QEMU started the device: the VM runs
// there) is activated, by device-start, with no frame from the guest yet.
// Without the acked-features check the endpoint stays incoming and this
// fails.
func TestVMDeviceStartActivates(t *testing.T) { backendActivates(t, false, ActivatedByDeviceStart) }

func backendActivates(t *testing.T, restart bool, by string) {
	e := newAttachEnv(t)
	a := e.start(t)
	defer func() { a.Close() }()
	uid := "4f1c2d3e-0000-4000-8000-00000000cafe"
	vol := filepath.Join(e.kubelet, "pods", uid, "volumes", "kubernetes.io~empty-dir", "sockets")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	moved := netip.MustParseAddr("10.244.1.6")
	resolver := func(ns, name, podUID string) (VMIInfo, bool, error) {
		return VMIInfo{Namespace: "ns1", Name: "db", Queues: 1, MAC: "02:00:00:bb:00:06", Labels: map[string]string{"app": "db"},
			Incoming: true, Address: moved, Generation: 1795654900}, true, nil
	}
	a.SetVMIResolver(resolver)
	req := VMAttachRequest{
		ContainerID: "c3", IfName: "net1", Netns: netnstest.New(t, "launcher4").Path(),
		Labels: map[string]string{argPodNamespace: "ns1", argPodName: "virt-launcher-db-ccccc", LabelPodUID: uid},
	}
	va, err := a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach the migration target: %v", err)
	}
	b := va.VM.Endpoint.VM.Backend
	if b == nil || b.MetricsSocket == "" {
		t.Fatalf("no backend metrics socket: %+v", b)
	}
	if restart {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		a = e.start(t)
		a.SetVMIResolver(resolver)
	}
	state := func() (endpoint.VMMigrationState, string) {
		vms, err := a.ListVMs()
		if err != nil || len(vms) != 1 || vms[0].Endpoint.VM.Migration == nil {
			t.Fatalf("ListVMs: %+v %v", vms, err)
		}
		m := vms[0].Endpoint.VM.Migration
		return m.State, m.ActivatedBy
	}
	// The backend answers (0 frames) and the endpoint stays incoming.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if p, err := readBackendProgress(b.MetricsSocket, b.UID); err == nil && p.by() == "" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the backend's metrics: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(20 * guestPollEvery)
	if s, _ := state(); s != endpoint.VMIncoming {
		t.Fatalf("state %s with no frame from the guest, want incoming", s)
	}
	file := testutil.FakeVhostTxFile(b.MetricsSocket)
	if by == ActivatedByDeviceStart {
		file = testutil.FakeVhostAckedFile(b.MetricsSocket)
	}
	if err := os.WriteFile(file, []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s, got := state()
		if s == endpoint.VMActive {
			if got != by {
				t.Errorf("activated by %q, want %q", got, by)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s 5 s after the backend reported %s", s, by)
		}
	}
	if existed, err := a.DetachVM(req.ContainerID, req.IfName); !existed || err != nil {
		t.Fatalf("DEL: %v %v", existed, err)
	}
}
