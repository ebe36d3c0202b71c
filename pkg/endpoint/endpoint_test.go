package endpoint

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/datapath"
)

func TestHostIfName(t *testing.T) {
	// printf abceth0 | sha256sum = a06d7003e199c63c...
	got := HostIfName("abc", "eth0")
	if got != "lka06d7003e19" {
		t.Errorf("HostIfName = %q", got)
	}
	if len(got) > 15 {
		t.Errorf("%q longer than IFNAMSIZ-1", got)
	}
	if HostIfName("abc", "eth1") == got {
		t.Error("different ifnames map to the same device")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cid, ifname, err string
	}{
		{"c1", "eth0", ""},
		{"", "eth0", "container ID is empty"},
		{"c1", "", "interface name is empty"},
		{"c1", "averyveryverylongname", "longer than 15"},
		{"c1", "et/h0", "contains"},
		{"c1", "..", "invalid"},
	} {
		err := Validate(tc.cid, tc.ifname)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Validate(%q, %q) = %v, want %q", tc.cid, tc.ifname, err, tc.err)
		}
	}
}

func TestDatapathAndJSONRoundTrip(t *testing.T) {
	e := Endpoint{ID: 7, Kind: KindPod, ContainerID: "c", IfName: "eth0", Mode: datapath.ModeVeth,
		HostIfName: "lkx", HostIfIndex: 12, HostMAC: "02:00:00:00:00:01", MAC: "02:00:00:00:00:02",
		IP: netip.MustParseAddr("10.0.0.5"), MTU: 1500}
	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var back Endpoint
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	dp, err := back.Datapath()
	if err != nil {
		t.Fatal(err)
	}
	if dp.ID != 7 || dp.IfIndex != 12 || dp.IfName != "lkx" || dp.IP != e.IP ||
		dp.MAC.String() != e.MAC || dp.HostMAC.String() != e.HostMAC || dp.Mode != datapath.ModeVeth {
		t.Errorf("datapath endpoint = %+v", dp)
	}
	if back.Key() != "c/eth0" {
		t.Errorf("key = %q", back.Key())
	}
	e.MAC = "zz"
	if _, err := e.Datapath(); err == nil {
		t.Error("bad MAC accepted")
	}
	e.MAC, e.HostMAC = "", ""
	if dp, err := e.Datapath(); err != nil || dp.MAC != nil || dp.HostMAC != nil {
		t.Errorf("netkit L3 endpoint without MACs: %+v %v", dp, err)
	}
}

func TestValidateVMName(t *testing.T) {
	for _, tc := range []struct{ name, err string }{
		{"vm1", ""},
		{"a.b_c-D9", ""},
		{strings.Repeat("v", 63), ""},
		{"", "empty"},
		{strings.Repeat("v", 64), "longer than 63"},
		{".hidden", "starts with"},
		{"-flag", "starts with"},
		{"a/b", "contains"},
		{"a b", "contains"},
		{"vm:1", "contains"},
		{"é", "contains"},
	} {
		err := ValidateVMName(tc.name)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ValidateVMName(%q) = %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestVMEndpointDatapath(t *testing.T) {
	e := Endpoint{ID: 3, Kind: KindVM, ContainerID: VMContainerID("vm1"), IfName: VMIfName, Mode: datapath.ModeVeth,
		HostIfName: "lky", HostIfIndex: 20, HostMAC: "02:00:00:00:00:01", IfIndex: 21, MAC: "02:00:00:00:00:02",
		IP: netip.MustParseAddr("10.0.0.6"), VM: &VM{Name: "vm1", Queues: 4, XSKBase: 8}}
	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var back Endpoint
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	dp, err := back.Datapath()
	if err != nil || dp.Queues != 4 || dp.IfIndex != 20 {
		t.Errorf("datapath endpoint = %+v %v", dp, err)
	}
	vm, ok, err := back.DatapathVM()
	if err != nil || !ok || vm.ID != 3 || vm.IfIndex != 21 || vm.MAC.String() != e.MAC || vm.Queues != 4 || vm.XSKBase != 8 {
		t.Errorf("datapath vm = %+v %v %v", vm, ok, err)
	}
	if back.Key() != "vm:vm1/eth0" {
		t.Errorf("key = %q", back.Key())
	}
	pod := Endpoint{ID: 1, MAC: "02:00:00:00:00:03", HostMAC: "02:00:00:00:00:04"}
	if dp, _ := pod.Datapath(); dp.Queues != 0 {
		t.Errorf("pod endpoint has %d queues", dp.Queues)
	}
	if _, ok, _ := pod.DatapathVM(); ok {
		t.Error("pod endpoint has a vm part")
	}
}
