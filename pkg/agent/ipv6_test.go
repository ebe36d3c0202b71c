package agent

import (
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/vishvananda/netlink"
)

// TestDualStackEndpoint: with an IPv6 pod CIDR, an ADD gives the pod an
// address of each family (IPAM per family), configures the IPv6 one with a
// default route through the link-local gateway, routes it to the host end,
// hands it to the datapath and lists both in the API (CNI) form; DEL frees
// both.
func TestDualStackEndpoint(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), PodCIDR6: netip.MustParsePrefix("fd00:77::/64"),
		MTU: 1400, HostNetns: fx.nodeNS.Path(),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return fake, nil },
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pod := netnstest.New(t, "apod6")
	ep, err := a.Add(AddRequest{ContainerID: "c6", IfName: "eth0", Netns: pod.Path(), Network: "lk"})
	if err != nil {
		t.Fatal(err)
	}
	if ep.IP.String() != "10.77.0.1" || ep.IP6.String() != "fd00:77::1" {
		t.Fatalf("addresses %v %v, want 10.77.0.1 fd00:77::1", ep.IP, ep.IP6)
	}
	if len(fake.upserts) != 1 || fake.upserts[0].IP6 != ep.IP6 {
		t.Fatalf("datapath got %+v", fake.upserts)
	}
	pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
		found := false
		for _, ad := range addrs {
			if ones, _ := ad.Mask.Size(); ad.IP.Equal(ep.IP6.AsSlice()) && ones == 128 {
				found = true
			}
		}
		if !found {
			t.Errorf("pod eth0 lacks %s/128: %v", ep.IP6, addrs)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V6)
		found = false
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.Equal(net.ParseIP("fe80::1")) {
				found = true
			}
		}
		if !found {
			t.Errorf("pod eth0 has no default route via fe80::1: %+v", routes)
		}
		return nil
	})
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ep.HostIfName)
		if err != nil {
			t.Fatal(err)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V6)
		found := false
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == ep.IP6.String()+"/128" {
				found = true
			}
		}
		if !found {
			t.Errorf("host end %s has no route to %s/128: %+v", ep.HostIfName, ep.IP6, routes)
		}
		return nil
	})
	if _, err := a.Check("c6", "eth0", pod.Path()); err != nil {
		t.Fatalf("check: %v", err)
	}
	// CHECK sees the IPv6 side too: without the default route it fails.
	pod.Do(func(ns.NetNS) error {
		l, _ := netlink.LinkByName("eth0")
		_, dst, _ := net.ParseCIDR("::/0")
		if err := netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: net.ParseIP("fe80::1")}); err != nil {
			t.Fatalf("delete the IPv6 default route: %v", err)
		}
		return nil
	})
	if _, err := a.Check("c6", "eth0", pod.Path()); err == nil || !strings.Contains(err.Error(), "IPv6 default route") {
		t.Fatalf("check without the IPv6 default route: %v", err)
	}
	pe := EndpointToProto(ep)
	if len(pe.Ips) != 2 || pe.Ips[1].Address != "fd00:77::1/128" || pe.Ips[1].Gateway != "fe80::1" {
		t.Errorf("API addresses %v", pe.Ips)
	}
	if r := pe.Routes[len(pe.Routes)-1]; r.Dst != "::/0" || r.Gateway != "fe80::1" {
		t.Errorf("API routes %v", pe.Routes)
	}
	if _, err := a.Del("c6", "eth0"); err != nil {
		t.Fatal(err)
	}
	if al, err := a.ipam6.Allocations(); err != nil || len(al) != 0 {
		t.Fatalf("IPv6 allocations after DEL: %v %v", al, err)
	}
	if al, err := a.ipam.Allocations(); err != nil || len(al) != 0 {
		t.Fatalf("IPv4 allocations after DEL: %v %v", al, err)
	}
}

// TestDualStackVM: with an IPv6 pod CIDR a VM endpoint gets an address of
// each family like a pod: the IPv6 one on its device in the VM's netns, a
// /128 route to the host end, in the datapath's endpoint (lk_endpoints6:
// the NDP responder and routing know the VM), and in the VM's API form (the
// second IP config, which the lab's guest configures); DelVM frees both.
func TestDualStackVM(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), PodCIDR6: netip.MustParsePrefix("fd00:77::/64"),
		MTU: 1400, HostNetns: fx.nodeNS.Path(), VMSocketDir: filepath.Join(fx.stateDir, "vm"),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return fake, nil },
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	vmNS := netnstest.New(t, "avm6")
	v, err := a.AddVM(AddVMRequest{Name: "vm6", Netns: vmNS.Path(), Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	ep := v.Endpoint
	if ep.IP.String() != "10.77.0.1" || ep.IP6.String() != "fd00:77::1" {
		t.Fatalf("vm addresses %v %v, want 10.77.0.1 fd00:77::1", ep.IP, ep.IP6)
	}
	if n := len(fake.upserts); n == 0 || fake.upserts[n-1].IP6 != ep.IP6 {
		t.Fatalf("datapath got %+v, want the VM's IPv6 address", fake.upserts)
	}
	vmNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
		found := false
		for _, ad := range addrs {
			if ones, _ := ad.Mask.Size(); ad.IP.Equal(ep.IP6.AsSlice()) && ones == 128 {
				found = true
			}
		}
		if !found {
			t.Errorf("vm eth0 lacks %s/128: %v", ep.IP6, addrs)
		}
		return nil
	})
	fx.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ep.HostIfName)
		if err != nil {
			t.Fatal(err)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V6)
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == ep.IP6.String()+"/128" {
				return nil
			}
		}
		t.Errorf("host end %s has no route to %s/128: %+v", ep.HostIfName, ep.IP6, routes)
		return nil
	})
	pv := VMToProto(v)
	if ips := pv.GetEndpoint().GetIps(); len(ips) != 2 || ips[1].Address != "fd00:77::1/128" || ips[1].Gateway != "fe80::1" {
		t.Errorf("VM API addresses %v", ips)
	}
	if _, err := a.DelVM("vm6"); err != nil {
		t.Fatal(err)
	}
	if al, err := a.ipam6.Allocations(); err != nil || len(al) != 0 {
		t.Fatalf("IPv6 allocations after DelVM: %v %v", al, err)
	}
}

