package netdev

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

func TestVethSetupCheckDelete(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := netnstest.New(t, "vhost")
	podNS := netnstest.New(t, "vpod")
	h, err := NewHost(hostNS.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	spec := PodSpec{Mode: datapath.ModeVeth, HostIfName: "lktestveth0", IfName: "eth0",
		Netns: podNS.Path(), IP: netip.MustParseAddr("10.99.0.5"), MTU: 1400}
	links, err := h.SetupPod(spec)
	if err != nil {
		t.Fatal(err)
	}
	if links.HostIfIndex == 0 || links.IfIndex == 0 || len(links.MAC) != 6 || len(links.HostMAC) != 6 {
		t.Fatalf("links = %+v", links)
	}
	if err := h.CheckPod(spec, links); err != nil {
		t.Fatalf("check after setup: %v", err)
	}
	hl, ok, err := h.LookupHost(spec.HostIfName)
	if err != nil || !ok || !hl.Up || hl.Type != "veth" || hl.Index != links.HostIfIndex {
		t.Fatalf("lookup host = %+v %v %v", hl, ok, err)
	}
	if mtu, err := h.LinkMTU(spec.HostIfName); err != nil || mtu != 1400 {
		t.Fatalf("host MTU = %d %v", mtu, err)
	}
	// Inside the pod: eth0 carries the /32 and both routes, nothing else global.
	podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("eth0 in pod: %v", err)
		}
		if l.Attrs().MTU != 1400 {
			t.Errorf("pod MTU = %d", l.Attrs().MTU)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		var got []string
		for _, r := range routes {
			got = append(got, r.String())
		}
		if len(routes) != 2 {
			t.Errorf("pod routes = %v, want gateway + default", got)
		}
		// Break the default route: CHECK must notice.
		if err := netlink.RouteDel(defaultRoute(l.Attrs().Index)); err != nil {
			t.Fatalf("delete default route: %v", err)
		}
		return nil
	})
	if err := h.CheckPod(spec, links); err == nil || !strings.Contains(err.Error(), "default route") {
		t.Fatalf("check with default route gone = %v", err)
	}

	for range 2 {
		if err := h.DeletePod(spec.HostIfName); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	if _, ok, _ := h.LookupHost(spec.HostIfName); ok {
		t.Fatal("host device still present")
	}
	podNS.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("pod end survived deleting the host end")
		}
		return nil
	})
	if err := h.CheckPod(spec, links); err == nil {
		t.Fatal("check after delete succeeded")
	}
}

func TestVethSetupUndoesOnFailure(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := netnstest.New(t, "uhost")
	podNS := netnstest.New(t, "upod")
	h, err := NewHost(hostNS.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// "lo" already exists in the pod: the rename fails after the pair exists.
	spec := PodSpec{Mode: datapath.ModeVeth, HostIfName: "lktestundo", IfName: "lo",
		Netns: podNS.Path(), IP: netip.MustParseAddr("10.99.0.6"), MTU: 1500}
	if _, err := h.SetupPod(spec); err == nil {
		t.Fatal("setup with a clashing ifname succeeded")
	}
	if _, ok, _ := h.LookupHost(spec.HostIfName); ok {
		t.Fatal("failed setup left the host device behind")
	}
	podNS.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName(tempPeerName(spec.HostIfName)); err == nil {
			t.Error("failed setup left the pod end behind")
		}
		return nil
	})
	spec.Netns = "/run/netns/lk-t-does-not-exist"
	if _, err := h.SetupPod(spec); err == nil {
		t.Fatal("setup in a missing netns succeeded")
	}
}

func TestProbeFeatures(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := netnstest.New(t, "feat")
	h, err := NewHost(hostNS.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	f := h.ProbeFeatures("/sys/fs/bpf/lanekit-test-does-not-exist")
	if f.Release == "" {
		t.Error("no kernel release")
	}
	for name, ft := range map[string]Feature{"tcx": f.TCX, "netkit": f.Netkit, "bpffs": f.BPFFS, "btf": f.BTF} {
		if ft.Detail == "" {
			t.Errorf("%s: no detail", name)
		}
	}
	if f.BPFFS.Supported && !strings.Contains(f.BPFFS.Detail, "/sys/fs/bpf") {
		t.Errorf("bpffs detail %q does not name the mount found", f.BPFFS.Detail)
	}
	if got := probeBPFFS(t.TempDir()); got.Supported {
		t.Errorf("a temp dir reported as bpffs: %+v", got)
	}
}
