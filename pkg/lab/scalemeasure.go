package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/procstat"
	"github.com/lanekit/lanekit/pkg/service"
)

// scaleAgentStatus asks lab agent i for its status.
func scaleAgentStatus(ctx context.Context, i int) (*apiv1.StatusResponse, error) {
	c, closeFn, err := agentClient(AgentSocket(i))
	if err != nil {
		return nil, err
	}
	defer closeFn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Status(cctx, &apiv1.StatusRequest{})
}

// statusMapEntries is the entries of map name in agent i's status (-1: unknown).
func statusMapEntries(st *apiv1.StatusResponse, name string) int {
	for _, m := range st.GetControlPlane().GetMaps() {
		if m.GetName() == name {
			return int(m.GetEntries())
		}
	}
	return -1
}

// waitAgents polls every lab agent until cond holds for all of them.
func waitAgents(ctx context.Context, nodes []int, timeout time.Duration, what string, cond func(*apiv1.StatusResponse) bool) (time.Duration, error) {
	start := time.Now()
	last := ""
	for deadline := start.Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		all := true
		for _, i := range nodes {
			st, err := scaleAgentStatus(ctx, i)
			if err != nil || !cond(st) {
				last = fmt.Sprintf("node %d: ready %v (%s), %d frontends, %d policies, err %v", i, st.GetReady(), st.GetReason(),
					statusMapEntries(st, service.MapFrontends), st.GetControlPlane().GetPolicies(), err)
				all = false
				break
			}
		}
		if all {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(start), fmt.Errorf("lab scale: %s: not after %v (last: %s)", what, timeout, last)
		}
	}
}

// scaleRoutes counts node i's routes to the fake nodes' pod CIDRs.
func scaleRoutes(i int) (int, error) {
	h, err := netns.GetFromName(NodeNS(i))
	if err != nil {
		return 0, err
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return 0, err
	}
	defer nl.Close()
	routes, err := nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, err
	}
	fake := netip.MustParsePrefix("10.128.0.0/9")
	n := 0
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if p, ok := netip.AddrFromSlice(r.Dst.IP); ok && fake.Contains(p.Unmap()) {
			n++
		}
	}
	return n, nil
}

// waitRoutes waits until every agent routes to n fake nodes.
func waitRoutes(ctx context.Context, nodes []int, n int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for deadline := start.Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		all := true
		for _, i := range nodes {
			if got, err := scaleRoutes(i); err != nil || got < n {
				all = false
				break
			}
		}
		if all {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(start), fmt.Errorf("lab scale: routes to %d nodes not programmed after %v", n, timeout)
		}
	}
}

// procSample is a process's CPU time and RSS at one moment.
type procSample struct {
	at    time.Time
	cpu   time.Duration
	rssKB uint64
}

func sampleProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	var err error
	if s.cpu, err = procstat.CPU(pid); err != nil {
		return s, err
	}
	rss, err := procstat.RSS(pid)
	if err != nil {
		return s, err
	}
	s.rssKB = rss >> 10
	return s, nil
}

// cpuPercent is the CPU the process used between two samples (100: one core).
func cpuPercent(a, b procSample) float64 {
	d := b.at.Sub(a.at)
	if d <= 0 {
		return 0
	}
	return float64(b.cpu-a.cpu) / float64(d) * 100
}

// scrapeHistograms reads the named histograms from the metrics at url,
// each summed over its labels: cumulative counts by upper bound. A missing
// family is an empty histogram; an answer other than 200 is an error (what
// hid the scale lab's histograms once: a 404 from outside the lab parsed as
// an empty page).
func scrapeHistograms(ctx context.Context, c *http.Client, url string, names ...string) (map[string]map[float64]uint64, error) {
	fams, err := scrapeFamilies(ctx, c, url)
	if err != nil {
		return nil, err
	}
	out := map[string]map[float64]uint64{}
	for _, name := range names {
		h := map[float64]uint64{}
		if f := fams[name]; f != nil {
			for _, m := range f.GetMetric() {
				addBuckets(h, m.GetHistogram())
			}
		}
		out[name] = h
	}
	return out, nil
}

