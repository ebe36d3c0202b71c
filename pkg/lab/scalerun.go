package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/service"
)

// ScaleReport is what `lanekit lab scale` measured.
type ScaleReport struct {
	Config struct {
		Nodes        int     `json:"nodes"`
		Services     int     `json:"services"`
		Endpoints    int     `json:"endpoints"`
		Pods         int     `json:"pods"`
		Identities   int     `json:"identities"`
		Policies     int     `json:"policies"`
		ChurnRate    float64 `json:"churn_rate"`
		ChurnSeconds float64 `json:"churn_seconds"`
	} `json:"config"`
	// Creation through the API server, and until both agents hold it.
	CreateNodesS    float64 `json:"create_nodes_s"`
	RoutesS         float64 `json:"routes_programmed_s"` // after the last Node was written; -1: tunnel routing (not counted)
	CreateServicesS float64 `json:"create_services_s"`
	ServicesS       float64 `json:"services_programmed_s"` // after the last EndpointSlice was written
	CreatePodsS     float64 `json:"create_pods_policies_s"`
	PoliciesS       float64 `json:"policies_programmed_s"`
	// Churn: endpoint changes programmed, from the agents' histogram
	// (bucket bounds) and from polling node 1's lk_lb_backends.
	Changes        int     `json:"churn_endpoint_changes"`
	Relabels       int     `json:"churn_pod_relabels"`
	HistCount      uint64  `json:"histogram_count"`
	HistP50S       float64 `json:"histogram_p50_le_s"`
	HistP99S       float64 `json:"histogram_p99_le_s"`
	HistMaxS       float64 `json:"histogram_max_le_s"`
	PolicyHistN    uint64  `json:"policy_histogram_count"`
	PolicyHistP99S float64 `json:"policy_histogram_p99_le_s"`
	ProbeCount     int     `json:"probe_count"`
	ProbeMissed    int     `json:"probe_missed"`
	ProbeP50Ms     float64 `json:"probe_p50_ms"`
	ProbeP99Ms     float64 `json:"probe_p99_ms"`
	ProbeMaxMs     float64 `json:"probe_max_ms"`
	// The API server's share: from each update's trigger time to its
	// delivery on the driver's own watch of the scale EndpointSlices.
	WatchCount int     `json:"watch_count"`
	WatchP50Ms float64 `json:"watch_p50_ms"`
	WatchP99Ms float64 `json:"watch_p99_ms"`
	WatchMaxMs float64 `json:"watch_max_ms"`
	// Node 1's agent.
	RestRSSMB    float64    `json:"rest_rss_mb"`
	RestCPUPct   float64    `json:"rest_cpu_pct"`
	ChurnRSSMB   float64    `json:"churn_rss_mb"`
	ChurnCPUPct  float64    `json:"churn_cpu_pct"`
	RestartS     float64    `json:"restart_programmed_s"` // agent start to ready with every frontend
	RestartRSSMB float64    `json:"restart_rss_mb"`
	RestartError string     `json:"restart_error,omitempty"`
	Maps         []ScaleMap `json:"maps"`
	// FirstPacket: new connections through a probe Service at each
	// --first-packet-at count (scaleprobe.go).
	FirstPacket []ScaleFirstPacket `json:"first_packet,omitempty"`
	// The API server's own request metrics around the churn and the restart.
	API APILoad `json:"api_server"`
}

// ScaleMap is one service map's fill after the churn.
type ScaleMap struct {
	Name     string `json:"name"`
	Entries  uint32 `json:"entries"`
	Capacity uint32 `json:"capacity"`
}

