package lab

import (
	"strings"
	"testing"
)

func TestBenchPathsVMRows(t *testing.T) {
	st := &State{Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP: "10.77.0.1", RawNS: RawNS(1), RawIP: RawIP(1), Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.1"}, {NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"}}},
		{Index: 2, NS: "lk-node2", UnderlayIP: "10.77.0.2", RawNS: RawNS(2), RawIP: RawIP(2), Pods: []Pod{
			{NS: "lk-n2-p1", Kind: KindLanekit, IP: "10.244.2.1"}, {NS: "lk-n2-b1", Kind: KindBaseline, IP: "10.245.2.2"}}},
	}}
	paths, skipped := st.BenchPaths()
	if len(paths) != 4 || len(skipped) != 0 {
		t.Fatalf("no VMs: %d paths, skipped %v", len(paths), skipped)
	}
	st.VMs = []LabVM{{Name: "vm1", Node: 2, NS: "lk-n2-v1", IP: "10.244.2.2", SerialSocket: "/run/x/vm1-serial.sock"}}
	st.TapVMs = []LabVM{{Name: TapVMName, Node: 2, NS: "lk-node2", IP: "10.245.2.200", SerialSocket: "/run/x/vm-std-serial.sock"}}
	paths, skipped = st.BenchPaths()
	if len(paths) != 6 || len(skipped) != 0 {
		t.Fatalf("with VMs: %d paths, skipped %v", len(paths), skipped)
	}
	vm, tap := paths[4], paths[5]
	if vm.Name != "lanekit-vm" || vm.ClientNS != "lk-n1-p1" || vm.ServerIP != "10.244.2.2" || vm.Guest == nil ||
		vm.Guest.Serial != "/run/x/vm1-serial.sock" ||
		vm.Note != TCGNote {
		t.Errorf("lanekit-vm row %+v", vm)
	}
	if tap.Name != "bridge-tap-vm" || tap.ClientNS != "lk-n1-b1" || tap.ServerIP != "10.245.2.200" || tap.Guest == nil ||
		tap.Guest.Name != TapVMName || tap.Note != TCGNote {
		t.Errorf("bridge-tap-vm row %+v", tap)
	}
	if !st.HasVM() {
		t.Error("HasVM false")
	}
	st.TapVMs[0].SerialSocket = ""
	if paths, skipped = st.BenchPaths(); len(paths) != 5 || len(skipped) != 1 || !strings.Contains(skipped[0], "bridge-tap-vm") {
		t.Errorf("tap VM without console: %d paths, skipped %v", len(paths), skipped)
	}
}

func TestTapVMAddr(t *testing.T) {
	a, err := tapVMAddr("10.245.2.0/24", []Pod{{IP: "10.245.2.2"}})
	if err != nil || a != "10.245.2.200" {
		t.Fatalf("got %q %v", a, err)
	}
	if _, err := tapVMAddr("10.245.2.0/24", []Pod{{NS: "lk-n2-b9", IP: "10.245.2.200"}}); err == nil || !strings.Contains(err.Error(), "lk-n2-b9") {
		t.Errorf("taken address: %v", err)
	}
	if _, err := tapVMAddr("10.245.2.0/25", nil); err == nil {
		t.Error("/25 cannot hold .200: no error")
	}
	if _, err := tapVMAddr("bogus", nil); err == nil {
		t.Error("bad cidr: no error")
	}
}

func TestParseAddrShow(t *testing.T) {
	out := "5: lk-cni0    inet 10.245.2.1/24 brd 10.245.2.255 scope global lk-cni0\\       valid_lft forever preferred_lft forever\n"
	a, plen, err := parseAddrShow(out, "lk-cni0")
	if err != nil || a != "10.245.2.1" || plen != 24 {
		t.Fatalf("got %q/%d %v", a, plen, err)
	}
	if _, _, err := parseAddrShow("", "lk-cni0"); err == nil || !strings.Contains(err.Error(), "no IPv4 address") {
		t.Errorf("empty: %v", err)
	}
}

// TestBenchPathsIPv6Rows: a lab with IPv6 adds host-raw-ipv6 (the raw
// hosts' IPv6 addresses) and lanekit-pod-ipv6 (the pods' IPv6 addresses)
// to the IPv4 rows, and says why bridge-iptables-ipv6 is not offered; an
// IPv6-only lab's lanekit pods (no IPv4) get only the IPv6 row.
func TestBenchPathsIPv6Rows(t *testing.T) {
	st := &State{IPFamily: IPFamilyDual, Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP: "10.77.0.1", RawNS: RawNS(1), RawIP: RawIP(1), RawIP6: RawIP6(1), Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.1", IP6: "fd00:10:244:1::1"}, {NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"}}},
		{Index: 2, NS: "lk-node2", UnderlayIP: "10.77.0.2", RawNS: RawNS(2), RawIP: RawIP(2), RawIP6: RawIP6(2), Pods: []Pod{
			{NS: "lk-n2-p1", Kind: KindLanekit, IP: "10.244.2.1", IP6: "fd00:10:244:2::1"}, {NS: "lk-n2-b1", Kind: KindBaseline, IP: "10.245.2.2"}}},
	}}
	paths, skipped := st.BenchPaths()
	if len(paths) != 6 || len(skipped) != 1 || !strings.Contains(skipped[0], "bridge-iptables-ipv6") {
		t.Fatalf("dual: %d paths, skipped %v", len(paths), skipped)
	}
	raw6, pod6 := paths[4], paths[5]
	if raw6.Name != "host-raw-ipv6" || raw6.ClientNS != RawNS(1) || raw6.ServerIP != "fd00:77::f2" {
		t.Errorf("host-raw-ipv6 row %+v", raw6)
	}
	if pod6.Name != "lanekit-pod-ipv6" || pod6.ClientNS != "lk-n1-p1" || pod6.ServerIP != "fd00:10:244:2::1" || !pod6.Includes.BPF {
		t.Errorf("lanekit-pod-ipv6 row %+v", pod6)
	}
	st.IPFamily = IPFamilyIPv6
	for k := range st.Nodes {
		st.Nodes[k].Pods[0].IP = ""
	}
	paths, _ = st.BenchPaths()
	var names []string
	for _, p := range paths {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "host-raw,host,bridge-iptables,host-raw-ipv6,lanekit-pod-ipv6" {
		t.Errorf("IPv6-only rows %v", names)
	}
	st.IPFamily = ""
	if paths, _ = st.BenchPaths(); len(paths) != 3 {
		t.Errorf("IPv4 lab: %d paths (IPv6 rows without IPv6?)", len(paths))
	}
}