// scrapeFamilies reads the metrics page at url (text format); an answer
// other than 200 is an error.
func scrapeFamilies(ctx context.Context, c *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return fams, nil
}

func addBuckets(out map[float64]uint64, h *dto.Histogram) {
	for _, b := range h.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) { // the text format's le="+Inf" bucket is the sample count
			out[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	out[math.Inf(1)] += h.GetSampleCount()
}

// histQuantiles are the p50, p99 and max of the observations between two
// scrapes as bucket upper bounds (kube-proxy's buckets: 0.25 s, 0.5 s,
// then whole seconds), and their count.
func histQuantiles(before, after map[float64]uint64) (p50, p99, max float64, n uint64) {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	n = after[math.Inf(1)] - before[math.Inf(1)]
	if n == 0 {
		return 0, 0, 0, 0
	}
	q := func(p float64) float64 {
		for _, b := range bounds {
			if float64(after[b]-before[b]) >= p*float64(n) {
				return b
			}
		}
		return math.Inf(1)
	}
	return q(0.5), q(0.99), q(1), n
}

// backendBatch is how many lk_lb_backends entries one read syscall takes:
// at 100,000 Services the map holds 400,000, which one syscall per entry
// took about a second to scan (and a CPU the agents needed).
const backendBatch = 8192

// holdsBackend scans m (lk_lb_backends) for a backend at addr:port, a batch
// per syscall (entry by entry where the kernel has no batches).
func holdsBackend(m *ebpf.Map, addr [4]byte, port uint16) (bool, error) {
	match := func(v service.BackendValue) bool { return v.Addr == addr && v.Port == port }
	keys := make([]uint32, backendBatch)
	vals := make([]service.BackendValue, backendBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		if slices.ContainsFunc(vals[:n], match) {
			return true, nil
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return false, nil // the whole map read
		case errors.Is(err, ebpf.ErrNotSupported):
			var k uint32
			var v service.BackendValue
			it := m.Iterate()
			for it.Next(&k, &v) {
				if match(v) {
					return true, nil
				}
			}
			return false, it.Err()
		case err != nil:
			return false, err
		}
	}
}

// probeBackends measures, for each endpoint change it receives, how long
// after its trigger time node i's pinned lk_lb_backends holds the new
// backend: the datapath's side of the programming latency.
func probeBackends(ctx context.Context, i int, events <-chan churnEvent) ([]time.Duration, int, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(BPFDir(i), "lk_lb_backends"), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("lab scale: %w", err)
	}
	defer m.Close()
	var lats []time.Duration
	missed := 0
	for {
		var ev churnEvent
		select {
		case <-ctx.Done():
			return lats, missed, nil
		case ev = <-events:
		}
		want := ev.backend.As4()
		found := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !found; {
			if found, err = holdsBackend(m, want, 8080); err != nil {
				return lats, missed, fmt.Errorf("lab scale: read lk_lb_backends: %w", err)
			}
			if !found {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if found {
			lats = append(lats, time.Since(ev.at))
		} else {
			missed++
		}
	}
}

// durQuantiles are the p50, p99 and max of ds.
func durQuantiles(ds []time.Duration) (p50, p99, max time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)] }
	return at(0.5), at(0.99), s[len(s)-1]
}

// watchDelays watches the scale EndpointSlices as the agents do and
// records, for each update, how long after its trigger time the API server
// delivered it: the part of the programming latency that is not the
// agents'. Stop it with stop, which returns the delays.
func watchDelays(ctx context.Context, c kubernetes.Interface) (stop func() []time.Duration, err error) {
	sel := ScaleLabel + "=1"
	list, err := c.DiscoveryV1().EndpointSlices(ScaleNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("lab scale: list EndpointSlices: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := c.DiscoveryV1().EndpointSlices(ScaleNamespace).Watch(wctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("lab scale: watch EndpointSlices: %w", err)
	}
	var delays []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			if t, err := time.Parse(time.RFC3339Nano, s.Annotations[corev1.EndpointsLastChangeTriggerTime]); err == nil {
				delays = append(delays, time.Since(t))
			}
		}
	}()
	return func() []time.Duration {
		w.Stop()
		cancel()
		<-done
		return delays
	}, nil
}
