package lab

// The proxies' own account of the service rows' timed programming step:
// each network's proxy on the client's node serves histograms that time its
// work (kube-proxy's network programming latency and rules sync, Cilium's
// load-balancer map writes, lanekit's agent's network programming latency
// under kube-proxy's name). APIProgrammer reads them right before
// the timed API write and again after the first answer, and reports the
// observations in between beside its own measurement.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lanekit/lanekit/pkg/bench"
	"github.com/lanekit/lanekit/pkg/metrics"
)

// Where the proxies serve their metrics in a real-node lab's node netns:
// lanekit's agent on its loopback metrics port (deploy/configmap.yaml),
// kube-proxy on metricsBindAddress (manifests/kube-proxy.yaml), Cilium's
// agent on the chart's prometheus.port (ciliumValues enables it).
const (
	lanekitMetricsURL   = "http://127.0.0.1:" + agentMetricsPort + "/metrics"
	kubeProxyMetricsURL = "http://127.0.0.1:10249/metrics"
	ciliumMetricsPort   = 9962
)

// The histograms each network reports its programming in. Cilium 1.19
// defines cilium_service_implementation_delay but nothing observes it since
// its load balancer moved to StateDB tables (no caller in its source): what
// it times of a Service is its BPF map reconciler's per-object write, a
// histogram off by default (ciliumValues turns it on).
const (
	kubeProxySyncRules     = "kubeproxy_sync_proxy_rules_duration_seconds"
	ciliumReconcilerDur    = "cilium_reconciler_duration_seconds"
	ciliumLBReconcilerName = "loadbalancer-reconciler"
)

// proxyScrape is where one network's proxy serves its programming
// histograms, on the client's node.
type proxyScrape struct {
	NodeNS string
	URL    string
	Series []proxySeries
}

// proxySeries is one histogram and what its proxy measures with it; Match,
// when set, keeps only the series whose labels contain it.
type proxySeries struct{ Name, What, Match string }

// histTotal is one histogram series' observation count and sum (seconds).
type histTotal struct {
	count uint64
	sum   float64
}

// proxyScrapeFor is the network's own programming histograms on node 1
// (nil: none known).
func proxyScrapeFor(cni string) *proxyScrape {
	node := NodeNS(1)
	switch cni {
	case CNILanekit:
		return &proxyScrape{NodeNS: node, URL: lanekitMetricsURL, Series: []proxySeries{
			{Name: metrics.NameNetworkProgramming, What: "lanekit's agent, kube-proxy's SLI: the EndpointSlice's last-change-trigger-time to the agent's service maps holding it"}}}
	case CNIKubeProxyIptables, CNIKubeProxyNftables:
		return &proxyScrape{NodeNS: node, URL: kubeProxyMetricsURL, Series: []proxySeries{
			{Name: metrics.NameNetworkProgramming, What: "kube-proxy: the EndpointSlice's last-change-trigger-time to the end of the rules sync that holds it"},
			{Name: kubeProxySyncRules, What: "kube-proxy: one rules sync (its minSyncPeriod of 1 s between syncs not included)"}}}
	case CNICilium:
		return &proxyScrape{NodeNS: node, URL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ciliumMetricsPort), Series: []proxySeries{
			{Name: ciliumReconcilerDur, What: "Cilium: its load-balancer BPF map reconciler writing one changed frontend (the maps only; Cilium 1.19 observes no end-to-end service metric)",
				Match: ciliumLBReconcilerName}}}
	}
	return nil
}

// read is every series of the scrape's histograms: name → labels → totals.
func (p *proxyScrape) read(ctx context.Context) (map[string]map[string]histTotal, error) {
	c := netnsHTTPClient(netnsPath(p.NodeNS), 10*time.Second)
	fams, err := scrapeFamilies(ctx, c, p.URL)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]histTotal{}
	for _, s := range p.Series {
		out[s.Name] = histSeries(fams[s.Name], s.Match)
	}
	return out, nil
}

// histSeries are a histogram family's series by their labels (those whose
// labels contain match).
func histSeries(f *dto.MetricFamily, match string) map[string]histTotal {
	out := map[string]histTotal{}
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		l := labelText(m.GetLabel())
		if !strings.Contains(l, match) {
			continue
		}
		t := out[l]
		t.count += h.GetSampleCount()
		t.sum += h.GetSampleSum()
		out[l] = t
	}
	return out
}

// labelText is a series' labels as the text format writes them, sorted
// by name.
func labelText(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// delta is the observations between two reads, one ProxyMetric per
// series that has any, and the histograms that have none.
func (p *proxyScrape) delta(before, after map[string]map[string]histTotal) ([]bench.ProxyMetric, []string) {
	var out []bench.ProxyMetric
	var none []string
	for _, s := range p.Series {
		labels := make([]string, 0, len(after[s.Name]))
		for l := range after[s.Name] {
			labels = append(labels, l)
		}
		slices.Sort(labels)
		seen := false
		for _, l := range labels {
			a, b := after[s.Name][l], before[s.Name][l]
			if a.count <= b.count {
				continue
			}
			n := a.count - b.count
			out = append(out, bench.ProxyMetric{Name: s.Name, Labels: l, What: s.What, Count: n,
				Ms: (a.sum - b.sum) / float64(n) * 1000, Node: p.NodeNS})
			seen = true
		}
		if !seen {
			none = append(none, s.Name)
		}
	}
	return out, none
}

// since reads the histograms until each has an observation after before
// (a proxy records its sync after the rules it wrote already answer) or
// wait has passed, and returns the observations and a note naming what
// could not be read.
func (p *proxyScrape) since(ctx context.Context, before map[string]map[string]histTotal, wait time.Duration) ([]bench.ProxyMetric, string) {
	deadline := time.Now().Add(wait)
	for {
		after, err := p.read(ctx)
		if err != nil {
			return nil, fmt.Sprintf("not read after the write: %v", err)
		}
		got, none := p.delta(before, after)
		if len(none) == 0 {
			return got, ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return got, fmt.Sprintf("no observation of %s within %s of the first answer", strings.Join(none, ", "), wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
