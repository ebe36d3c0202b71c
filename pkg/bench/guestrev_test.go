package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestGuestRowsMeasureTCPFromTheGuest: the guest rows (and only they) get a
// second TCP measurement with the guest sending, reported in the JSON and
// printed under the table; other rows have none.
func TestGuestRowsMeasureTCPFromTheGuest(t *testing.T) {
	saved := metrics
	t.Cleanup(func() { metrics = saved })
	var ran []string
	metrics = nil
	for _, m := range saved {
		name := m.name
		m.run = func(_ context.Context, _ Options, p Path, s *samples) error {
			ran = append(ran, name+"/"+p.Name)
			switch name {
			case "tcp":
				s.gbps[s.cur] = 1
			case "tcp-rev":
				s.gbpsRev[s.cur] = 0.5 + float64(s.cur)
			}
			return nil
		}
		metrics = append(metrics, m)
	}
	paths := []Path{{Name: "lanekit-pod"}, {Name: "lanekit-vm", Guest: &Guest{Name: "vm1"}}}
	r, err := Run(context.Background(), paths, Options{Repeat: 2, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(ran, " ")
	if strings.Contains(got, "tcp-rev/lanekit-pod") || strings.Count(got, "tcp-rev/lanekit-vm") != 2 {
		t.Fatalf("tcp-rev must run on the guest row only, each repetition: %s", got)
	}
	if r.Rows[0].TCPRevGbps != nil || r.Rows[1].TCPRevGbps == nil || r.Rows[1].TCPRevGbps.Max != 1.5 {
		t.Fatalf("rows: %+v / %+v", r.Rows[0].TCPRevGbps, r.Rows[1].TCPRevGbps)
	}
	js, err := json.Marshal(r.Rows)
	if err != nil {
		t.Fatal(err)
	}
	// the guest row's summary and its repetitions, nothing for the pod row
	if strings.Count(string(js), `"tcp_rev_gbps":{`) != 1 || strings.Count(string(js), `"tcp_rev_gbps":[`) != 1 {
		t.Fatalf("json: %s", js)
	}
	var out bytes.Buffer
	if err := r.writeRows(&out); err != nil {
		t.Fatal(err)
	}
	if want := "TCP from the guest (lanekit-vm -> client, iperf3 -R): "; !strings.Contains(out.String(), want) {
		t.Fatalf("no %q line:\n%s", want, out.String())
	}
}
