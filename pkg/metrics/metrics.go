// Package metrics exports the agent's view of the datapath to Prometheus:
// per-endpoint packets, bytes and drops by reason (read from the BPF
// counters at scrape time), agent health and the time the agent takes to
// answer its API calls. Everything lives in its own registry, served on an
// opt-in address (lanekitd --metrics-listen).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
)

// Source is what the collector reads at each scrape. *agent.Agent is one;
// the seam keeps the collector independent of how the agent reads counters.
type Source interface {
	List() ([]endpoint.Endpoint, error)
	Counters(id uint32) (datapath.Counters, error)
	Status() (agent.StatusInfo, error)
}

// Metric names. The Grafana dashboard in deploy/grafana uses exactly these.
const (
	NameUp             = "lanekit_up"
	NameDatapathLoaded = "lanekit_datapath_loaded"
	NameEndpoints      = "lanekit_endpoints"
	NameAddresses      = "lanekit_ipam_addresses"
	NameFeature        = "lanekit_kernel_feature"
	NameDeviceMode     = "lanekit_device_mode_info"
	NamePackets        = "lanekit_endpoint_packets_total"
	NameBytes          = "lanekit_endpoint_bytes_total"
	NameStackFallback  = "lanekit_endpoint_stack_fallback_packets_total"
	NameDrops          = "lanekit_endpoint_drops_total"
	NameUnattributed   = "lanekit_unattributed_drops_total"
	NameRPCDuration    = "lanekit_api_request_duration_seconds"
	NameStartup        = "lanekit_agent_startup_duration_seconds"
)

// Options configure the collector.
type Options struct {
	// DatapathLoaded checks that the datapath is in place (for the BPF
	// backend: its pinned maps open). nil: loaded when the backend is "bpf".
	DatapathLoaded func() error
	Log            *slog.Logger
}

// PinsLoaded is the DatapathLoaded check of the BPF backend: the pinned maps
// under pinDir open and read.
func PinsLoaded(pinDir string) func() error {
	return func() error {
		_, err := datapath.InspectPins(pinDir)
		return err
	}
}

// Metrics is the agent's registry. Create it before the agent (its API
// interceptor goes into agent.Config.ServerOptions), then Watch the agent.
type Metrics struct {
	Registry *prometheus.Registry
	rpc      *prometheus.HistogramVec
	startup  prometheus.Gauge
	prog     programming
	opts     Options
	src      Source // set by Watch; /readyz asks it
}

// New creates the registry with the API timing histogram.
func New(opts Options) *Metrics {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	m := &Metrics{Registry: prometheus.NewRegistry(), opts: opts}
	m.rpc = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: NameRPCDuration,
		Help: "Time the agent took to answer an API call (ADD/DEL/CHECK from the CNI plugin, CLI calls), by method and gRPC code.",
		// 100 µs .. ~13 s: a pod ADD creates devices and programs maps.
		Buckets: prometheus.ExponentialBuckets(100e-6, 2.5, 14),
	}, []string{"method", "code"})
	m.startup = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: NameStartup,
		Help: "How long the agent's start-up took: kernel probes, store, datapath load and the re-adoption (reconcile) of stored endpoints.",
	})
	m.prog = newProgramming()
	m.Registry.MustRegister(m.rpc, m.startup, m.prog.network, m.prog.policy)
	return m
}

// ObserveStartup records how long the agent took to start.
func (m *Metrics) ObserveStartup(d time.Duration) { m.startup.Set(d.Seconds()) }

// UnaryInterceptor records the duration of each API call.
func (m *Metrics) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	m.rpc.WithLabelValues(methodName(info.FullMethod), status.Code(err).String()).Observe(time.Since(start).Seconds())
	return resp, err
}

// ServerOption is the interceptor as a gRPC server option.
func (m *Metrics) ServerOption() grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(m.UnaryInterceptor)
}

// methodName turns "/lanekit.v1.Agent/AddEndpoint" into "AddEndpoint".
func methodName(full string) string {
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[i+1:]
		}
	}
	return full
}

