package netdev

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

func TestNetkitConstantsMatchUAPI(t *testing.T) {
	// x/sys/unix is generated from the kernel headers.
	for _, c := range []struct {
		name      string
		ours, hdr int
	}{
		{"IFLA_NETKIT_PEER_INFO", iflaNetkitPeerInfo, unix.IFLA_NETKIT_PEER_INFO},
		{"IFLA_NETKIT_PRIMARY", iflaNetkitPrimary, unix.IFLA_NETKIT_PRIMARY},
		{"IFLA_NETKIT_POLICY", iflaNetkitPolicy, unix.IFLA_NETKIT_POLICY},
		{"IFLA_NETKIT_PEER_POLICY", iflaNetkitPeerPolicy, unix.IFLA_NETKIT_PEER_POLICY},
		{"IFLA_NETKIT_MODE", iflaNetkitMode, unix.IFLA_NETKIT_MODE},
		{"NETKIT_PASS", int(NetkitPass), unix.NETKIT_PASS},
		{"NETKIT_DROP", int(NetkitDrop), unix.NETKIT_DROP},
	} {
		if c.ours != c.hdr {
			t.Errorf("%s = %d, header says %d", c.name, c.ours, c.hdr)
		}
	}
	// Not in x/sys v0.49; values from include/uapi/linux/if_link.h.
	if iflaNetkitScrub != 6 || iflaNetkitPeerScrub != 7 || iflaNetkitHeadroom != 8 || iflaNetkitTailroom != 9 {
		t.Error("scrub/headroom/tailroom attribute numbers differ from if_link.h")
	}
	if NetkitL2 != 0 || NetkitL3 != 1 {
		t.Error("netkit modes differ from if_link.h")
	}
}

func attrs(t *testing.T, b []byte) map[uint16][]byte {
	t.Helper()
	list, err := nl.ParseRouteAttr(b)
	if err != nil {
		t.Fatalf("parse attributes: %v", err)
	}
	m := map[uint16][]byte{}
	for _, a := range list {
		m[a.Attr.Type&^unix.NLA_F_NESTED] = a.Value
	}
	return m
}

func TestNetkitRequestBytes(t *testing.T) {
	req, err := netkitRequest(NetkitSpec{
		Name: "lkhost", PeerName: "lkpeer", MTU: 1400, PeerNetnsFd: 7,
		Mode: NetkitL3, Policy: NetkitPass, PeerPolicy: NetkitDrop,
	})
	if err != nil {
		t.Fatal(err)
	}
	b := req.Serialize()
	if got := binary.NativeEndian.Uint32(b[0:4]); int(got) != len(b) {
		t.Fatalf("nlmsg_len = %d, message is %d bytes", got, len(b))
	}
	if typ := binary.NativeEndian.Uint16(b[4:6]); typ != unix.RTM_NEWLINK {
		t.Fatalf("type = %d, want RTM_NEWLINK", typ)
	}
	flags := binary.NativeEndian.Uint16(b[6:8])
	want := uint16(unix.NLM_F_REQUEST | unix.NLM_F_CREATE | unix.NLM_F_EXCL | unix.NLM_F_ACK)
	if flags != want {
		t.Fatalf("flags = %#x, want %#x", flags, want)
	}
	top := attrs(t, b[unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg:])
	if string(top[unix.IFLA_IFNAME]) != "lkhost\x00" {
		t.Errorf("IFLA_IFNAME = %q", top[unix.IFLA_IFNAME])
	}
	if got := binary.NativeEndian.Uint32(top[unix.IFLA_MTU]); got != 1400 {
		t.Errorf("IFLA_MTU = %d", got)
	}
	info := attrs(t, top[unix.IFLA_LINKINFO])
	if string(info[unix.IFLA_INFO_KIND]) != "netkit" {
		t.Errorf("IFLA_INFO_KIND = %q", info[unix.IFLA_INFO_KIND])
	}
	data := attrs(t, info[unix.IFLA_INFO_DATA])
	u32 := func(typ uint16) []byte {
		v, ok := data[typ]
		if !ok {
			t.Fatalf("attribute %d missing from IFLA_INFO_DATA", typ)
		}
		return v
	}
	// The exact payload bytes (little-endian u32) the kernel reads.
	for typ, wantBytes := range map[uint16][]byte{
		3: {0, 0, 0, 0}, // IFLA_NETKIT_POLICY = NETKIT_PASS
		4: {2, 0, 0, 0}, // IFLA_NETKIT_PEER_POLICY = NETKIT_DROP
		5: {1, 0, 0, 0}, // IFLA_NETKIT_MODE = NETKIT_L3
	} {
		if got := u32(typ); string(got) != string(wantBytes) {
			t.Errorf("attribute %d = % x, want % x", typ, got, wantBytes)
		}
	}
	for _, typ := range []uint16{iflaNetkitPrimary, iflaNetkitScrub, iflaNetkitPeerScrub} {
		if _, ok := data[typ]; ok {
			t.Errorf("attribute %d must not be sent (kernel default applies)", typ)
		}
	}
	peer := u32(1)
	if len(peer) < unix.SizeofIfInfomsg {
		t.Fatalf("peer info is %d bytes, shorter than ifinfomsg", len(peer))
	}
	pa := attrs(t, peer[unix.SizeofIfInfomsg:])
	if string(pa[unix.IFLA_IFNAME]) != "lkpeer\x00" {
		t.Errorf("peer IFLA_IFNAME = %q", pa[unix.IFLA_IFNAME])
	}
	if got := binary.NativeEndian.Uint32(pa[unix.IFLA_NET_NS_FD]); got != 7 {
		t.Errorf("peer IFLA_NET_NS_FD = %d", got)
	}
	if got := binary.NativeEndian.Uint32(pa[unix.IFLA_MTU]); got != 1400 {
		t.Errorf("peer IFLA_MTU = %d", got)
	}

	if _, err := netkitRequest(NetkitSpec{Name: "a"}); err == nil {
		t.Error("request without a peer name accepted")
	}
	if _, err := netkitRequest(NetkitSpec{Name: "a234567890123456", PeerName: "b"}); err == nil {
		t.Error("16-character name accepted")
	}
}

