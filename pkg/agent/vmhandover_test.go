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

// TestVMHandOverOnSourceStop: on a migration's source, the VM's address
// goes to the target node when the source backend's device stops (the
// source QEMU's switch-over), before any claim of the cluster says so; the
// claims' syncs keep it there; a device running again (the source QEMU
// resumed the guest) or a failed migration takes it back; a completed
// migration leaves it with the target even if the device runs again; a
// restarted agent keeps a hand-over. A backend that does not export the
// gauge hands nothing over.
func TestVMHandOverOnSourceStop(t *testing.T) {
	e := newAttachEnv(t)
	addMigUplink(t, e.fx, "handover")
	e.dp = newFake()
	a := e.start(t)
	defer func() { a.Close() }()
	n := &migNode{a: a, fx: e.fx, dp: e.dp}
	uid := "4f1c2d3e-0000-4000-8000-00000000d00d"
	vol := filepath.Join(e.kubelet, "pods", uid, "volumes", "kubernetes.io~empty-dir", "sockets")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	a.SetVMIResolver(func(ns, name, podUID string) (VMIInfo, bool, error) {
		return VMIInfo{Namespace: "ns1", Name: "web", Queues: 1, MAC: "02:00:00:bb:00:07", Labels: map[string]string{"app": "web"}}, true, nil
	})
	req := VMAttachRequest{
		ContainerID: "c5", IfName: "pod115dc3606fb", Netns: netnstest.New(t, "launcher-ho").Path(),
		Labels: map[string]string{argPodNamespace: "ns1", argPodName: "virt-launcher-web-aaaaa", LabelPodUID: uid},
	}
	va, err := a.AttachVM(req)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	ep := va.VM.Endpoint
	b := ep.VM.Backend
	if b == nil || b.MetricsSocket == "" {
		t.Fatalf("no backend metrics socket: %+v", b)
	}
	vm, ip, key := ep.VM.Name, ep.IP, ep.StoreKey()
	running := func(v string) {
		t.Helper()
		if err := os.WriteFile(testutil.FakeVhostRunningFile(b.MetricsSocket), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	state := func() *endpoint.VMMigration {
		vms, err := a.ListVMs()
		if err != nil || len(vms) != 1 {
			t.Fatalf("ListVMs: %+v %v", vms, err)
		}
		if m := vms[0].Endpoint.VM.Migration; m != nil {
			return m
		}
		return &endpoint.VMMigration{State: endpoint.VMActive}
	}
	waitState := func(what string, want endpoint.VMMigrationState) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); state().State != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: state %+v, want %s", what, state(), want)
			}
		}
	}
	local := "dev " + ep.HostIfName
	assertLocal := func(what string) {
		t.Helper()
		if !n.inDatapath(t, ep.ID) || n.route(t, ip) != local || n.holder(t, ip) != key || n.forwarding(t, ep.HostIfName) != "1" {
			t.Errorf("%s: in datapath %v, route %q (want %q), %s held by %q (want %q), forwarding %s", what,
				n.inDatapath(t, ep.ID), n.route(t, ip), local, ip, n.holder(t, ip), key, n.forwarding(t, ep.HostIfName))
		}
	}
	const via = "via 192.0.2.2"
	assertHanded := func(what string) {
		t.Helper()
		if m := state(); m.State != endpoint.VMMoved || !m.HandedOver || m.MovedTo != "192.0.2.2" {
			t.Errorf("%s: %+v, want moved (handed over) to 192.0.2.2", what, m)
		}
		if n.inDatapath(t, ep.ID) || n.route(t, ip) != via || n.holder(t, ip) != movedOwner(vm) || n.forwarding(t, ep.HostIfName) != "0" {
			t.Errorf("%s: in datapath %v, route %q (want %q), %s held by %q (want %q), forwarding %s", what,
				n.inDatapath(t, ep.ID), n.route(t, ip), via, ip, n.holder(t, ip), movedOwner(vm), n.forwarding(t, ep.HostIfName))
		}
	}
	mig := func(uid string, start int64) VMIMigration {
		return VMIMigration{Namespace: "ns1", Name: "web", VM: vm, Role: kubevirt.RoleSource,
			Migration: kubevirt.Migration{UID: uid, SourceNode: "node-a", SourcePod: "virt-launcher-web-aaaaa", TargetNode: "node-b",
				TargetPod: "virt-launcher-web-bbbbb", Start: time.Unix(start, 0)},
			TargetVia: netip.MustParseAddr("192.0.2.2")}
	}

	// A backend without the gauge: the device "stops" unseen, nothing moves.
	m1 := mig("mig-1", 1795655000)
	a.VMIMigrationChanged(m1)
	time.Sleep(30 * guestPollEvery)
	assertLocal("a backend without the gauge")

	// The device runs, then stops: handed over, and the claims' sync
	// (none but this node's own, left out) keeps it there.
	running("1")
	time.Sleep(10 * guestPollEvery)
	assertLocal("running during the migration")
	running("0")
	waitState("the source device stopped", endpoint.VMMoved)
	assertHanded("handed over")
	if _, _, err := a.SyncEndpointRoutes(nil); err != nil {
		t.Fatal(err)
	}
	assertHanded("after a claims sync without the target's claim")
	// A restarted agent keeps the hand-over from its records, before the
	// migration's state is sent again; the state re-sent re-arms the watch.
	a.Close()
	a = e.start(t)
	n.a = a
	if _, _, err := a.SyncEndpointRoutes(nil); err != nil {
		t.Fatal(err)
	}
	assertHanded("a restarted agent, after a claims sync")
	a.VMIMigrationChanged(m1)
	// The source QEMU resumes the guest (a failed switch-over): taken back.
	running("1")
	waitState("the source device runs again", endpoint.VMActive)
	if m := state(); m.ActivatedBy != ActivatedByReclaim || m.HandedOver {
		t.Errorf("reclaimed: %+v", m)
	}
	assertLocal("reclaimed")
	if _, _, err := a.SyncEndpointRoutes(nil); err != nil {
		t.Fatal(err)
	}
	assertLocal("reclaimed, after a claims sync")
	// Stopped again, then the migration state says failed: taken back.
	running("0")
	waitState("stopped again", endpoint.VMMoved)
	f := m1
	f.Failed, f.FailureReason = true, "test"
	a.VMIMigrationChanged(f)
	waitState("the migration failed", endpoint.VMActive)
	assertLocal("after the failed migration")
	time.Sleep(20 * guestPollEvery)
	assertLocal("no watch after the failed migration")

	// A second migration completes: the cluster's claim replaces the
	// hand-over and a device running again changes nothing.
	running("1")
	m2 := mig("mig-2", 1795655100)
	a.VMIMigrationChanged(m2)
	time.Sleep(10 * guestPollEvery)
	running("0")
	waitState("the second migration's switch-over", endpoint.VMMoved)
	assertHanded("second hand-over")
	claim := EndpointRoute{Addr: ip, Via: netip.MustParseAddr("192.0.2.2"), Generation: uint64(time.Unix(1795655107, 0).UnixNano()) + 1,
		VM: vm, Node: "node-b"}
	if _, _, err := a.SyncEndpointRoutes([]EndpointRoute{claim}); err != nil {
		t.Fatal(err)
	}
	c := m2
	c.Completed, c.End = true, time.Unix(1795655107, 0)
	a.VMIMigrationChanged(c)
	running("1")
	time.Sleep(20 * guestPollEvery)
	assertHanded("completed, the device running again")
	if _, err := a.DetachVM(req.ContainerID, req.IfName); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	eps, err := a.endpoints()
	watches := len(a.sourceWatches)
	a.mu.Unlock()
	if left := handovers(eps); err != nil || len(left) != 0 || watches != 0 {
		t.Errorf("after the source pod's DEL: hand-over routes %v (%v), %d watches", left, err, watches)
	}
}