// WithDatapathCheck sets how the collector decides that the datapath is
// loaded (see PinsLoaded); call before Watch.
func (m *Metrics) WithDatapathCheck(check func() error) *Metrics {
	m.opts.DatapathLoaded = check
	return m
}

// Watch registers the collector reading src at each scrape.
func (m *Metrics) Watch(src Source) error {
	if err := m.Registry.Register(&collector{src: src, opts: m.opts}); err != nil {
		return err
	}
	m.src = src
	return nil
}

// Healthz answers the DaemonSet's liveness probe: the agent process serves.
func (m *Metrics) Healthz(w http.ResponseWriter, _ *http.Request) {
	fmt.Fprintln(w, "ok")
}

// Readyz answers the readiness probe: 200 when the agent reports Ready (its
// datapath is loaded and forwarding), 503 with the reason otherwise.
func (m *Metrics) Readyz(w http.ResponseWriter, _ *http.Request) {
	if m.src == nil {
		http.Error(w, "not ready: no agent watched", http.StatusServiceUnavailable)
		return
	}
	st, err := m.src.Status()
	switch {
	case err != nil:
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
	case !st.Ready:
		http.Error(w, "not ready: "+st.NotReadyReason, http.StatusServiceUnavailable)
	default:
		fmt.Fprintln(w, "ready")
	}
}

// Handler serves the registry in the Prometheus exposition formats, with
// the metrics of the VM backends the agent runs (after Watch).
func (m *Metrics) Handler() http.Handler {
	var g prometheus.Gatherer = m.Registry
	if vs, ok := m.src.(VMBackendSource); ok {
		g = prometheus.Gatherers{m.Registry, backendGatherer{src: vs, log: m.opts.Log}}
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slogPrinter{m.opts.Log},
	})
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics", "err", fmt.Sprint(v...)) }

// Serve listens on addr and serves /metrics until ctx is cancelled. It
// returns once the listener is up; errors after that are logged.
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", m.Healthz)
	mux.HandleFunc("/readyz", m.Readyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.opts.Log.Error("metrics server", "err", err)
		}
	}()
	return lis.Addr(), nil
}

var (
	epLabels   = []string{"endpoint", "endpoint_id", "namespace", "kind"}
	descUp     = prometheus.NewDesc(NameUp, "1 when the agent answered this scrape (status and endpoint list).", nil, nil)
	descLoaded = prometheus.NewDesc(NameDatapathLoaded, "1 when the datapath backend is in place (BPF: its pinned maps open).", []string{"backend"}, nil)
	descEPs    = prometheus.NewDesc(NameEndpoints, "Endpoints the agent manages, by kind.", []string{"kind"}, nil)
	descAddrs  = prometheus.NewDesc(NameAddresses, "Pod CIDR addresses: allocated and capacity.", []string{"state"}, nil)
	descFeat   = prometheus.NewDesc(NameFeature, "Kernel features probed at agent start-up (1 supported, 0 not; absent when the probe could not decide).", []string{"feature"}, nil)
	descMode   = prometheus.NewDesc(NameDeviceMode, "The pod device kind the agent chose (always 1).", []string{"mode"}, nil)
	descPkts   = prometheus.NewDesc(NamePackets, "Packets the datapath forwarded for an endpoint; direction from = sent by it, to = delivered to it.", append(epLabels, "direction"), nil)
	descStack  = prometheus.NewDesc(NameStackFallback, "Packets an endpoint sent that BPF handed to the host stack instead of forwarding (too big for the egress MTU, IP options, TTL 1, broadcast/multicast, traffic for the node).", epLabels, nil)
	descBytes  = prometheus.NewDesc(NameBytes, "Bytes (frames incl. Ethernet header) the datapath forwarded for an endpoint.", append(epLabels, "direction"), nil)
	descDrops  = prometheus.NewDesc(NameDrops, "Packets the datapath dropped for an endpoint, by reason.", append(epLabels, "reason"), nil)
	descUnattr = prometheus.NewDesc(NameUnattributed, "Drops the datapath could not attribute to an endpoint (e.g. unknown device), by reason.", []string{"reason"}, nil)
)

