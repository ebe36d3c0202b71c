package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// DPULinkSource is one side of the host/DPU link (dpu.Server on the DPU,
// dpu.Host on the host).
type DPULinkSource interface {
	LinkStatus() *apiv1.DPULinkStatus
}

// The host/DPU link's metric names.
const (
	NameDPUCertExpiry = "lanekit_dpu_cert_expiry_seconds"
	NameDPURefused    = "lanekit_dpu_link_refused_calls_total"
)

var (
	descDPUCertExpiry = prometheus.NewDesc(NameDPUCertExpiry, "Seconds until a certificate of the host/DPU link expires (negative: expired), by the side that uses it (role host|dpu) and which certificate (local: its own, peer: the other side's as last presented, ca). Alert well before 0: the link breaks then.", []string{"role", "cert"}, nil)
	descDPURefused    = prometheus.NewDesc(NameDPURefused, "Calls the DPU refused on its link: a certificate naming another host, an expired one, or an RPC the host may not make.", []string{"role"}, nil)
)

// WatchDPULink exports the link's certificate expiry and refused calls,
// read from src at each scrape.
func (m *Metrics) WatchDPULink(src DPULinkSource) error {
	return m.Registry.Register(dpuLinkCollector{src: src})
}

type dpuLinkCollector struct{ src DPULinkSource }

func (c dpuLinkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDPUCertExpiry
	ch <- descDPURefused
}

func (c dpuLinkCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.LinkStatus()
	now := time.Now()
	for _, cert := range st.GetCertificates() {
		left := time.Unix(cert.GetNotAfterUnix(), 0).Sub(now).Seconds()
		ch <- prometheus.MustNewConstMetric(descDPUCertExpiry, prometheus.GaugeValue, left, st.GetRole(), cert.GetWhich())
	}
	if st.GetRole() == "dpu" {
		ch <- prometheus.MustNewConstMetric(descDPURefused, prometheus.CounterValue, float64(st.GetRefusedCalls()), st.GetRole())
	}
}