func TestUnsupportedKindDetection(t *testing.T) {
	if !isUnsupportedKind(syscall.EOPNOTSUPP) {
		t.Error("EOPNOTSUPP not detected")
	}
	if !isUnsupportedKind(errors.New("Unknown device type")) {
		t.Error("extack text not detected")
	}
	if isUnsupportedKind(syscall.EEXIST) {
		t.Error("EEXIST taken for unsupported")
	}
}

func TestCreateNetkitPair(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := netnstest.New(t, "nkhost")
	podNS := netnstest.New(t, "nkpod")
	h, err := NewHost(hostNS.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if ok, why := h.ProbeNetkit(); !ok {
		t.Skipf("skipping: %s", why)
	}
	err = h.Do(func() error {
		if err := CreateNetkit(NetkitSpec{Name: "lknk0", PeerName: "lknk0p", MTU: 1400,
			PeerNetnsFd: int(podNS.Fd()), Mode: NetkitL3, Policy: NetkitPass, PeerPolicy: NetkitDrop}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("lknk0")
		if err != nil {
			return err
		}
		nk, ok := l.(*netlink.Netkit)
		if !ok {
			t.Fatalf("link is %T, want netkit", l)
		}
		if !nk.IsPrimary() || nk.Mode != netlink.NETKIT_MODE_L3 || nk.Policy != netlink.NETKIT_POLICY_FORWARD ||
			nk.PeerPolicy != netlink.NETKIT_POLICY_BLACKHOLE || nk.MTU != 1400 {
			t.Errorf("netkit as created: primary=%v mode=%v policy=%v peer=%v mtu=%d",
				nk.IsPrimary(), nk.Mode, nk.Policy, nk.PeerPolicy, nk.MTU)
		}
		if nk.SupportsScrub() && (nk.Scrub != netlink.NETKIT_SCRUB_DEFAULT || nk.PeerScrub != netlink.NETKIT_SCRUB_DEFAULT) {
			t.Errorf("scrub = %v/%v, want kernel default", nk.Scrub, nk.PeerScrub)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The peer landed in the pod namespace.
	err = podNS.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName("lknk0p")
		return err
	})
	if err != nil {
		t.Errorf("peer not in pod namespace: %v", err)
	}
}

func TestProbeNetkitReason(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS := netnstest.New(t, "nkprobe")
	h, err := NewHost(hostNS.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ok, why := h.ProbeNetkit()
	if why == "" {
		t.Fatal("probe gave no reason")
	}
	if !ok && !strings.Contains(why, "netkit") {
		t.Errorf("reason %q does not mention netkit", why)
	}
	// The probe leaves nothing behind.
	h.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "lkprob") {
				t.Errorf("probe left %s behind", l.Attrs().Name)
			}
		}
		return nil
	})
}

// netkitData returns the IFLA_INFO_DATA attributes of a netkit request and
// the attributes of its peer.
func netkitData(t *testing.T, spec NetkitSpec) (data, peer map[uint16][]byte) {
	t.Helper()
	req, err := netkitRequest(spec)
	if err != nil {
		t.Fatal(err)
	}
	b := req.Serialize()
	top := attrs(t, b[unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg:])
	data = attrs(t, attrs(t, top[unix.IFLA_LINKINFO])[unix.IFLA_INFO_DATA])
	return data, attrs(t, data[iflaNetkitPeerInfo][unix.SizeofIfInfomsg:])
}

// A pod's netkit pair is L3 (no MACs) for --device-mode netkit and L2 with
// the MAC asked for on the pod side for netkit-l2, as the kernel reads it
// (IFLA_NETKIT_MODE, the peer's IFLA_ADDRESS); a MAC on an L3 pair is
// refused before anything is sent.
func TestNetkitPodModes(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 7}
	spec := PodSpec{HostIfName: "lkh", MTU: 1500, MAC: mac}
	spec.Mode = datapath.ModeNetkit
	data, peer := netkitData(t, netkitPodSpec(spec, "lkp", 5))
	if got := data[iflaNetkitMode]; string(got) != string([]byte{1, 0, 0, 0}) {
		t.Errorf("netkit: IFLA_NETKIT_MODE % x, want NETKIT_L3", got)
	}
	if _, ok := peer[unix.IFLA_ADDRESS]; ok {
		t.Error("netkit (L3): the peer was given a MAC")
	}
	spec.Mode = datapath.ModeNetkitL2
	data, peer = netkitData(t, netkitPodSpec(spec, "lkp", 5))
	if got := data[iflaNetkitMode]; string(got) != string([]byte{0, 0, 0, 0}) {
		t.Errorf("netkit-l2: IFLA_NETKIT_MODE % x, want NETKIT_L2", got)
	}
	if got := net.HardwareAddr(peer[unix.IFLA_ADDRESS]); got.String() != mac.String() {
		t.Errorf("netkit-l2: peer IFLA_ADDRESS %v, want %v", got, mac)
	}
	if _, err := netkitRequest(NetkitSpec{Name: "a", PeerName: "b", Mode: NetkitL3, PeerMAC: mac}); err == nil {
		t.Error("a MAC on an L3 pair accepted")
	}
	if !datapath.ModeNetkitL2.Netkit() || !datapath.ModeNetkit.Netkit() || datapath.ModeVeth.Netkit() {
		t.Error("DeviceMode.Netkit")
	}
}
