package bench

import (
	"fmt"
	"io"
	"strings"
)

// ProxyMetric is a proxy's own account of a row's timed programming step:
// one series of one of its histograms (kube-proxy's
// kubeproxy_network_programming_duration_seconds and
// kubeproxy_sync_proxy_rules_duration_seconds, Cilium's load-balancer map
// reconciler's cilium_reconciler_duration_seconds, lanekit's agent's
// kubeproxy_network_programming_duration_seconds), the observations between
// a scrape right before the timed API write and one after its first answer.
type ProxyMetric struct {
	// Name and Labels name the series (Labels in the text format's
	// `{k="v",...}`, empty without labels).
	Name   string `json:"name"`
	Labels string `json:"labels,omitempty"`
	// What says what the proxy measures with it.
	What string `json:"what"`
	// Count observations with a mean of Ms (the histogram's sum over its
	// count: exact, unlike its buckets).
	Count uint64  `json:"count"`
	Ms    float64 `json:"ms"`
	// Node is where it was read (the client's node).
	Node string `json:"node,omitempty"`
}

// ProxyMetricsReader is a SvcProgrammer that read the proxy's own metrics
// around its timed step: what the last Program saw, and why a read failed
// (empty: none did).
type ProxyMetricsReader interface {
	ProxyMetrics() ([]ProxyMetric, string)
}

// String is the metric as the report prints it.
func (m ProxyMetric) String() string {
	return fmt.Sprintf("%s%s %.1f ms (%d observation%s)", m.Name, m.Labels, m.Ms, m.Count, plural(m.Count))
}

func plural(n uint64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// writeProxyMetrics prints each row's proxy metrics beside its own
// first-answer time.
func writeProxyMetrics(w io.Writer, rows []SvcRow) {
	legend := false
	for _, row := range rows {
		if len(row.ProxyMetrics) == 0 && row.ProxyMetricsNote == "" {
			continue
		}
		if !legend {
			fmt.Fprintln(w, "own metrics: what each proxy reports of the timed write (its histograms' observations between a scrape before the write and one after the first answer, on the client's node; mean = sum / count)")
			legend = true
		}
		var parts []string
		for _, m := range row.ProxyMetrics {
			parts = append(parts, m.String())
		}
		if row.ProxyMetricsNote != "" {
			parts = append(parts, row.ProxyMetricsNote)
		}
		first := "not timed"
		if row.ProgramMs != (Summary{}) {
			first = fmt.Sprintf("%.1f ms", row.ProgramMs.Median) // one timed write a row
		}
		fmt.Fprintf(w, "own metrics: %s/%d: first answer %s; %s\n", row.Mode, row.Services, first, strings.Join(parts, "; "))
	}
	seen := map[string]bool{}
	for _, row := range rows {
		for _, m := range row.ProxyMetrics {
			if !seen[m.Name] {
				seen[m.Name] = true
				fmt.Fprintf(w, "own metric: %s: %s\n", m.Name, m.What)
			}
		}
	}
}
