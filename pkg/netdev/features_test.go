package netdev

import (
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestProbeKernel checks the merged probe set against what this kernel is
// known to have by other means: AF_XDP and tcx work (the datapath tests use
// them), and the netkit answer agrees with creating one by hand.
func TestProbeKernel(t *testing.T) {
	testutil.RequireRoot(t)
	f := ProbeKernel("/sys/fs/bpf", "")
	for _, row := range f.Table() {
		if row.Feature.Detail == "" {
			t.Errorf("%s: no detail", row.Name)
		}
	}
	if !f.TCX.Supported {
		t.Skipf("skipping: kernel without tcx: %s", f.TCX.Detail)
	}
	if !f.AFXDP.Supported || !strings.Contains(f.AFXDP.Detail, "copy-mode") {
		t.Errorf("af_xdp = %+v, want a copy-mode bind", f.AFXDP)
	}
	if !f.RedirectPeer.Supported || !f.XDP.Supported || !f.BTF.Supported {
		t.Errorf("redirect_peer %+v xdp %+v btf %+v", f.RedirectPeer, f.XDP, f.BTF)
	}
	if !f.AFXDPZeroCopy.Unknown {
		t.Errorf("zero-copy without an uplink = %+v, want unknown", f.AFXDPZeroCopy)
	}
	// Netkit: compare with an independent attempt in a test namespace.
	n := netnstest.New(t, "fkit")
	var byHand error
	n.Do(func(ns.NetNS) error {
		byHand = CreateNetkit(NetkitSpec{Name: "lkfk0", PeerName: "lkfk1", Mode: NetkitL3, Policy: NetkitPass, PeerPolicy: NetkitDrop})
		return nil
	})
	if f.Netkit.Supported != (byHand == nil) {
		t.Errorf("netkit probe %+v disagrees with creating one (%v)", f.Netkit, byHand)
	}
	// TUNSETSTEERINGEBPF: present in every kernel with tun since 4.16; the
	// probe must have actually set a program.
	if _, err := os.Stat("/dev/net/tun"); err == nil && !f.TunSteering.Supported {
		t.Errorf("tun steering = %+v", f.TunSteering)
	}
	// The scratch namespace leaves nothing in ours.
	links, _ := netlink.LinkList()
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, "lkxskprobe") || strings.HasPrefix(n, "lktunprobe") || strings.HasPrefix(n, "lkprob") {
			t.Errorf("probe left %s in the caller's namespace", n)
		}
	}
}

// TestXDPFeaturesVeth asks the kernel about a veth: native XDP yes, AF_XDP
// zero-copy no.
func TestXDPFeaturesVeth(t *testing.T) {
	testutil.RequireRoot(t)
	n := netnstest.New(t, "fxdp")
	err := n.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lkxf0"}, PeerName: "lkxf1"}); err != nil {
			return err
		}
		x, err := XDPFeatures("lkxf0")
		if err != nil {
			return err
		}
		if !x.Native || x.ZeroCopy {
			t.Errorf("veth xdp features = %+v, want native without zero-copy", x)
		}
		zc := probeZeroCopy("lkxf0")
		if zc.Supported || zc.Unknown || !strings.Contains(zc.Detail, "copy mode only") {
			t.Errorf("zero-copy on veth = %+v", zc)
		}
		if _, err := XDPFeatures("lk-no-such-dev"); err == nil {
			t.Error("missing device: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
