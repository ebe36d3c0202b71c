package metrics

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lanekit/lanekit/internal/unixhttp"
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

// backendMaxBody bounds one backend's answer: its metrics are a few dozen
// families per queue, far below this.
const backendMaxBody = 1 << 20

// parseBackend reads and parses the metrics the backend of VM vm serves on
// sock, running as uid. A backend is the VM's, not the agent's: whatever a
// compromised one serves must not reach another VM's series or mislead the
// agent. So the socket must be a socket owned by uid in a directory owned by
// uid with no access for others (no symbolic link on the way), its server
// must run as uid (SO_PEERCRED), the answer is bounded, and every series gets
// vm="<vm>" whatever label the backend put there.
func parseBackend(sock string, uid uint32, vm string) (map[string]*dto.MetricFamily, error) {
	if err := checkBackendPath(sock, uid); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), backendScrapeTimeout)
	defer cancel()
	text, err := unixhttp.GetWith(ctx, sock, "/metrics", unixhttp.Options{MaxBody: backendMaxBody, PeerUID: &uid})
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sock, err)
	}
	for _, f := range fams {
		for _, m := range f.Metric {
			setVMLabel(m, vm)
		}
	}
	return fams, nil
}

// checkBackendPath checks the backend's metrics directory and socket.
func checkBackendPath(sock string, uid uint32) error {
	dir := filepath.Dir(sock)
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, os.ModeDir}, {sock, os.ModeSocket}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case fi.Mode().Type() != c.mode:
			return fmt.Errorf("%s: %s, want a %s", c.path, fileType(fi.Mode()), fileType(c.mode))
		case !ok || st.Uid != uid:
			return fmt.Errorf("%s: not owned by the backend's uid %d", c.path, uid)
		case c.mode == os.ModeDir && fi.Mode().Perm()&0o077 != 0:
			return fmt.Errorf("%s: mode %s, want no access for group or others", c.path, fi.Mode().Perm())
		}
	}
	return nil
}

func fileType(m os.FileMode) string {
	switch m.Type() {
	case os.ModeDir:
		return "directory"
	case os.ModeSocket:
		return "socket"
	case os.ModeSymlink:
		return "symbolic link"
	case 0:
		return "regular file"
	}
	return m.Type().String()
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
