package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/lanekit/lanekit/pkg/endpoint"
)

// A VM endpoint's DHCP options: its MTU always; with ClusterDNS the name
// servers and a ClusterFirst pod's search list for its namespace; a pod
// endpoint gets none.
func TestVMDHCPOptions(t *testing.T) {
	dns := []netip.Addr{netip.MustParseAddr("10.96.0.10")}
	vm := endpoint.Endpoint{ID: 7, MTU: 1450, MAC: "02:00:00:00:00:07", HostMAC: "02:00:00:00:01:07",
		Labels: map[string]string{ArgPodNamespace: "vms"}, VM: &endpoint.VM{Name: "vm1"}}
	a := &Agent{cfg: Config{ClusterDNS: dns, ClusterDomain: "corp.example"}}
	dp, err := a.dpEndpoint(&vm)
	if err != nil {
		t.Fatal(err)
	}
	if dp.DHCP.MTU != 1450 || !slices.Equal(dp.DHCP.DNS, dns) ||
		!slices.Equal(dp.DHCP.Search, []string{"vms.svc.corp.example", "svc.corp.example", "corp.example"}) {
		t.Errorf("VM's DHCP options %+v", dp.DHCP)
	}
	if _, err := dp.DHCP.Render(); err != nil {
		t.Errorf("render: %v", err)
	}
	// A namespace that makes no domain name (from a CNI caller) is left
	// out of the list; the rest stays.
	bad := vm
	bad.Labels = map[string]string{ArgPodNamespace: "no spaces allowed"}
	if dp, err := a.dpEndpoint(&bad); err != nil || !slices.Equal(dp.DHCP.Search, []string{"svc.corp.example", "corp.example"}) {
		t.Errorf("bad namespace: %+v %v", dp.DHCP, err)
	}
	a.cfg.ClusterDNS = nil
	if dp, _ := a.dpEndpoint(&vm); dp.DHCP.MTU != 1450 || dp.DHCP.DNS != nil || dp.DHCP.Search != nil {
		t.Errorf("no cluster DNS: %+v", dp.DHCP)
	}
	pod := vm
	pod.VM = nil
	a.cfg.ClusterDNS = dns
	if dp, _ := a.dpEndpoint(&pod); !dp.DHCP.Empty() {
		t.Errorf("a pod endpoint got DHCP options %+v", dp.DHCP)
	}
	for _, c := range []Config{
		{ClusterDNS: []netip.Addr{netip.MustParseAddr("fd00::10")}},
		{ClusterDNS: dns, ClusterDomain: "bad domain"},
		{ClusterDNS: dns, ClusterDomain: "a..b"},
	} {
		if err := checkClusterDNS(c); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	if err := checkClusterDNS(Config{ClusterDNS: dns, ClusterDomain: "cluster.local"}); err != nil {
		t.Error(err)
	}
}