// RunScale runs the scale lab on a `lab up --k8s` lab and reports.
func RunScale(ctx context.Context, cfg ScaleConfig, keep bool) (*ScaleReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := LoadState()
	if err != nil {
		return nil, err
	}
	if !st.K8s || len(st.Nodes) < 1 {
		return nil, errors.New("lab scale: needs a lab brought up with `lanekit lab up --k8s`")
	}
	srv, _, err := K8s()
	if err != nil {
		return nil, err
	}
	// Room for the Services beside the lab's own (kubernetes, DNS, ...).
	if room, err := serviceCapacity(srv.ServiceCIDR); err != nil {
		return nil, err
	} else if cfg.Services > room-100 {
		return nil, fmt.Errorf("lab scale: --services %d: the lab's service range %s holds %d (less 100 for the lab's own); bring the lab up with a wider --service-cidr (e.g. 10.96.0.0/14)",
			cfg.Services, srv.ServiceCIDR, room)
	}
	if cfg.FillEtcd && cfg.Store == nil {
		cfg.Store = srv.Store
	}
	rc := srv.RESTConfig()
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	var nodes []int
	for _, n := range st.Nodes {
		nodes = append(nodes, n.Index)
	}
	first := nodes[0]
	if err := cleanScale(ctx, c, cfg.Workers); err != nil {
		return nil, fmt.Errorf("lab scale: clean up an earlier run: %w", err)
	}
	if !keep {
		defer func() {
			progress(out, "lab scale: deleting the scale objects")
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
			defer cancel()
			if err := cleanScale(cctx, c, cfg.Workers); err != nil {
				progress(out, "lab scale: cleanup: %v", err)
			}
		}()
	}
	r := &ScaleReport{}
	r.Config.Nodes, r.Config.Services, r.Config.Endpoints, r.Config.Pods = cfg.Nodes, cfg.Services, cfg.Endpoints, cfg.Pods
	r.Config.Identities, r.Config.Policies, r.Config.ChurnRate, r.Config.ChurnSeconds = cfg.Identities, cfg.Policies, cfg.ChurnRate, cfg.ChurnFor.Seconds()

	base, err := scaleAgentStatus(ctx, first)
	if err != nil {
		return nil, err
	}
	baseFronts := statusMapEntries(base, service.MapFrontends)
	basePols := int(base.GetControlPlane().GetPolicies())

	progress(out, "lab scale: %d Nodes", cfg.Nodes)
	t := time.Now()
	if err := createNodes(ctx, c, cfg); err != nil {
		return nil, err
	}
	r.CreateNodesS = time.Since(t).Seconds()
	r.RoutesS = -1
	if st.Routing == "" || st.Routing == "native" {
		d, err := waitRoutes(ctx, nodes, cfg.Nodes, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		r.RoutesS = d.Seconds()
	}

	progress(out, "lab scale: %d Services x %d endpoints", cfg.Services, cfg.Endpoints)
	wantFronts, err := r.fillServices(ctx, c, cfg, st, nodes, baseFronts)
	if err != nil {
		return nil, err
	}

	progress(out, "lab scale: %d pods (%d identities), %d NetworkPolicies", cfg.Pods, cfg.Identities, cfg.Policies)
	t = time.Now()
	if err := createPods(ctx, c, cfg); err != nil {
		return nil, err
	}
	r.CreatePodsS = time.Since(t).Seconds()
	d, err := waitAgents(ctx, nodes, 10*time.Minute, "policies programmed", func(s *apiv1.StatusResponse) bool {
		return int(s.GetControlPlane().GetPolicies()) >= basePols+cfg.Policies
	})
	if err != nil {
		return nil, err
	}
	r.PoliciesS = d.Seconds()

	if err := r.restAndChurn(ctx, c, cfg, nodes); err != nil {
		return nil, err
	}

	st1, err := scaleAgentStatus(ctx, first)
	if err != nil {
		return nil, err
	}
	for _, m := range st1.GetControlPlane().GetMaps() {
		r.Maps = append(r.Maps, ScaleMap{m.GetName(), m.GetEntries(), m.GetCapacity()})
	}

	progress(out, "lab scale: restarting node %d's agent", first)
	apiBefore, err := scrapeAPILoad(ctx, c)
	if err != nil {
		return nil, err
	}
	if r.RestartS, r.RestartRSSMB, err = restartAgentTimed(ctx, st, first, wantFronts); err != nil {
		r.RestartS, r.RestartError = -1, err.Error() // the rest stands
	}
	apiAfter, err := scrapeAPILoad(ctx, c)
	if err != nil {
		return nil, err
	}
	r.API.RestartLists, r.API.RestartWatchLists = apiBefore.callsTo(apiAfter, "LIST"), apiBefore.callsTo(apiAfter, "WATCHLIST")
	return r, nil
}

// restAndChurn measures node 1's agent at rest for 10 s, then churns
// endpoints and pods for cfg.ChurnFor: the agents' histograms, the polled
// backends map, the API server's watch delivery and request counts, the
// agent's RSS and CPU.
func (r *ScaleReport) restAndChurn(ctx context.Context, c kubernetes.Interface, cfg ScaleConfig, nodes []int) error {
	first, out := nodes[0], cfg.Out
	pid := readPID(AgentPIDFile(first))
	progress(out, "lab scale: at rest (10 s)")
	a, err := sampleProc(pid)
	if err != nil {
		return err
	}
	time.Sleep(10 * time.Second)
	b, err := sampleProc(pid)
	if err != nil {
		return err
	}
	r.RestRSSMB, r.RestCPUPct = float64(b.rssKB)/1024, cpuPercent(a, b)

	progress(out, "lab scale: churn %.0f changes/s for %v", cfg.ChurnRate, cfg.ChurnFor)
	histBefore, polBefore, err := scrapeAll(ctx, nodes)
	if err != nil {
		return err
	}
	apiBefore, err := scrapeAPILoad(ctx, c)
	if err != nil {
		return err
	}
	r.API.OpenWatches = int(apiBefore.openWatches)
	events := make(chan churnEvent)
	pctx, stopProbe := context.WithCancel(ctx)
	type probed struct {
		lats   []time.Duration
		missed int
		err    error
	}
	probeDone := make(chan probed, 1)
	go func() {
		l, m, err := probeBackends(pctx, first, events)
		probeDone <- probed{l, m, err}
	}()
	stopWatch, err := watchDelays(ctx, c)
	if err != nil {
		stopProbe()
		<-probeDone
		return err
	}
	a, _ = sampleProc(pid)
	r.Changes, r.Relabels, err = churn(ctx, c, cfg, events)
	b, _ = sampleProc(pid)
	r.ChurnRSSMB, r.ChurnCPUPct = float64(b.rssKB)/1024, cpuPercent(a, b)
	time.Sleep(2 * time.Second) // the last changes reach the agents
	stopProbe()
	p := <-probeDone
	delays := stopWatch()
	if err != nil {
		return fmt.Errorf("lab scale: churn: %w", err)
	}
	if p.err != nil {
		return p.err
	}
	histAfter, polAfter, err := scrapeAll(ctx, nodes)
	if err != nil {
		return err
	}
	apiAfter, err := scrapeAPILoad(ctx, c)
	if err != nil {
		return err
	}
	r.API.ChurnLists, r.API.ChurnWatches = apiBefore.callsTo(apiAfter, "LIST"), apiBefore.callsTo(apiAfter, "WATCH")
	r.API.ChurnWatchLists = apiBefore.callsTo(apiAfter, "WATCHLIST")
	r.HistP50S, r.HistP99S, r.HistMaxS, r.HistCount = histQuantiles(histBefore, histAfter)
	_, r.PolicyHistP99S, _, r.PolicyHistN = histQuantiles(polBefore, polAfter)
	r.ProbeCount, r.ProbeMissed = len(p.lats), p.missed
	p50, p99, mx := durQuantiles(p.lats)
	r.ProbeP50Ms, r.ProbeP99Ms, r.ProbeMaxMs = ms(p50), ms(p99), ms(mx)
	r.WatchCount = len(delays)
	p50, p99, mx = durQuantiles(delays)
	r.WatchP50Ms, r.WatchP99Ms, r.WatchMaxMs = ms(p50), ms(p99), ms(mx)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// scrapeAll sums both programming histograms over the agents, each read
// in its node's netns, where the agent listens.
func scrapeAll(ctx context.Context, nodes []int) (network, policy map[float64]uint64, err error) {
	netName, polName := metrics.NameNetworkProgramming, metrics.NamePolicyProgramming
	network, policy = map[float64]uint64{}, map[float64]uint64{}
	for _, i := range nodes {
		c := netnsHTTPClient(netnsPath(NodeNS(i)), 10*time.Second)
		hs, err := scrapeHistograms(ctx, c, "http://"+AgentMetricsAddr(i)+"/metrics", netName, polName)
		if err != nil {
			return nil, nil, fmt.Errorf("agent %d metrics: %w", i, err)
		}
		for b, n := range hs[netName] {
			network[b] += n
		}
		for b, n := range hs[polName] {
			policy[b] += n
		}
	}
	return network, policy, nil
}

// restartAgentTimed stops agent i and starts it again, timing the start
// until it is ready with every frontend programmed.
func restartAgentTimed(ctx context.Context, st *State, i, wantFronts int) (float64, float64, error) {
	bins, err := FindBins()
	if err != nil {
		return 0, 0, err
	}
	terminate(readPID(AgentPIDFile(i)), 10*time.Second)
	start := time.Now()
	pid, err := startAgent(ctx, bins, i, true)
	if err != nil {
		return 0, 0, err
	}
	for k := range st.Nodes {
		if st.Nodes[k].Index == i {
			st.Nodes[k].AgentPID = pid
		}
	}
	if err := st.save(); err != nil {
		return 0, 0, err
	}
	if _, err := waitAgents(ctx, []int{i}, 2*time.Minute, "restarted agent programmed", func(s *apiv1.StatusResponse) bool {
		return s.GetReady() && statusMapEntries(s, service.MapFrontends) >= wantFronts
	}); err != nil {
		return 0, 0, err
	}
	d := time.Since(start).Seconds()
	ps, err := sampleProc(pid)
	return d, float64(ps.rssKB) / 1024, err
}

// WriteJSON writes the report as one JSON document.
func (r *ScaleReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as a table.
func (r *ScaleReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	c := r.Config
	fmt.Fprintf(tw, "scale\t%d nodes, %d Services x %d endpoints, %d pods (%d identities), %d policies; churn %.0f/s for %.0f s\n",
		c.Nodes, c.Services, c.Endpoints, c.Pods, c.Identities, c.Policies, c.ChurnRate, c.ChurnSeconds)
	routes := "n/a (tunnel routing)"
	if r.RoutesS >= 0 {
		routes = fmt.Sprintf("%.2f s after the last Node was written (%.2f s to write them)", r.RoutesS, r.CreateNodesS)
	}
	fmt.Fprintf(tw, "routes to %d nodes\t%s\n", c.Nodes, routes)
	fmt.Fprintf(tw, "services programmed\t%.2f s after the last EndpointSlice was written (%.2f s to write them)\n", r.ServicesS, r.CreateServicesS)
	fmt.Fprintf(tw, "policies programmed\t%.2f s after the last object was written (%.2f s to write them)\n", r.PoliciesS, r.CreatePodsS)
	fmt.Fprintf(tw, "network programming latency (histogram)\tp50 <= %g s, p99 <= %g s, max <= %g s (%d observations, both agents)\n", r.HistP50S, r.HistP99S, r.HistMaxS, r.HistCount)
	fmt.Fprintf(tw, "network programming latency (lk_lb_backends polled)\tp50 %.1f ms, p99 %.1f ms, max %.1f ms (%d changes, %d not seen in 10 s)\n", r.ProbeP50Ms, r.ProbeP99Ms, r.ProbeMaxMs, r.ProbeCount, r.ProbeMissed)
	fmt.Fprintf(tw, "API server watch delivery (the driver's own watch)\tp50 %.1f ms, p99 %.1f ms, max %.1f ms (%d updates): the part of the latency before any agent sees a change\n", r.WatchP50Ms, r.WatchP99Ms, r.WatchMaxMs, r.WatchCount)
	fmt.Fprintf(tw, "policy programming latency (histogram)\tp99 <= %g s (%d observations)\n", r.PolicyHistP99S, r.PolicyHistN)
	fmt.Fprintf(tw, "agent at rest\tRSS %.0f MB, CPU %.1f %%\n", r.RestRSSMB, r.RestCPUPct)
	fmt.Fprintf(tw, "agent under churn\tRSS %.0f MB, CPU %.1f %%\n", r.ChurnRSSMB, r.ChurnCPUPct)
	if r.RestartError != "" {
		fmt.Fprintf(tw, "agent restart\tfailed: %s\n", r.RestartError)
	} else {
		fmt.Fprintf(tw, "agent restart\t%.2f s to ready with every frontend (RSS %.0f MB)\n", r.RestartS, r.RestartRSSMB)
	}
	for _, m := range r.Maps {
		fmt.Fprintf(tw, "map %s\t%d/%d entries\n", m.Name, m.Entries, m.Capacity)
	}
	for _, f := range r.FirstPacket {
		fmt.Fprintf(tw, "first packet at %d Services\t%s\n", f.Services, f.describe(r.FirstPacket[0]))
	}
	fmt.Fprintf(tw, "API server: open watches at rest\t%d\n", r.API.OpenWatches)
	fmt.Fprintf(tw, "API server: during the churn\tLIST %s; streamed lists %s; WATCH ended %s\n",
		formatCalls(r.API.ChurnLists), formatCalls(r.API.ChurnWatchLists), formatCalls(r.API.ChurnWatches))
	fmt.Fprintf(tw, "API server: the agent restart\tLIST %s; streamed lists %s\n", formatCalls(r.API.RestartLists), formatCalls(r.API.RestartWatchLists))
	return tw.Flush()
}
