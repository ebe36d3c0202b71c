package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// steerBins finds lanekit-vhost and rss_guest (make build installs both in
// bin/; LANEKIT_VHOST and LANEKIT_RSS_GUEST override).
func steerBins(t *testing.T) (vhost, guest string) {
	t.Helper()
	testutil.RequireBPFFS(t)
	vhost, guest = os.Getenv("LANEKIT_VHOST"), os.Getenv("LANEKIT_RSS_GUEST")
	if vhost == "" {
		vhost, _ = filepath.Abs("../../bin/lanekit-vhost")
	}
	if guest == "" {
		guest, _ = filepath.Abs("../../bin/lanekit-rss-guest")
	}
	for _, b := range []string{vhost, guest} {
		if _, err := os.Stat(b); err != nil {
			testutil.MissingDep(t, "%s not built", b)
		}
	}
	return vhost, guest
}

// TestSteeringRoot is the end-to-end test of the fast lane's RSS: the bench
// plays the agent (datapath with from_uplink, the VM endpoint, steer_vm,
// AF_XDP sockets and the VM's RSS map handed over), lanekit-vhost serves a
// guest driver (rss_guest) that negotiates VIRTIO_NET_F_RSS and
// F_HASH_REPORT and sets key, types and table through the control queue.
// Eight UDP flows enter from the wire. Each flow's hash in its virtio
// headers must equal the Toeplitz reference (BPF_PROG_TEST_RUN of the code
// `lanekit rss hash` runs) over the same frame, with report type UDPv4; each
// flow must arrive on the queue the guest's table names and on no other; the
// queues must be balanced. Without a guest configuration (first run) the
// flows still each keep one queue.
func TestSteeringRoot(t *testing.T) {
	vhost, guest := steerBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	rep, err := RunSteering(ctx, SteerOptions{VhostBin: vhost, GuestBin: guest, Duration: 2 * time.Second,
		Flows: 8, Queues: 4, Frames: 500, Progress: &log})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		t.Logf("%s: %d frames, per queue %v, balance %.2f, split flows %d, hash ok %d, queue ok %d",
			r.Mode, r.Frames, r.PerQueue, r.Balance, r.Split, r.HashOK, r.QueueOK)
		for _, f := range r.Flows {
			t.Logf("  %s: %d frames on %v, hashes %v (want %s), reports %v, want queue %d",
				f.Flow, f.Frames, f.Queues, f.Hashes, f.WantHash, f.Reports, f.WantQueue)
		}
		if len(r.Flows) != 8 || r.Split != 0 {
			t.Errorf("%s: %d flows seen, %d on more than one queue; want 8 and 0", r.Mode, len(r.Flows), r.Split)
		}
		if r.Frames < 8*500*9/10 {
			t.Errorf("%s: %d of %d frames reached the guest", r.Mode, r.Frames, 8*500)
		}
	}
	on := rep.Runs[1]
	if on.Mode != "guest-rss" || on.HashOK != 8 || on.QueueOK != 8 {
		t.Errorf("guest-rss: %d flows with the reference hash, %d on the table's queue; want 8 and 8", on.HashOK, on.QueueOK)
	}
	if on.Balance < 1 || on.Balance > 1.3 {
		t.Errorf("guest-rss: per-queue balance %.2f (%v), want <= 1.3", on.Balance, on.PerQueue)
	}
	if _, err := os.Stat("/run/netns/lk-vhs-" + itoa(os.Getpid())); err == nil {
		t.Error("netns left behind")
	}
	if _, err := os.Stat("/sys/fs/bpf/lk-vhs-" + itoa(os.Getpid())); err == nil {
		t.Error("bpf pin dir left behind")
	}
}

// TestSteeringTestpmdRoot runs the bench's throughput mode (testpmd replaying
// the flows at full speed) briefly: frames arrive on every queue, no flow is
// split, and with the guest's table the queues are balanced.
func TestSteeringTestpmdRoot(t *testing.T) {
	vhost, guest := steerBins(t)
	testutil.RequireBinary(t, "dpdk-testpmd")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	rep, err := RunSteering(ctx, SteerOptions{VhostBin: vhost, GuestBin: guest, Testpmd: "dpdk-testpmd",
		Duration: 2 * time.Second, Progress: &log})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	t.Log(b.String())
	for _, r := range rep.Runs {
		if r.Frames == 0 || r.Split != 0 {
			t.Errorf("%s: %d frames, %d split flows", r.Mode, r.Frames, r.Split)
		}
	}
	if on := rep.Runs[1]; on.Balance < 1 || on.Balance > 1.3 || on.QueueOK != 8 || on.HashOK != 8 {
		t.Errorf("guest-rss: balance %.2f, %d/8 on the table's queue, %d/8 hashes", on.Balance, on.QueueOK, on.HashOK)
	}
}
