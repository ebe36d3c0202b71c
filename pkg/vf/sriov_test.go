package vf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// fakeNetdev writes a netdev's sysfs files under root.
func fakeNetdev(t *testing.T, root, name string, ifindex int, files map[string]string) {
	t.Helper()
	dir := filepath.Join(root, "class/net", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files["ifindex"] = strconv.Itoa(ifindex)
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sent is one recorded netlink request, decoded.
type sent struct {
	typ     uint16
	ifindex int32
	change  uint32
	attrs   map[uint16][]byte
}

func decode(t *testing.T, req *nl.NetlinkRequest) sent {
	t.Helper()
	b := req.Serialize()
	body := b[unix.SizeofNlMsghdr:]
	ifi := nl.DeserializeIfInfomsg(body)
	attrs, err := nl.ParseRouteAttr(body[unix.SizeofIfInfomsg:])
	if err != nil {
		t.Fatalf("parse attrs: %v", err)
	}
	s := sent{typ: uint16(b[4]) | uint16(b[5])<<8, ifindex: ifi.Index, change: ifi.Change, attrs: map[uint16][]byte{}}
	for _, a := range attrs {
		s.attrs[a.Attr.Type] = a.Value
	}
	return s
}

func vfMACOf(t *testing.T, s sent) (uint32, []byte) {
	t.Helper()
	list, ok := s.attrs[unix.IFLA_VFINFO_LIST]
	if !ok {
		t.Fatalf("no IFLA_VFINFO_LIST in %+v", s)
	}
	infos, err := nl.ParseRouteAttr(list)
	if err != nil || len(infos) != 1 || infos[0].Attr.Type != nl.IFLA_VF_INFO {
		t.Fatalf("want one IFLA_VF_INFO, got %v (%v)", infos, err)
	}
	vfa, err := nl.ParseRouteAttr(infos[0].Value)
	if err != nil || len(vfa) != 1 || vfa[0].Attr.Type != nl.IFLA_VF_MAC {
		t.Fatalf("want IFLA_VF_MAC, got %v (%v)", vfa, err)
	}
	m := nl.DeserializeVfMac(vfa[0].Value)
	return m.Vf, m.Mac[:6]
}

// A PF in switchdev mode with three VFs, VF 0 already claimed: Create
// claims VF 1 with exactly the requests `ip link set` would send.
func TestSRIOVCreateSendsRequests(t *testing.T) {
	root := t.TempDir()
	fakeNetdev(t, root, "p0", 4, map[string]string{"phys_switch_id": "abcd", "phys_port_name": "p0"})
	fakeNetdev(t, root, "lk0000000000a", 10, map[string]string{"phys_switch_id": "abcd", "phys_port_name": "pf0vf0"})
	fakeNetdev(t, root, "pf0vf1", 11, map[string]string{"phys_switch_id": "abcd", "phys_port_name": "pf0vf1"})
	fakeNetdev(t, root, "pf0vf2", 12, map[string]string{"phys_switch_id": "abcd", "phys_port_name": "pf0vf2"})
	fakeNetdev(t, root, "other0", 13, map[string]string{"phys_switch_id": "ffff", "phys_port_name": "pf0vf1"})
	var reqs []sent
	s := SRIOV{PF: "p0", Sysfs: root, Send: func(r *nl.NetlinkRequest) error { reqs = append(reqs, decode(t, r)); return nil }}
	got, err := s.Create("lk0123456789b", 1450)
	if err != nil {
		t.Fatal(err)
	}
	if got.Index != 1 || got.Kind != KindSRIOV || got.Representor != "lk0123456789b" {
		t.Fatalf("claimed %+v, want VF 1", got)
	}
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 4: %+v", len(reqs), reqs)
	}
	if r := reqs[0]; r.typ != unix.RTM_SETLINK || r.ifindex != 4 {
		t.Errorf("VF MAC request goes to ifindex %d type %d, want the PF (4) RTM_SETLINK", r.ifindex, r.typ)
	}
	vf, mac := vfMACOf(t, reqs[0])
	if vf != 1 || !bytes.Equal(mac, MACFor("lk0123456789b")) {
		t.Errorf("VF MAC request: vf %d mac %x, want vf 1 mac %x", vf, mac, []byte(MACFor("lk0123456789b")))
	}
	want := []struct {
		attr  uint16
		value string
	}{{unix.IFLA_IFALIAS, "pf0vf1\x00"}, {unix.IFLA_IFNAME, "lk0123456789b\x00"}}
	for i, w := range want {
		r := reqs[1+i]
		if r.ifindex != 11 || string(r.attrs[w.attr]) != w.value {
			t.Errorf("request %d: ifindex %d attr %d = %q, want ifindex 11 = %q", 1+i, r.ifindex, w.attr, r.attrs[w.attr], w.value)
		}
	}
	if mtu := reqs[3].attrs[unix.IFLA_MTU]; reqs[3].ifindex != 11 || len(mtu) != 4 || nl.NativeEndian().Uint32(mtu) != 1450 {
		t.Errorf("mtu request: %+v", reqs[3])
	}
}

func TestSRIOVExhaustedAndDelete(t *testing.T) {
	root := t.TempDir()
	fakeNetdev(t, root, "p0", 4, map[string]string{"phys_switch_id": "abcd"})
	fakeNetdev(t, root, "lk0000000000a", 10, map[string]string{"phys_switch_id": "abcd", "phys_port_name": "pf0vf0", "ifalias": "pf0vf0"})
	var reqs []sent
	s := SRIOV{PF: "p0", Sysfs: root, Send: func(r *nl.NetlinkRequest) error { reqs = append(reqs, decode(t, r)); return nil }}
	if _, err := s.Create("lk1", 1500); !errors.Is(err, ErrNoFreeVF) {
		t.Fatalf("create with every VF claimed: %v, want ErrNoFreeVF", err)
	}
	if len(reqs) != 0 {
		t.Fatalf("a refused create sent %d requests", len(reqs))
	}
	if err := s.Delete("lk0000000000a"); err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 4 {
		t.Fatalf("delete sent %d requests, want 4", len(reqs))
	}
	if r := reqs[0]; r.ifindex != 10 || r.change != unix.IFF_UP {
		t.Errorf("first request should set representor 10 down, got %+v", r)
	}
	if got := string(reqs[1].attrs[unix.IFLA_IFNAME]); got != "pf0vf0\x00" {
		t.Errorf("rename back to %q, want pf0vf0", got)
	}
	if vf, mac := vfMACOf(t, reqs[3]); vf != 0 || !bytes.Equal(mac, make([]byte, 6)) {
		t.Errorf("clear MAC of vf %d: %x", vf, mac)
	}
	if err := s.Delete("lkgone"); err != nil {
		t.Errorf("deleting an unknown representor: %v", err)
	}
}

func TestSRIOVNotSwitchdev(t *testing.T) {
	root := t.TempDir()
	fakeNetdev(t, root, "p0", 4, map[string]string{})
	if _, err := (SRIOV{PF: "p0", Sysfs: root}).Create("lk1", 1500); err == nil {
		t.Fatal("a PF without phys_switch_id was accepted")
	}
}

func TestHostVFName(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "class/net/p0/device/virtfn3/net/enp3s0f0v3")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := HostVFName(root, "p0", 3); err != nil || got != "enp3s0f0v3" {
		t.Fatalf("HostVFName = %q, %v", got, err)
	}
	if _, err := HostVFName(root, "p0", 4); err == nil {
		t.Fatal("a missing VF was found")
	}
}

func TestNames(t *testing.T) {
	if got := VethName("lk0123456789a"); got != "lkv0123456789a" || len(got) > 15 {
		t.Errorf("VethName = %q", got)
	}
	m := MACFor("lk0123456789a")
	if m[0]&1 != 0 || m[0]&2 == 0 {
		t.Errorf("MAC %s is not locally administered unicast", m)
	}
	if MACFor("lka").String() == MACFor("lkb").String() {
		t.Error("two representors share a MAC")
	}
}
