package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

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
)

var (
	descVMBackendUp = prometheus.NewDesc(NameVMBackendUp,
		"1 while the vhost-user backend the agent runs for a VM attachment is running.", []string{"vm"}, nil)
	descVMBackendRestarts = prometheus.NewDesc(NameVMBackendRestarts,
		"Unexpected exits of a VM's vhost-user backend (each restarted) since the agent started.", []string{"vm"}, nil)
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
		if v.Endpoint.VM == nil || v.Endpoint.VM.Backend == nil {
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
