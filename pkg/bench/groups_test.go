package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRunGroupsInterleaves: RunGroups brings each group up for every
// repetition, in an order that rotates, measures only that group's paths
// while it is up, takes it down after each (also after a failed up), and
// pairs rows across groups by repetition.
func TestRunGroupsInterleaves(t *testing.T) {
	var events []string
	up := ""
	// Every metric records which group was up: a measurement outside its
	// group's lifetime fails the test. TCP of path P in group G, rep k is
	// value(G, P, k).
	value := map[string]float64{"native/host-raw": 10, "native/lanekit-pod": 9, "tunnel/host-raw": 10, "tunnel/lanekit-pod-tunnel": 6}
	saved := metrics
	t.Cleanup(func() { metrics = saved })
	metrics = []metric{{"tcp", func(_ context.Context, _ Options, p Path, s *samples) error {
		g := strings.TrimPrefix(p.ClientNS, "ns-")
		if g != up {
			t.Errorf("%s measured while %q was up", p.Name, up)
		}
		events = append(events, fmt.Sprintf("%s/%s", g, p.Name))
		s.gbps[s.cur] = value[g+"/"+p.Name] * float64(s.cur+1)
		return nil
	}, nil}}
	failTunnelRep := 2
	rep := map[string]int{}
	group := func(name string, rows ...string) Group {
		return Group{Name: name,
			Up: func(context.Context) ([]Path, []string, error) {
				rep[name]++
				events = append(events, "up "+name)
				if name == "tunnel" && rep[name] == failTunnelRep {
					return nil, nil, errors.New("boom")
				}
				up = name
				var ps []Path
				for _, r := range rows {
					ps = append(ps, Path{Name: r, ClientNS: "ns-" + name})
				}
				return ps, nil, nil
			},
			Down: func(context.Context) error { events = append(events, "down "+name); up = ""; return nil },
		}
	}
	g, err := RunGroups(context.Background(), []Group{group("native", RawPath, "lanekit-pod"), group("tunnel", RawPath, "lanekit-pod-tunnel")},
		[]CrossRef{{Path: "lanekit-pod-tunnel", Group: "tunnel", Ref: "lanekit-pod", RefGroup: "native"}},
		Options{Repeat: 3, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"up native", "native/host-raw", "native/lanekit-pod", "down native",
		"up tunnel", "tunnel/host-raw", "tunnel/lanekit-pod-tunnel", "down tunnel",
		"up tunnel", "down tunnel", // rep 2 starts with tunnel, whose up fails
		"up native", "native/lanekit-pod", "native/host-raw", "down native",
		"up native", "native/host-raw", "native/lanekit-pod", "down native",
		"up tunnel", "tunnel/host-raw", "tunnel/lanekit-pod-tunnel", "down tunnel",
	}
	if strings.Join(events, "; ") != strings.Join(want, "; ") {
		t.Fatalf("events\n got %s\nwant %s", strings.Join(events, "; "), strings.Join(want, "; "))
	}
	if fmt.Sprint(g.Order) != "[[native tunnel] [tunnel native] [native tunnel]]" {
		t.Fatalf("order %v", g.Order)
	}
	if len(g.Errors) != 1 || !strings.Contains(g.Errors[0], "tunnel rep 2: up: boom") || !g.Failed() {
		t.Fatalf("errors %v (failed %v)", g.Errors, g.Failed())
	}
	tun := g.row("tunnel", "lanekit-pod-tunnel")
	if tun == nil || tun.Reps.TCPGbps[1] != nil || *tun.Reps.TCPGbps[2] != 18 {
		t.Fatalf("tunnel row %+v", tun)
	}
	// Paired within each group: 0.6 of its own host-raw in every rep.
	if r := tun.Paired[RawPath].TCPGbps; r == nil || r.Median < 0.599 || r.Median > 0.601 {
		t.Fatalf("tunnel vs host-raw %+v", r)
	}
	// Across groups: reps 1 and 3 only (rep 2 of the tunnel failed): 6/9.
	if len(g.Cross) != 1 || g.Cross[0].Ratios.TCPGbps == nil || g.Cross[0].Ratios.TCPGbps.Median < 0.666 || g.Cross[0].Ratios.TCPGbps.Median > 0.667 {
		t.Fatalf("cross %+v", g.Cross)
	}
	var b strings.Builder
	if err := g.WriteTable(&b); err != nil || !strings.Contains(b.String(), "lanekit-pod-tunnel (tunnel) / lanekit-pod (native): TCP 0.67×") {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
}

func TestRunGroupsBadInput(t *testing.T) {
	noop := func(context.Context) error { return nil }
	upFn := func(context.Context) ([]Path, []string, error) { return nil, nil, nil }
	for name, gs := range map[string][]Group{
		"none":      nil,
		"no name":   {{Up: upFn, Down: noop}},
		"duplicate": {{Name: "a", Up: upFn, Down: noop}, {Name: "a", Up: upFn, Down: noop}},
		"no down":   {{Name: "a", Up: upFn}},
	} {
		if _, err := RunGroups(context.Background(), gs, nil, Options{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
