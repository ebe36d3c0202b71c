package dpu

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/vf"
)

// linksIn lists the link names of a namespace.
func linksIn(t *testing.T, n ns.NetNS) []string {
	t.Helper()
	var names []string
	n.Do(func(ns.NetNS) error {
		ls, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		return nil
	})
	return names
}

// The split with a real agent on the "DPU" (the in-memory datapath: the BPF
// path is the lab's test): ADD creates the representor on the DPU and
// configures the VF in the pod, the host namespace keeps nothing; CHECK
// sees a broken pod side; DEL removes both ends.
func TestSplitEndpointLifecycle(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS, dpuNS, podNS := netnstest.New(t, "dpuhost"), netnstest.New(t, "dpudpu"), netnstest.New(t, "dpupod")
	a, dp, reps := dpuAgent(t, hostNS, dpuNS, "10.250.1.0/24", nil)
	defer a.Close()
	c := certs(t, "split")
	srv, addr, _ := startDPU(t, "127.0.0.1:0", c, agent.NewAPIServer(a))
	srv.Reps = reps.Reps
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hostCreds(t, c), ServerName: "dpu.test", Name: "host", Netns: hostNS.Path(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	api := &hostAPI{h: h}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := &apiv1.Attachment{ContainerId: "ctr-split", Ifname: "eth0"}
	resp, err := api.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: at, Netns: podNS.Path()})
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	ep := resp.GetEndpoint()
	rep := ep.GetInterfaces()[0].GetName()
	ip := strings.TrimSuffix(ep.GetIps()[0].GetAddress(), "/32")
	if !strings.HasPrefix(ip, "10.250.1.") {
		t.Fatalf("address %s not from the DPU's pod CIDR", ip)
	}
	ids, _ := dp.Endpoints()
	if len(ids) != 1 || ids[0] != ep.GetId() {
		t.Fatalf("datapath endpoints %v, want [%d]", ids, ep.GetId())
	}
	// DPU side: the representor, up, with the pod's /32.
	dpuNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(rep)
		if err != nil {
			t.Fatalf("representor %s on the DPU: %v", rep, err)
		}
		rs, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		if len(rs) != 1 || rs[0].Dst.String() != ip+"/32" {
			t.Errorf("representor routes %v, want %s/32", rs, ip)
		}
		return nil
	})
	// Pod side: eth0 with the address, the VF's MAC and the default route.
	mac := ep.GetInterfaces()[1].GetMac()
	podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("eth0 in the pod: %v", err)
		}
		if l.Attrs().HardwareAddr.String() != mac || mac != vf.MACFor(rep).String() {
			t.Errorf("pod eth0 MAC %s, DPU says %s", l.Attrs().HardwareAddr, mac)
		}
		return nil
	})
	// Host side: nothing of lanekit (the VF moved into the pod; no routes).
	for _, n := range linksIn(t, hostNS) {
		if n != "lo" {
			t.Errorf("host namespace holds %s after ADD", n)
		}
	}
	hostNS.Do(func(ns.NetNS) error {
		rs, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		if len(rs) != 0 {
			t.Errorf("host namespace has routes %v", rs)
		}
		return nil
	})
	// A repeated ADD returns the same endpoint.
	if again, err := api.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: at, Netns: podNS.Path()}); err != nil || again.GetEndpoint().GetId() != ep.GetId() {
		t.Fatalf("repeated add: %v %v", again, err)
	}
	if _, err := api.CheckEndpoint(ctx, &apiv1.CheckEndpointRequest{Attachment: at, Netns: podNS.Path()}); err != nil {
		t.Fatalf("check: %v", err)
	}
	podNS.Do(func(ns.NetNS) error {
		l, _ := netlink.LinkByName("eth0")
		return netlink.LinkSetDown(l)
	})
	if _, err := api.CheckEndpoint(ctx, &apiv1.CheckEndpointRequest{Attachment: at, Netns: podNS.Path()}); err == nil {
		t.Fatal("check passed with the pod's VF down")
	}
	if _, err := api.DelEndpoint(ctx, &apiv1.DelEndpointRequest{Attachment: at, Netns: podNS.Path()}); err != nil {
		t.Fatalf("del: %v", err)
	}
	for _, n := range append(linksIn(t, dpuNS), linksIn(t, podNS)...) {
		if n != "lo" {
			t.Errorf("%s left after DEL", n)
		}
	}
	if ids, _ := dp.Endpoints(); len(ids) != 0 {
		t.Errorf("datapath endpoints %v after DEL", ids)
	}
	if _, err := os.Stat(podNS.Path()); err != nil {
		t.Fatal(err)
	}

	// GC through the host: an endpoint whose attachment is not valid goes.
	if _, err := api.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: at, Netns: podNS.Path()}); err != nil {
		t.Fatalf("add again: %v", err)
	}
	gc, err := api.GC(ctx, &apiv1.GCRequest{})
	if err != nil || len(gc.GetRemoved()) != 1 {
		t.Fatalf("gc: %v %v, want the endpoint removed", gc, err)
	}
	if ids, _ := dp.Endpoints(); len(ids) != 0 {
		t.Errorf("datapath endpoints %v after GC", ids)
	}

	// Reconcile: a pod whose namespace went away while the link was down
	// is deleted on the DPU when the host reconciles.
	gone := netnstest.New(t, "dpugone")
	at2 := &apiv1.Attachment{ContainerId: "ctr-gone", Ifname: "eth0"}
	if _, err := api.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: at2, Netns: gone.Path()}); err != nil {
		t.Fatalf("add: %v", err)
	}
	if out, err := exec.Command("ip", "netns", "del", netnstest.Name("dpugone")).CombinedOutput(); err != nil {
		t.Fatalf("delete the pod's netns: %v %s", err, out)
	}
	n, err := h.Reconcile(ctx)
	exec.Command("ip", "netns", "add", netnstest.Name("dpugone")).Run() // for the cleanup
	if err != nil || n != 1 {
		t.Fatalf("reconcile: deleted %d (%v), want 1", n, err)
	}
	if ids, _ := dp.Endpoints(); len(ids) != 0 {
		t.Errorf("datapath endpoints %v after reconcile", ids)
	}
}

// dpuAgent is a real DPU-side agent in dpuNS with an in-memory datapath and
// veth representors whose host ends are in hostNS; tweak adjusts its config.
// The caller closes it.
func dpuAgent(t *testing.T, hostNS, dpuNS ns.NetNS, podCIDR string, tweak func(*agent.Config)) (*agent.Agent, *agenttest.MemoryDatapath, Representors) {
	t.Helper()
	dp := agenttest.NewMemoryDatapath()
	reps := Representors{Reps: vf.Veth{HostNetns: hostNS.Path()}, Netns: dpuNS.Path()}
	cfg := agent.Config{
		StateDir: t.TempDir(), Socket: filepath.Join(t.TempDir(), "dpu.sock"), PodCIDR: netip.MustParsePrefix(podCIDR),
		HostNetns: dpuNS.Path(), DeviceMode: "veth", MTU: 1400, PodDevices: reps,
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return dp, nil },
	}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := agent.New(cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return a, dp, reps
}
