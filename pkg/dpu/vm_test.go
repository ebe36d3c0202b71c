package dpu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// A VM on a DPU node (the in-memory datapath: the BPF path is the lab's
// TestDPULab): the host agent's AddVM creates nothing on the host or in the
// VM's launcher namespace; the DPU gets the representor with the VM's /32
// and the VM's multiqueue device in a namespace of its own, and serves the
// AF_XDP sockets' socket; a second ADD of the name is AlreadyExists and
// keeps it; reconcile leaves it; DelVM removes all of it. A live-migration
// target is refused.
func TestSplitVMLifecycle(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS, dpuNS, launcher := netnstest.New(t, "dvmhost"), netnstest.New(t, "dvmdpu"), netnstest.New(t, "dvmlaunch")
	sockDir := filepath.Join(t.TempDir(), "vm")
	a, dp, reps := dpuAgent(t, hostNS, dpuNS, "10.250.2.0/24", func(c *agent.Config) { c.VMSocketDir = sockDir })
	defer a.Close()
	c := certs(t, "splitvm")
	srv, addr, _ := startDPU(t, "127.0.0.1:0", c, agent.NewAPIServer(a))
	srv.Reps = reps.Reps
	vmns := VMNetns{Dir: t.TempDir(), Prefix: "dpu-test-"}
	srv.VMNetns = vmns
	t.Cleanup(func() { vmns.Delete("vm1") })
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hostCreds(t, c), ServerName: "dpu.test", Name: "host", Netns: hostNS.Path(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	api := &hostAPI{h: h}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	req := &apiv1.AddVMRequest{Name: "vm1", Netns: launcher.Path(), Queues: 2, Mac: "02:00:00:00:00:51",
		Labels: map[string]string{"kubevirt.io/domain": "vm1"}}
	resp, err := api.AddVM(ctx, req)
	if err != nil {
		t.Fatalf("add vm: %v", err)
	}
	vm := resp.GetVm()
	ep := vm.GetEndpoint()
	if ep.GetNetns() != vmns.Path("vm1") {
		t.Errorf("the VM's device namespace is %q, want the DPU's %s", ep.GetNetns(), vmns.Path("vm1"))
	}
	if !isNetnsMount(vmns.Path("vm1")) {
		t.Fatalf("%s is not a mounted namespace", vmns.Path("vm1"))
	}
	if filepath.Dir(vm.GetSocket()) != sockDir {
		t.Errorf("sockets' socket %s, want the DPU agent's under %s", vm.GetSocket(), sockDir)
	}
	if fi, err := os.Stat(vm.GetSocket()); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the DPU serves no AF_XDP sockets' socket at %s: %v", vm.GetSocket(), err)
	}
	if ids, _ := dp.Endpoints(); len(ids) != 1 {
		t.Errorf("datapath endpoints %v, want the VM's", ids)
	}
	// The DPU: the representor with the VM's /32; the VM's device (2 queues,
	// the VM's MAC) in its own namespace.
	ip := vm.GetAddress()
	dpuNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ep.GetInterfaces()[0].GetName())
		if err != nil {
			t.Fatalf("representor on the DPU: %v", err)
		}
		rs, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		if len(rs) != 1 || rs[0].Dst.String() != ip {
			t.Errorf("representor routes %v, want %s", rs, ip)
		}
		return nil
	})
	dev, err := ns.GetNS(vmns.Path("vm1"))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	dev.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("the VM's device in its DPU namespace: %v", err)
		}
		if l.Attrs().HardwareAddr.String() != req.GetMac() || l.Attrs().NumRxQueues != 2 {
			t.Errorf("VM device mac %s rx queues %d, want %s and 2", l.Attrs().HardwareAddr, l.Attrs().NumRxQueues, req.GetMac())
		}
		return nil
	})
	// The host and the launcher: nothing.
	for _, n := range append(linksIn(t, hostNS), linksIn(t, launcher)...) {
		if n != "lo" {
			t.Errorf("host side holds %s after AddVM", n)
		}
	}
	list, err := api.ListVMs(ctx, &apiv1.ListVMsRequest{})
	if err != nil || len(list.GetVms()) != 1 || list.GetVms()[0].GetName() != "vm1" {
		t.Fatalf("host's ListVMs: %v %v", list, err)
	}
	if _, err := api.AddVM(ctx, req); status.Code(err) != codes.AlreadyExists {
		t.Errorf("second AddVM: %v, want AlreadyExists", err)
	}
	if !isNetnsMount(vmns.Path("vm1")) {
		t.Error("a refused second AddVM removed the first one's namespace")
	}
	if n, err := h.Reconcile(ctx); err != nil || n != 0 {
		t.Errorf("reconcile deleted %d (%v): the VM's device namespace is the DPU's", n, err)
	}
	mig := &apiv1.AddVMRequest{Name: "vm2", Netns: launcher.Path(), Queues: 1, Incoming: true, Address: "10.250.2.99"}
	if _, err := api.AddVM(ctx, mig); status.Code(err) != codes.Unimplemented {
		t.Errorf("incoming VM on a DPU node: %v, want Unimplemented", err)
	}

	del, err := api.DelVM(ctx, &apiv1.DelVMRequest{Name: "vm1"})
	if err != nil || !del.GetExisted() {
		t.Fatalf("del vm: %v %v", del, err)
	}
	if _, err := os.Stat(vmns.Path("vm1")); !os.IsNotExist(err) {
		t.Errorf("the VM's device namespace is left after DelVM: %v", err)
	}
	for _, n := range linksIn(t, dpuNS) {
		if n != "lo" {
			t.Errorf("%s left on the DPU after DelVM", n)
		}
	}
	if ids, _ := dp.Endpoints(); len(ids) != 0 {
		t.Errorf("datapath endpoints %v after DelVM", ids)
	}
	if del, err := api.DelVM(ctx, &apiv1.DelVMRequest{Name: "vm1"}); err != nil || del.GetExisted() {
		t.Errorf("second DelVM: %v %v, want success with existed false", del, err)
	}
}
