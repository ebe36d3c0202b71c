package datapath

import (
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanekit/lanekit/internal/testutil"
)

// TestEventsCost measures from_pod per dropped packet (BPF_PROG_TEST_RUN,
// in-kernel repeat) with drop events off and on. (A forwarded frame cannot
// be measured so: the repeats run on the same buffer, which the first run
// rewrites, so the rest are dropped as spoofed.) A measurement, not a check:
//
//	LANEKIT_MEASURE=1 go test -count=1 -v -run EventsCost ./pkg/datapath/
func TestEventsCost(t *testing.T) {
	if os.Getenv("LANEKIT_MEASURE") == "" {
		t.Skip("a measurement: set LANEKIT_MEASURE=1 to run it")
	}
	e := newFixtureEnv(t)
	r, err := OpenEvents(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	spoofed := testutil.IPv4Frame(e.ep1.HostMAC, pod1MAC, "10.244.1.99", "10.244.2.5", 64)
	for _, c := range []struct {
		name  string
		cfg   EventsConfig
		frame []byte
	}{
		{"dropped/events-off", EventsConfig{}, spoofed},
		{"dropped/drops-on", EventsConfig{Drops: true}, spoofed},
		{"dropped/events-off-again", EventsConfig{}, spoofed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := r.Configure(c.cfg); err != nil {
				t.Fatal(err)
			}
			defer r.Configure(EventsConfig{})
			// In chunks the ring holds (nobody reads while the program
			// runs), drained between chunks: writes are measured, not the
			// ring-full path.
			const chunk = 4000
			var spent time.Duration
			const total = 400000
			for done := 0; done < total; done += chunk {
				n := min(chunk, total-done)
				opts := &ebpf.RunOptions{Data: c.frame, Context: skbCtx{Ifindex: uint32(ifH1(e))}, Repeat: uint32(n)}
				start := time.Now()
				if _, err := e.dp.pod.FromPod.Run(opts); err != nil {
					t.Fatal(err)
				}
				spent += time.Since(start)
				if evs := readEvents(t, r); c.cfg.Drops && len(evs) < n { // more: an interrupted run restarts
					t.Fatalf("%d drops reported %d events", n, len(evs))
				}
			}
			t.Logf("%s: %.1f ns/pkt", c.name, float64(spent.Nanoseconds())/total)
		})
	}
	if lost, err := r.Lost(); err != nil || lost != 0 {
		t.Fatalf("lost %d events (%v): the chunks overflowed the ring", lost, err)
	}
}