// TestIPv6OnlyEndpoint: a node with only an IPv6 pod CIDR (an IPv6-only
// node) gives a pod only an IPv6 address: none of IPv4 on its device or in
// the datapath's endpoint, the IPv6 /128 with its default route, CHECK
// passes, the API (CNI) form lists the IPv6 address, gateway and route
// alone; DEL frees it.
func TestIPv6OnlyEndpoint(t *testing.T) {
	fx := newFixture(t)
	fake := newFake()
	a, err := New(Config{
		StateDir: fx.stateDir, Socket: filepath.Join(fx.stateDir, "agent.sock"),
		PodCIDR6: netip.MustParsePrefix("fd00:78::/64"), MTU: 1400, HostNetns: fx.nodeNS.Path(),
		OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) { return fake, nil },
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pod := netnstest.New(t, "apod6only")
	ep, err := a.Add(AddRequest{ContainerID: "c6o", IfName: "eth0", Netns: pod.Path(), Network: "lk"})
	if err != nil {
		t.Fatal(err)
	}
	if ep.IP.IsValid() || ep.IP6.String() != "fd00:78::1" {
		t.Fatalf("addresses %v %v, want none and fd00:78::1", ep.IP, ep.IP6)
	}
	if len(fake.upserts) != 1 || fake.upserts[0].IP.IsValid() || fake.upserts[0].IP6 != ep.IP6 {
		t.Fatalf("datapath got %+v", fake.upserts)
	}
	pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(addrs) != 0 {
			t.Errorf("pod eth0 has IPv4 addresses on an IPv6-only node: %v", addrs)
		}
		if routes, _ := netlink.RouteList(l, netlink.FAMILY_V4); len(routes) != 0 {
			t.Errorf("pod eth0 has IPv4 routes on an IPv6-only node: %v", routes)
		}
		return nil
	})
	if _, err := a.Check("c6o", "eth0", pod.Path()); err != nil {
		t.Fatalf("check: %v", err)
	}
	pe := EndpointToProto(ep)
	if len(pe.Ips) != 1 || pe.Ips[0].Address != "fd00:78::1/128" || pe.Ips[0].Gateway != "fe80::1" {
		t.Errorf("API addresses %v", pe.Ips)
	}
	if len(pe.Routes) != 1 || pe.Routes[0].Dst != "::/0" {
		t.Errorf("API routes %v", pe.Routes)
	}
	st, err := a.Status()
	if err != nil || st.PodCIDR.String() != "fd00:78::/64" {
		t.Errorf("status pod CIDR %v (%v), want the IPv6 one", st.PodCIDR, err)
	}
	if _, err := a.Del("c6o", "eth0"); err != nil {
		t.Fatal(err)
	}
	if al, err := a.ipam6.Allocations(); err != nil || len(al) != 0 {
		t.Fatalf("IPv6 allocations after DEL: %v %v", al, err)
	}
}

// TestIPv6OnlyRemotePodsInPolicy: a remote pod of an IPv6-only node (its Pod
// object has only an IPv6 address) gets an identity by that address, so a
// podSelector admits it; a pod object in this node's IPv6 pod CIDR without
// an endpoint (stale) does not.
func TestIPv6OnlyRemotePodsInPolicy(t *testing.T) {
	a := newCtlAgent(t, t.TempDir(), agenttest.NewMemoryDatapath())
	a.cfg.PodCIDR6 = netip.MustParsePrefix("fd00:78:1::/64")
	objs := map[string]k8sobj.Object{}
	for _, o := range decodeObjs(t, `apiVersion: v1
kind: Pod
metadata: {name: remote6, namespace: shop, labels: {app: web}}
status: {phase: Running, podIP: "fd00:78:2::5", podIPs: [{ip: "fd00:78:2::5"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: stale6, namespace: shop}
status: {phase: Running, podIP: "fd00:78:1::9", podIPs: [{ip: "fd00:78:1::9"}]}
`) {
		objs[o.Pod.Name] = o
	}
	in, _, err := a.policyInput(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Endpoints) != 1 || in.Endpoints[0].Name != "remote6" || in.Endpoints[0].IP.IsValid() ||
		in.Endpoints[0].IP6 != netip.MustParseAddr("fd00:78:2::5") {
		t.Fatalf("policy endpoints %+v, want remote6 by its IPv6 address alone", in.Endpoints)
	}
}
