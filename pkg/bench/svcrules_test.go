package bench

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

func twoServices(t *testing.T) *SvcSet {
	t.Helper()
	s, err := NewSvcSet(2, []SvcPort{{Name: "cps", Port: 12865, TargetPort: 12865}},
		[]netip.Addr{netip.MustParseAddr("10.245.2.2"), netip.MustParseAddr("10.245.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -run %s -update rewrites it):\n%s", name, t.Name(), got)
	}
}

// The exact text kube-proxy's layout gives two services (golden files), and
// the properties that make it kube-proxy's, checked independently of them.
func TestSvcRulesTwoServices(t *testing.T) {
	s := twoServices(t)
	if s.Used != 1 || s.Services[1].Name != "svc-client" || len(s.Services[0].Endpoints) != SvcEndpointsPerService {
		t.Fatalf("set shape: used %d, services %+v", s.Used, s.Services)
	}
	ch := s.DefaultChange()
	if ch != (SvcChange{Service: 0, Endpoint: 0}) {
		t.Fatalf("default change %+v: want the first endpoint of the service the client does not use", ch)
	}
	without, err := s.Without(ch)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Services[0].Endpoints) != 4 || len(without.Services[0].Endpoints) != 3 {
		t.Fatalf("Without changed the original or removed nothing: %d -> %d", len(s.Services[0].Endpoints), len(without.Services[0].Endpoints))
	}

	full := s.IptablesFull()
	golden(t, "svc2-iptables-full.txt", full)
	for _, want := range []string{
		`-A KUBE-SERVICES -m comment --comment "bench/svc-00000:http cluster IP" -m tcp -p tcp -d 10.96.128.2/32 --dport 80 -j KUBE-SVC-`,
		`-m statistic --mode random --probability 0.2500000000 -j KUBE-SEP-`,
		`-m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-`,
		`-m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-`,
		`-m tcp -p tcp -j DNAT --to-destination 10.245.2.3:12865`,
		`--dport 12865 ! -s 10.244.0.0/14 -j KUBE-MARK-MASQ`,
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		"-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n-A KUBE-MARK-MASQ", // nodeports rule last in KUBE-SERVICES
	} {
		if !strings.Contains(full, want) {
			t.Errorf("iptables full sync lacks %q", want)
		}
	}
	// Chain names are kube-proxy's: KUBE-SVC-/KUBE-SEP- + 16 base32 characters.
	if n := len(regexp.MustCompile(`(?m)^:KUBE-(SVC|SEP)-[A-Z2-7]{16} - \[0:0\]$`).FindAllString(full, -1)); n != 2+4+2 {
		t.Errorf("%d service/endpoint chains declared, want 8", n)
	}
	if n := strings.Count(full, "-j DNAT"); n != 6 {
		t.Errorf("%d DNAT rules, want 6 (4 + 2 endpoints)", n)
	}

	partial := without.IptablesPartial(s, 0)
	golden(t, "svc2-iptables-partial.txt", partial)
	removed := iptSepChain(&s.Services[0], s.Services[0].Ports[0], s.Services[0].Endpoints[0])
	if !strings.Contains(partial, ":"+removed+" - [0:0]\n") || !strings.Contains(partial, "-X "+removed+"\n") {
		t.Errorf("partial sync does not flush and delete the removed endpoint's chain %s", removed)
	}
	if strings.Contains(partial, iptSvcChain(&s.Services[1], s.Services[1].Ports[0])+" -m comment") ||
		strings.Contains(partial, "-A PREROUTING") {
		t.Error("partial sync rewrites the unchanged service's chains or the jump rules")
	}
	if strings.Count(partial, "-A KUBE-SERVICES") != 3 {
		t.Error("partial sync must rewrite KUBE-SERVICES in full (2 services + nodeports)")
	}

	nfull := s.NftFull()
	golden(t, "svc2-nft-full.txt", nfull)
	for _, want := range []string{
		"add element ip kube-proxy service-ips { 10.96.128.2 . tcp . 80 : goto service-",
		"numgen random mod 4 vmap { 0 : goto endpoint-",
		"numgen random mod 2 vmap { 0 : goto endpoint-",
		"meta l4proto tcp dnat to 10.245.2.2:12865",
		"add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
		"add rule ip kube-proxy nat-prerouting jump services",
	} {
		if !strings.Contains(nfull, want) {
			t.Errorf("nft full sync lacks %q", want)
		}
	}
	if strings.Count(nfull, "add chain ip kube-proxy endpoints-check\n") != 1 {
		t.Error("a chain is created more than once in one transaction")
	}
	npartial := without.NftPartial(s, 0)
	golden(t, "svc2-nft-partial.txt", npartial)
	if strings.Contains(npartial, "add table") || strings.Contains(npartial, "svc-client") || strings.Contains(npartial, "add element") {
		t.Error("nft partial sync touches the table, the maps or the unchanged service")
	}
	if !strings.Contains(npartial, "numgen random mod 3 vmap") ||
		!strings.Contains(npartial, "flush chain ip kube-proxy "+nftEpChain(&s.Services[0], s.Services[0].Ports[0], s.Services[0].Endpoints[0])+"\n") {
		t.Error("nft partial sync does not rebalance over 3 endpoints and flush the removed endpoint's chain")
	}
}