type collector struct {
	src  Source
	opts Options
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descLoaded, descEPs, descAddrs, descFeat, descMode, descPkts, descBytes, descStack, descDrops, descUnattr} {
		ch <- d
	}
	if _, ok := c.src.(ControlPlaneSource); ok {
		for _, d := range controlDescs {
			ch <- d
		}
	}
	if _, ok := c.src.(VMBackendSource); ok {
		ch <- descVMBackendUp
		ch <- descVMBackendRestarts
		ch <- descVMHandoverRefused
	}
}

// EndpointLabels names an endpoint for the metric labels: the pod (from the
// CNI args K8S_POD_NAME/K8S_POD_NAMESPACE), the VM name, or the container id.
func EndpointLabels(ep endpoint.Endpoint) (name, ns string) {
	name, ns = ep.Labels["K8S_POD_NAME"], ep.Labels["K8S_POD_NAMESPACE"]
	switch {
	case name != "":
	case ep.VM != nil && ep.VM.Name != "":
		name = ep.VM.Name
	default:
		name = ep.ContainerID
		if len(name) > 12 {
			name = name[:12]
		}
	}
	return name, ns
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	up := 1.0
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	st, err := c.src.Status()
	if err != nil {
		c.opts.Log.Warn("metrics: agent status", "err", err)
		up = 0
	} else {
		loaded := 0.0
		check := c.opts.DatapathLoaded
		switch {
		case check != nil:
			if err := check(); err == nil {
				loaded = 1
			} else {
				c.opts.Log.Warn("metrics: datapath check", "err", err)
			}
		case st.Ready:
			loaded = 1
		}
		gauge(descLoaded, loaded, st.Backend)
		gauge(descAddrs, float64(st.IPsAllocated), "allocated")
		gauge(descAddrs, float64(st.IPsCapacity), "capacity")
		gauge(descMode, 1, string(st.DeviceMode))
		for _, row := range st.Features.Table() {
			if row.Feature.Unknown {
				continue // not decided at start-up: no sample rather than a false 0
			}
			v := 0.0
			if row.Feature.Supported {
				v = 1
			}
			gauge(descFeat, v, row.Name)
		}
	}
	eps, err := c.src.List()
	if err != nil {
		c.opts.Log.Warn("metrics: list endpoints", "err", err)
		up = 0
	}
	kinds := map[string]int{string(endpoint.KindPod): 0, string(endpoint.KindVM): 0}
	for _, ep := range eps {
		kind := string(ep.Kind)
		if kind == "" {
			kind = string(endpoint.KindPod)
		}
		kinds[kind]++
		cs, err := c.src.Counters(ep.ID)
		if err != nil {
			c.opts.Log.Warn("metrics: endpoint counters", "id", ep.ID, "err", err)
			continue
		}
		name, ns := EndpointLabels(ep)
		l := []string{name, strconv.FormatUint(uint64(ep.ID), 10), ns, kind}
		counter(descPkts, cs.FromPackets, append(l, "from")...)
		counter(descPkts, cs.ToPackets, append(l, "to")...)
		counter(descBytes, cs.FromBytes, append(l, "from")...)
		counter(descBytes, cs.ToBytes, append(l, "to")...)
		counter(descStack, cs.StackPackets, l...)
		for r, n := range cs.Drops {
			counter(descDrops, n, append(l, r.String())...)
		}
	}
	for k, n := range kinds {
		gauge(descEPs, float64(n), k)
	}
	if cs, err := c.src.Counters(0); err == nil {
		for r, n := range cs.Drops {
			counter(descUnattr, n, r.String())
		}
	} else if up == 1 {
		c.opts.Log.Warn("metrics: unattributed drops", "err", err)
	}
	if cp, ok := c.src.(ControlPlaneSource); ok {
		c.collectControlPlane(ch, cp)
	}
	if vs, ok := c.src.(VMBackendSource); ok {
		c.collectVMBackends(ch, vs)
	}
	gauge(descUp, up)
}
