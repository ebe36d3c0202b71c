package lab

import (
	"context"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lanekit/lanekit/pkg/bench"
)

func parsePage(t *testing.T, page string) map[string]map[string]histTotal {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	p := proxyScrapeFor(CNIKubeProxyNftables)
	out := map[string]map[string]histTotal{}
	for _, s := range p.Series {
		out[s.Name] = histSeries(fams[s.Name], s.Match)
	}
	return out
}

const syncPage = `# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="+Inf"} %d
kubeproxy_sync_proxy_rules_duration_seconds_sum %s
kubeproxy_sync_proxy_rules_duration_seconds_count %d
`

// The observations between two scrapes are each series' count and sum
// differences: the mean is exact (sum / count), a series without new
// observations is left out, and a histogram with none at all is named.
func TestProxyDelta(t *testing.T) {
	p := proxyScrapeFor(CNIKubeProxyNftables)
	before := parsePage(t, histPage+strings.NewReplacer("%d", "3", "%s", "0.3").Replace(syncPage))
	// One new IPv4 observation of 0.75 s; IPv6 unchanged; two syncs of 0.1
	// and 0.3 s.
	after := parsePage(t, strings.NewReplacer(`le="+Inf"} 8`, `le="+Inf"} 9`, `{ip_family="IPv4"} 1`+"\n", `{ip_family="IPv4"} 1.75`+"\n",
		`_count{ip_family="IPv4"} 8`, `_count{ip_family="IPv4"} 9`).Replace(histPage)+
		strings.NewReplacer("%d", "5", "%s", "0.7").Replace(syncPage))
	got, none := p.delta(before, after)
	if len(none) != 0 {
		t.Fatalf("none %v; want every histogram observed", none)
	}
	if len(got) != 2 {
		t.Fatalf("got %+v; want the IPv4 series and the sync histogram (IPv6 had no new observation)", got)
	}
	nw, sync := got[0], got[1]
	if nw.Name != "kubeproxy_network_programming_duration_seconds" || nw.Labels != `{ip_family="IPv4"}` || nw.Count != 1 || math.Abs(nw.Ms-750) > 1e-6 {
		t.Errorf("network programming %+v; want IPv4, 1 observation of 750 ms", nw)
	}
	if sync.Name != kubeProxySyncRules || sync.Labels != "" || sync.Count != 2 || math.Abs(sync.Ms-200) > 1e-6 {
		t.Errorf("sync %+v; want 2 observations, mean 200 ms", sync)
	}
	if !strings.Contains(nw.String(), "750.0 ms (1 observation)") || !strings.Contains(sync.String(), "(2 observations)") {
		t.Errorf("text %q / %q", nw, sync)
	}
	// Nothing new: both histograms are named as unobserved.
	got, none = p.delta(after, after)
	if len(got) != 0 || len(none) != 2 {
		t.Errorf("no change: got %+v, none %v; want nothing and both named", got, none)
	}
}

// Every network the rival bench runs names where its proxy's histograms
// are; lanekit's is kube-proxy's SLI under kube-proxy's name.
func TestProxyScrapeFor(t *testing.T) {
	for _, cni := range CNIs {
		p := proxyScrapeFor(cni)
		if p == nil || len(p.Series) == 0 || p.NodeNS != NodeNS(1) {
			t.Errorf("%s: %+v; want histograms on node 1", cni, p)
		}
	}
	if p := proxyScrapeFor(CNILanekit); p.Series[0].Name != "kubeproxy_network_programming_duration_seconds" {
		t.Errorf("lanekit reads %s", p.Series[0].Name)
	}
	if proxyScrapeFor("flannel-only") != nil {
		t.Error("an unknown network has histograms")
	}
}

// The EndpointSlices the API rows write carry the change's time, as the
// endpointslice controller stamps it: kube-proxy records no network
// programming latency for a slice without it.
func TestAPIProgrammerStampsTriggerTime(t *testing.T) {
	set, err := bench.NewSvcSet(3, []bench.SvcPort{{Name: "cps", Port: 5201, TargetPort: 5201}},
		[]netip.Addr{netip.MustParseAddr("10.244.1.5")}, netip.MustParsePrefix(ClusterCIDR))
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	a := &APIProgrammer{Client: c}
	ctx := context.Background()
	start := time.Now()
	if err := a.create(ctx, set, 1); err != nil {
		t.Fatal(err)
	}
	_, slice := set.Objects(1)
	got, err := c.DiscoveryV1().EndpointSlices(slice.Namespace).Get(ctx, slice.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := got.Annotations[corev1.EndpointsLastChangeTriggerTime]
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("trigger time %q: %v", v, err)
	}
	if at.Before(start.Add(-time.Millisecond)) || at.After(time.Now()) {
		t.Errorf("trigger time %s; want the write's time (%s)", at, start)
	}
}

// Cilium's reconciler histogram holds every StateDB reconciler's writes:
// only the load balancer's count.
func TestHistSeriesMatch(t *testing.T) {
	const page = `# TYPE cilium_reconciler_duration_seconds histogram
cilium_reconciler_duration_seconds_bucket{module_id="agent.controlplane.loadbalancer-reconciler",op="update",le="+Inf"} 3
cilium_reconciler_duration_seconds_sum{module_id="agent.controlplane.loadbalancer-reconciler",op="update"} 0.003
cilium_reconciler_duration_seconds_count{module_id="agent.controlplane.loadbalancer-reconciler",op="update"} 3
cilium_reconciler_duration_seconds_bucket{module_id="agent.datapath.sysctl",op="update",le="+Inf"} 9
cilium_reconciler_duration_seconds_sum{module_id="agent.datapath.sysctl",op="update"} 9
cilium_reconciler_duration_seconds_count{module_id="agent.datapath.sysctl",op="update"} 9
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	s := proxyScrapeFor(CNICilium).Series[0]
	got := histSeries(fams[s.Name], s.Match)
	if len(got) != 1 {
		t.Fatalf("series %v; want the load balancer's only", got)
	}
	for l, h := range got {
		if !strings.Contains(l, "loadbalancer-reconciler") || h.count != 3 || math.Abs(h.sum-0.003) > 1e-9 {
			t.Errorf("%s: %+v", l, h)
		}
	}
}
