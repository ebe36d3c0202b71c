package netdev

import (
	"encoding/binary"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

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

// TestDevGetRequestBytes pins the wire format of the single-device
// NETDEV_CMD_DEV_GET request: NLM_F_REQUEST only (no dump), a 4-byte genl
// header whose reserved field is zero, and NETDEV_A_DEV_IFINDEX. The netdev
// family answers EINVAL to a non-zero reserved field. A header serializer
// that reads past its own 2 bytes (as nl.Genlmsg does) picks up the next tiny
// heap object, here the ifindex value: the loop shifts the allocator's offset
// with 1-byte objects so that the header lands right before it at least once.
func TestDevGetRequestBytes(t *testing.T) {
	var sink []*byte
	for i := 0; i < 64; i++ {
		for j := 0; j < i%16; j++ {
			sink = append(sink, new(byte))
		}
		req := devGetRequest(0x14, 1, 7)
		b := req.Serialize()
		if len(b) != 28 {
			t.Fatalf("request is %d bytes, want 28: %x", len(b), b)
		}
		hdr := func(off int) uint16 { return binary.NativeEndian.Uint16(b[off:]) }
		if l, typ, flags := binary.NativeEndian.Uint32(b), hdr(4), hdr(6); l != 28 || typ != 0x14 || flags != unix.NLM_F_REQUEST {
			t.Fatalf("nlmsghdr len %d type %#x flags %#x, want 28 0x14 NLM_F_REQUEST", l, typ, flags)
		}
		genl := b[16:20]
		if genl[0] != netdevCmdDevGet || genl[1] != 1 || genl[2] != 0 || genl[3] != 0 {
			t.Fatalf("genl header %x, want cmd %d version 1 reserved 0", genl, netdevCmdDevGet)
		}
		attr := b[20:28]
		if hdr(20) != 8 || hdr(22) != netdevADevIfindex || binary.NativeEndian.Uint32(attr[4:]) != 7 {
			t.Fatalf("ifindex attribute %x, want len 8 type %d value 7", attr, netdevADevIfindex)
		}
	}
	runtime.KeepAlive(sink)
}
