package lab

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// The API server's side of the scale run, from its own metrics: what the
// agents cost it. Informers list once per resource at start (and after a
// restart) and then only watch; a LIST during steady churn, or a burst of
// WATCH calls, is a relist: the thing to catch.

// apiLoad is a snapshot of the API server's request metrics.
type apiLoad struct {
	// calls: apiserver_request_total summed by "VERB resource" (completed
	// requests: a WATCH counts when it ends).
	calls map[string]float64
	// openWatches: apiserver_longrunning_requests{verb="WATCH"}, summed.
	openWatches float64
	// watchLists: the streamed initial lists (WatchList: a WATCH with
	// sendInitialEvents, what client-go's informers use instead of a LIST
	// where the server has it), from the sample count of
	// apiserver_watch_list_duration_seconds, summed as "WATCHLIST resource".
}

// APILoad is what the agents cost the API server in a scale run.
type APILoad struct {
	// OpenWatches at rest, after the objects were created (both agents and
	// the lab's other clients).
	OpenWatches int `json:"open_watches"`
	// ChurnLists and ChurnWatches are the LIST and completed WATCH calls
	// during the churn (by resource); steady state should be none.
	ChurnLists   map[string]int `json:"churn_list_calls"`
	ChurnWatches map[string]int `json:"churn_watch_calls"`
	// RestartLists are the LIST calls while node 1's agent restarted,
	// by resource, and RestartWatchLists its streamed initial lists: its
	// informers' start.
	RestartLists      map[string]int `json:"restart_list_calls"`
	RestartWatchLists map[string]int `json:"restart_watchlist_calls"`
	ChurnWatchLists   map[string]int `json:"churn_watchlist_calls"`
}

// scrapeAPILoad reads the API server's /metrics through c.
func scrapeAPILoad(ctx context.Context, c kubernetes.Interface) (apiLoad, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiLoad{}, fmt.Errorf("API server metrics: %w", err)
	}
	return parseAPILoad(raw)
}

func parseAPILoad(raw []byte) (apiLoad, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return apiLoad{}, fmt.Errorf("API server metrics: %w", err)
	}
	l := apiLoad{calls: map[string]float64{}}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l.calls[label(m, "verb")+" "+label(m, "resource")] += m.GetCounter().GetValue()
	}
	for _, m := range fams["apiserver_longrunning_requests"].GetMetric() {
		if label(m, "verb") == "WATCH" {
			l.openWatches += m.GetGauge().GetValue()
		}
	}
	for _, m := range fams["apiserver_watch_list_duration_seconds"].GetMetric() {
		l.calls["WATCHLIST "+label(m, "resource")] += float64(m.GetHistogram().GetSampleCount())
	}
	return l, nil
}

// label is the value of m's label name ("" if it has none).
func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// calls is the number of verb calls by resource from a to b.
func (a apiLoad) callsTo(b apiLoad, verb string) map[string]int {
	out := map[string]int{}
	for k, v := range b.calls {
		res, ok := strings.CutPrefix(k, verb+" ")
		if !ok {
			continue
		}
		if n := int(v - a.calls[k]); n > 0 {
			out[res] = n
		}
	}
	return out
}

// formatCalls is "n (resource n, ...)" or "none".
func formatCalls(m map[string]int) string {
	total := 0
	var parts []string
	for _, res := range slices.Sorted(maps.Keys(m)) {
		total += m[res]
		parts = append(parts, fmt.Sprintf("%s %d", res, m[res]))
	}
	if total == 0 {
		return "none"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}
