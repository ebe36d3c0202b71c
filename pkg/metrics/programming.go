package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Programming latency names. NameNetworkProgramming is kube-proxy's
// (subsystem kubeproxy), with its semantics and buckets, so dashboards and
// the Kubernetes scalability SLI read lanekit as they read kube-proxy.
const (
	NameNetworkProgramming = "kubeproxy_network_programming_duration_seconds"
	NamePolicyProgramming  = "lanekit_policy_programming_duration_seconds"
)

// programmingBuckets are kube-proxy's NetworkProgrammingLatency buckets:
// 0.25 s, 0.5 s, 1..59 s by 1 s, 60..115 s by 5 s, 120..300 s by 30 s.
func programmingBuckets() []float64 {
	b := prometheus.LinearBuckets(0.25, 0.25, 2)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

type programming struct {
	network *prometheus.HistogramVec
	policy  *prometheus.HistogramVec
}

func newProgramming() programming {
	return programming{
		network: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: NameNetworkProgramming,
			Help: "In Cluster Network Programming Latency in seconds: from an EndpointSlice change's " +
				"endpoints.kubernetes.io/last-change-trigger-time (a new slice without it: its Service's creation) " +
				"to the agent's service maps holding the new backend set. Changes from before the agent started are not counted.",
			Buckets: programmingBuckets(),
		}, []string{"ip_family"}),
		policy: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: NamePolicyProgramming,
			Help: "Time from a NetworkPolicy, Namespace or Pod (labels, addresses, node) change reaching the agent's watch " +
				"to the policy maps written, by the kind that changed.",
			Buckets: programmingBuckets(),
		}, []string{"trigger"}),
	}
}

// ObserveNetworkProgramming records an EndpointSlice change programmed d
// after its trigger time (k8s.LatencyObserver).
func (m *Metrics) ObserveNetworkProgramming(family string, d time.Duration) {
	m.prog.network.WithLabelValues(family).Observe(d.Seconds())
}

// ObservePolicyProgramming records a policy input programmed d after its
// watch event arrived (k8s.LatencyObserver).
func (m *Metrics) ObservePolicyProgramming(trigger string, d time.Duration) {
	m.prog.policy.WithLabelValues(trigger).Observe(d.Seconds())
}
