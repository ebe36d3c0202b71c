package dpu

import (
	"context"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// flakyAPI is the DPU agent's API whose next DelEndpoint calls fail as if
// the link dropped again.
type flakyAPI struct {
	apiv1.AgentServer
	failDels, failed atomic.Int32
}

func (f *flakyAPI) DelEndpoint(ctx context.Context, req *apiv1.DelEndpointRequest) (*apiv1.DelEndpointResponse, error) {
	if f.failDels.Add(-1) >= 0 {
		f.failed.Add(1)
		return nil, status.Error(codes.Unavailable, "injected: the link dropped")
	}
	return f.AgentServer.DelEndpoint(ctx, req)
}

// A pod deleted while the DPU is unreachable: its CNI DEL fails, and when
// the DPU comes back the host's reconcile removes the endpoint there, with
// its VF's representor, even though the first reconcile fails: it is
// retried until it succeeds.
func TestReconcileRetried(t *testing.T) {
	testutil.RequireRoot(t)
	hostNS, dpuNS, podNS := netnstest.New(t, "rcihost"), netnstest.New(t, "rcidpu"), netnstest.New(t, "rcipod")
	a, dp, reps := dpuAgent(t, hostNS, dpuNS, "10.250.2.0/24", nil)
	defer a.Close()
	c := certs(t, "rci")
	api := &flakyAPI{AgentServer: agent.NewAPIServer(a)}
	srv, addr, stop := startDPU(t, "127.0.0.1:0", c, api)
	srv.Reps = reps.Reps
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hostCreds(t, c), ServerName: "dpu.test", Name: "host", Netns: hostNS.Path(),
		ProbeInterval: 50 * time.Millisecond, ReconcileMaxDelay: 200 * time.Millisecond, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.Probe(ctx)
	hapi := &hostAPI{h: h}
	at := &apiv1.Attachment{ContainerId: "ctr-outage", Ifname: "eth0"}
	resp, err := hapi.AddEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: at, Netns: podNS.Path()})
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	rep := resp.GetEndpoint().GetInterfaces()[0].GetName()

	// The outage: the DPU's link is down while the pod goes.
	stop()
	h.Probe(ctx)
	if h.Peer().Up {
		t.Fatal("the DPU is down but the peer is up")
	}
	if out, err := exec.Command("ip", "netns", "del", netnstest.Name("rcipod")).CombinedOutput(); err != nil {
		t.Fatalf("delete the pod's netns: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "add", netnstest.Name("rcipod")).Run() }) // for netnstest's cleanup
	dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = hapi.DelEndpoint(dctx, &apiv1.DelEndpointRequest{Attachment: at, Netns: podNS.Path()})
	dcancel()
	if err == nil {
		t.Fatal("CNI DEL succeeded with the DPU down")
	}

	// The DPU comes back; the first reconcile's delete fails.
	api.failDels.Store(1)
	srv2, _, stop2 := startDPU(t, addr, c, api)
	srv2.Reps = reps.Reps
	defer stop2()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		h.Probe(ctx)
		if ids, _ := dp.Endpoints(); len(ids) == 0 && h.Peer().Reconciled == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if api.failed.Load() != 1 {
		t.Fatalf("the injected failure hit %d times, want 1 (the first reconcile)", api.failed.Load())
	}
	if ids, _ := dp.Endpoints(); len(ids) != 0 {
		t.Fatalf("the DPU's datapath still holds endpoints %v: the pod deleted during the outage leaked (peer %+v)", ids, h.Peer())
	}
	list, err := api.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
	if err != nil || len(list.GetEndpoints()) != 0 {
		t.Fatalf("the DPU agent lists %v (%v) after the reconcile", list.GetEndpoints(), err)
	}
	for _, n := range append(linksIn(t, dpuNS), linksIn(t, hostNS)...) {
		if n == rep || n != "lo" {
			t.Errorf("%s left after the reconcile (representor %s)", n, rep)
		}
	}
	if p := h.Peer(); p.ReconcileErr != "" || p.Reconciled != 2 {
		t.Errorf("peer after the retried reconcile: %+v", p)
	}
}
