package lab

import (
	"strings"
	"testing"
)

func TestCheckIPFamily(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
		err  string
	}{
		{cfg: Config{}, want: IPFamilyIPv4},
		{cfg: Config{IPFamily: "ipv4"}, want: IPFamilyIPv4},
		{cfg: Config{IPFamily: "dual"}, want: IPFamilyDual},
		{cfg: Config{IPFamily: "ipv6"}, want: IPFamilyIPv6},
		{cfg: Config{IPFamily: "ipv6", K8s: true}, want: IPFamilyIPv6},
		{cfg: Config{IPFamily: "ipv6", K8s: true, Kubelet: true}, err: "--kubelet"},
		{cfg: Config{IPFamily: "ipv6", VM: true}, err: "--vm"},
		{cfg: Config{IPFamily: "ipv6", Routing: RoutingTunnel}, err: "--routing tunnel"},
		{cfg: Config{IPFamily: "ipv6", BaselineOnly: true}, err: "baseline"},
		{cfg: Config{IPFamily: "dual", K8s: true}, want: IPFamilyDual},
		{cfg: Config{IPFamily: "dual", K8s: true, Kubelet: true}, want: IPFamilyDual},
		{cfg: Config{IPFamily: "dual", BaselineOnly: true}, err: "baseline"},
		{cfg: Config{IPFamily: "v6"}, err: "want one of ipv4, ipv6, dual"},
	} {
		got, err := checkIPFamily(c.cfg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: err %v, want %q", c.cfg, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: %q %v, want %q", c.cfg, got, err, c.want)
		}
	}
	if UnderlayIP6(10) != "fd00:77::a" || PodCIDR6(10) != "fd00:10:244:a::/64" {
		t.Errorf("node 10: %s %s", UnderlayIP6(10), PodCIDR6(10))
	}
}

func TestSNMP6Value(t *testing.T) {
	text := "Ip6InReceives                   	12\nIp6OutForwDatagrams             	345\nIp6InDelivers 7\n"
	if v, err := snmp6Value(text, "Ip6OutForwDatagrams"); err != nil || v != 345 {
		t.Fatalf("got %d %v", v, err)
	}
	if _, err := snmp6Value(text, "Ip6Nope"); err == nil {
		t.Fatal("a missing counter was found")
	}
}

func TestIPv6CheckGroups(t *testing.T) {
	st := &State{IPFamily: IPFamilyDual, Nodes: []Node{
		{Index: 1, NS: "lk-node1", UnderlayIP6: "fd00:77::1", Pods: []Pod{
			{NS: "lk-n1-p1", Kind: KindLanekit, IP: "10.244.1.2", IP6: "fd00:10:244:1::1"},
			{NS: "lk-n1-b1", Kind: KindBaseline, IP: "10.245.1.2"},
		}},
		{Index: 2, NS: "lk-node2", UnderlayIP6: "fd00:77::2", Pods: []Pod{
			{NS: "lk-n2-p1", Kind: KindLanekit, IP: "10.244.2.2", IP6: "fd00:10:244:2::1"},
		}},
	}}
	g := ipv6CheckGroups(st)
	if len(g) != 1 || len(g[0].sources) != 2 || len(g[0].targets) != 4 || g[0].port != EchoPort6 {
		t.Fatalf("groups %+v", g)
	}
	if g[0].targets[3].IP != "fd00:77::2" {
		t.Fatalf("targets %+v", g[0].targets)
	}
	// The fast-lane VM's IPv6 address: a target of the pods, the nodes'
	// group, and the VM's own group through its console.
	st.VMs = []LabVM{{Name: "vm1", Node: 2, IP: "10.244.2.3", IP6: "fd00:10:244:2::2", SerialSocket: "/x"}}
	g = ipv6CheckGroups(st)
	if len(g) != 3 || len(g[0].targets) != 5 || g[0].targets[4].IP != "fd00:10:244:2::2" {
		t.Fatalf("groups with a VM %+v", g)
	}
	if len(g[1].sources) != 2 || len(g[1].targets) != 1 || g[2].vms[vmNS("vm1")].Name != "vm1" || len(g[2].targets) != 5 {
		t.Fatalf("VM groups %+v", g[1:])
	}
	st.IPFamily = IPFamilyIPv6
	if g := ipv6CheckGroups(st); len(g) != 3 {
		t.Fatalf("an IPv6-only lab got %d IPv6 groups", len(g))
	}
	st.IPFamily = ""
	if g := ipv6CheckGroups(st); g != nil {
		t.Fatalf("an IPv4 lab got IPv6 groups %+v", g)
	}
}
