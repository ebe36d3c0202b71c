package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lanekit/lanekit/pkg/agent"
)

// VMBackendSource is an agent that runs VM backends (CNI VM attachments);
// *agent.Agent is one.
type VMBackendSource interface {
	ListVMs() ([]agent.VMInfo, error)
}

// VM backend metric names.
const (
	NameVMBackendUp       = "lanekit_vm_backend_up"
	NameVMBackendRestarts = "lanekit_vm_backend_restarts_total"
	NameVMHandoverRefused = "lanekit_vm_handover_refused_total"
)

var (
	descVMBackendUp = prometheus.NewDesc(NameVMBackendUp,
		"1 while the vhost-user backend the agent runs for a VM attachment is running.", []string{"vm"}, nil)
	descVMBackendRestarts = prometheus.NewDesc(NameVMBackendRestarts,
		"Unexpected exits of a VM's vhost-user backend (each restarted) since the agent started.", []string{"vm"}, nil)
	descVMHandoverRefused = prometheus.NewDesc(NameVMHandoverRefused,
		"Connections to a VM's socket server refused for their credentials (neither root nor the VM's backend uid): another VM's backend, or anyone else, asking for this VM's AF_XDP sockets.", []string{"vm"}, nil)
)

// collectVMBackends reports each backend the agent runs; VMs whose backend
// runs elsewhere have none.
func (c *collector) collectVMBackends(ch chan<- prometheus.Metric, src VMBackendSource) {
	vms, err := src.ListVMs()
	if err != nil {
		c.opts.Log.Warn("metrics: list vms", "err", err)
		return
	}
	for _, v := range vms {
		if v.Endpoint.VM == nil {
			continue
		}
		if v.Serving {
			ch <- prometheus.MustNewConstMetric(descVMHandoverRefused, prometheus.CounterValue, float64(v.HandoverRefused), v.Endpoint.VM.Name)
		}
		if v.Endpoint.VM.Backend == nil {
			continue
		}
		up, restarts := 0.0, uint32(0)
		if b := v.Backend; b != nil {
			restarts = b.Restarts
			if b.PID > 0 {
				up = 1
			}
		}
		ch <- prometheus.MustNewConstMetric(descVMBackendUp, prometheus.GaugeValue, up, v.Endpoint.VM.Name)
		ch <- prometheus.MustNewConstMetric(descVMBackendRestarts, prometheus.CounterValue, float64(restarts), v.Endpoint.VM.Name)
	}
}

// backendScrapeTimeout bounds one backend's answer within a scrape.
const backendScrapeTimeout = 2 * time.Second

// backendGatherer adds the metrics of the backends the agent runs
// (lanekit_vhost_*, labelled by vm) to the agent's /metrics: in a cluster,
// Prometheus scrapes the agent, not each backend's unix socket.
type backendGatherer struct {
	src VMBackendSource
	log *slog.Logger
}

func (g backendGatherer) Gather() ([]*dto.MetricFamily, error) {
	vms, err := g.src.ListVMs()
	if err != nil {
		return nil, fmt.Errorf("list vms: %w", err)
	}
	byName := map[string]*dto.MetricFamily{}
	var names []string
	for _, v := range vms {
		if v.Endpoint.VM == nil || v.Endpoint.VM.Backend == nil || v.Backend == nil || v.Backend.PID == 0 {
			continue
		}
		b := v.Endpoint.VM.Backend
		if b.MetricsSocket == "" {
			continue
		}
		fams, err := parseBackend(b.MetricsSocket, b.UID, v.Endpoint.VM.Name)
		if err != nil {
			g.log.Warn("metrics: vm backend", "vm", v.Endpoint.VM.Name, "err", err)
			continue
		}
		for name, f := range fams {
			if cur, ok := byName[name]; ok {
				cur.Metric = append(cur.Metric, f.Metric...)
				continue
			}
			byName[name] = f
			names = append(names, name)
		}
	}
	sort.Strings(names)
	out := make([]*dto.MetricFamily, 0, len(names))
	for _, n := range names {
		out = append(out, byName[n])
	}
	return out, nil
}

// parseBackend reads the metrics the backend of VM vm serves on sock,
// running as uid (agent.ScrapeBackend: its path, owner and peer checked, the
// answer bounded), and gives every series vm="<vm>" whatever label the
// backend put there: one VM's backend cannot reach another VM's series.
func parseBackend(sock string, uid uint32, vm string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), backendScrapeTimeout)
	defer cancel()
	fams, err := agent.ScrapeBackend(ctx, sock, uid)
	if err != nil {
		return nil, err
	}
	for _, f := range fams {
		for _, m := range f.Metric {
			setVMLabel(m, vm)
		}
	}
	return fams, nil
}

// setVMLabel makes m's vm label vm (replacing or adding it).
func setVMLabel(m *dto.Metric, vm string) {
	for _, l := range m.Label {
		if l.GetName() == "vm" {
			l.Value = proto.String(vm)
			return
		}
	}
	m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("vm"), Value: proto.String(vm)})
	sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
}