func TestSvcSetLarge(t *testing.T) {
	s, err := NewSvcSet(10000, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.245.2.2"), netip.MustParseAddr("10.245.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Used != 5000 || s.Services[5000].Name != SvcClientName {
		t.Errorf("the client's service is %d, want the middle one", s.Used)
	}
	small, _ := NewSvcSet(1000, svcUsedPorts, s.Services[s.Used].Endpoints, s.ClusterCIDR)
	if small.Services[small.Used].IP != s.Services[s.Used].IP || small.Services[small.Used].Name != SvcClientName {
		t.Error("the client's service differs between set sizes")
	}
	// Nested: every service of the smaller set is the same in the larger.
	byName := map[string]Svc{}
	for _, svc := range s.Services {
		byName[svc.Name] = svc
	}
	for _, svc := range small.Services {
		big, ok := byName[svc.Name]
		if !ok || big.IP != svc.IP || fmt.Sprint(big.Endpoints) != fmt.Sprint(svc.Endpoints) || fmt.Sprint(big.Ports) != fmt.Sprint(svc.Ports) {
			t.Fatalf("%s differs between the 1000 and the 10000 set: %+v vs %+v", svc.Name, svc, big)
		}
	}
	if got, want := s.Endpoints(), 9999*4+2*2; got != want {
		t.Errorf("endpoints %d, want %d", got, want)
	}
	vips, eps := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, svc := range s.Services {
		if vips[svc.IP] || !netip.MustParsePrefix("10.96.128.0/17").Contains(svc.IP) {
			t.Fatalf("VIP %s repeated or outside the bench range", svc.IP)
		}
		vips[svc.IP] = true
		for _, ep := range svc.Endpoints {
			if b := ep.As4(); b[3] == 0 || b[3] == 255 {
				t.Fatalf("endpoint %s is not a host address", ep)
			}
			eps[ep] = true
		}
	}
	if len(eps) != 9999*4+2 {
		t.Errorf("%d distinct endpoint addresses", len(eps))
	}
	// Above 1,000 endpoints kube-proxy drops the per-endpoint comments.
	ipt := s.IptablesFull()
	if strings.Contains(ipt, "-m comment --comment bench/svc-00000:http -s") || !strings.Contains(ipt, "cluster IP") {
		t.Error("large cluster mode: per-endpoint comments kept or cluster IP comments dropped")
	}
	if n := strings.Count(ipt, "-A KUBE-SERVICES "); n != 10000+1+1 {
		t.Errorf("%d KUBE-SERVICES rules, want one per service port + nodeports", n)
	}
	if _, err := NewSvcSet(0, svcUsedPorts, nil, s.ClusterCIDR); err == nil {
		t.Error("0 services accepted")
	}
	if _, err := NewSvcSet(MaxSvcSetSize+1, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.245.2.2")}, s.ClusterCIDR); err == nil {
		t.Error("too many services accepted")
	}
	if _, err := s.Without(SvcChange{Service: s.Used, Endpoint: 5}); err == nil {
		t.Error("removing a missing endpoint accepted")
	}
}
