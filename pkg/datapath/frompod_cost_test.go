package datapath

import (
	"os"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	"slices"
	"testing"
	"time"
)

// TestFromPodPacketCost (opt-in: LANEKIT_MEASURE=1) measures from_pod's own
// run time per packet kind, as the kernel times one BPF_PROG_TEST_RUN (no
// syscall in it): a new connection's SYN to a pod on another node and to a
// ClusterIP, and an established connection's ACK each way. Medians of many
// single runs (a repeated run would re-run on the frame the first run
// rewrote). A measurement, not a check:
//
//	LANEKIT_MEASURE=1 go test -count=1 -v -run FromPodPacketCost ./pkg/datapath/
func TestFromPodPacketCost(t *testing.T) {
	if os.Getenv("LANEKIT_MEASURE") == "" {
		t.Skip("a measurement: set LANEKIT_MEASURE=1 to run it")
	}
	s := newSvcEnv(t)
	s.enter(t)
	s.apply(t, svcYAML("cost", "10.96.0.10", 80, "TCP", "", "10.244.2.5", "10.244.2.6"))
	prog := fromPod(s.fixtureEnv)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	run := func(in []byte) {
		opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256), Context: skbCtx{Ifindex: uint32(ifH1(s.fixtureEnv))}}
		if v, err := prog.Run(opts); err != nil || v != tcActRedirect {
			t.Fatalf("verdict %d, %v", v, err)
		}
	}
	const n = 10000
	for _, c := range []struct {
		name  string
		frame func(i int) []byte
	}{
		{"SYN to a pod on node 2 (new flow)", func(i int) []byte { return s.fromPod1("10.244.2.5", 8080, uint16(1024+i%60000), tcpSYN) }},
		{"ACK to a pod on node 2 (same flow)", func(int) []byte { return s.fromPod1("10.244.2.5", 8080, 999, tcpACK) }},
		{"SYN to a ClusterIP (new flow)", func(i int) []byte { return s.fromPod1("10.96.0.10", 80, uint16(1024+i%60000), tcpSYN) }},
		{"ACK to a ClusterIP (same flow)", func(int) []byte { return s.fromPod1("10.96.0.10", 80, 998, tcpACK) }},
	} {
		var per []time.Duration
		for r := range 5 {
			before, err := prog.Stats()
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				run(c.frame(r*n + i))
			}
			after, err := prog.Stats()
			if err != nil {
				t.Fatal(err)
			}
			per = append(per, (after.Runtime-before.Runtime)/time.Duration(after.RunCount-before.RunCount))
		}
		slices.Sort(per)
		t.Logf("%-36s %v per run (median of 5 × %d; %v–%v)", c.name, per[2], n, per[0], per[4])
	}
}
