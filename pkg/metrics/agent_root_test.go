package metrics

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestScrapeRealAgent runs an agent with the BPF datapath in test
// namespaces, sends known frames between two pods and checks that the
// scraped counters are exactly what the BPF programs counted.
func TestScrapeRealAgent(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBPFFS(t)
	node := netnstest.New(t, "mnode")
	podA := netnstest.New(t, "mpoda")
	podB := netnstest.New(t, "mpodb")
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-metrics-%d", os.Getpid()))
	t.Cleanup(func() { datapath.Unpin(pinDir) })
	stateDir := t.TempDir()

	m := New(Options{Log: quiet()})
	a, err := agent.New(agent.Config{
		StateDir: stateDir, Socket: filepath.Join(stateDir, "agent.sock"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/28"), MTU: 1400, HostNetns: node.Path(),
		BPFDir: pinDir, ServerOptions: []grpc.ServerOption{m.ServerOption()},
	}, quiet())
	if err != nil {
		t.Fatalf("as root the BPF datapath must open: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	if err := m.WithDatapathCheck(PinsLoaded(pinDir)).Watch(a); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runDone })
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr.String() + "/metrics"

	add := func(id string, pod ns.NetNS, name string) *endpoint.Endpoint {
		ep, err := a.Add(agent.AddRequest{Kind: endpoint.KindPod, ContainerID: id, IfName: "eth0", Netns: pod.Path(),
			Labels: map[string]string{"K8S_POD_NAME": name, "K8S_POD_NAMESPACE": "obs"}})
		if err != nil {
			t.Fatalf("add %s: %v", name, err)
		}
		return ep
	}
	epA, epB := add("ca", podA, "a"), add("cb", podB, "b")
	macA, _ := net.ParseMAC(epA.MAC)
	hostA, _ := net.ParseMAC(epA.HostMAC)

	const good, spoofed = 17, 5
	frame := testutil.UDPFrame(hostA, macA, epA.IP.String(), epB.IP.String(), 64, make([]byte, 100))
	testutil.SendFrames(t, podA, "eth0", frame, good)
	bad := testutil.UDPFrame(hostA, macA, "10.99.0.1", epB.IP.String(), 64, make([]byte, 10))
	testutil.SendFrames(t, podA, "eth0", bad, spoofed)

	// One API call over the agent's socket, to see the interceptor at work.
	conn, err := grpc.NewClient("unix://"+filepath.Join(stateDir, "agent.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var statusErr error
	for i := 0; i < 50; i++ { // the server starts in the background
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		_, statusErr = apiv1.NewAgentClient(conn).Status(cctx, &apiv1.StatusRequest{})
		ccancel()
		if statusErr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if statusErr != nil {
		t.Fatalf("status over the agent socket: %v", statusErr)
	}

	labA := map[string]string{"endpoint": "a", "namespace": "obs", "endpoint_id": fmt.Sprint(epA.ID), "kind": "pod"}
	labB := map[string]string{"endpoint": "b", "namespace": "obs", "endpoint_id": fmt.Sprint(epB.ID), "kind": "pod"}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range base {
			out[a] = b
		}
		return out
	}
	// Frames cross the veth through the backlog: wait (bounded) until the
	// last one is counted, then check every value exactly.
	var fams = scrape(t, url)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); fams = scrape(t, url) {
		to, _ := value(t, fams, NamePackets, with(labB, "direction", "to"))
		dr, _ := value(t, fams, NameDrops, with(labA, "reason", "spoofed-ip"))
		if to >= good && dr >= spoofed {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustValue(t, fams, NamePackets, with(labA, "direction", "from"), good)
	mustValue(t, fams, NameBytes, with(labA, "direction", "from"), float64(good*len(frame)))
	mustValue(t, fams, NamePackets, with(labB, "direction", "to"), good)
	mustValue(t, fams, NameBytes, with(labB, "direction", "to"), float64(good*len(frame)))
	mustValue(t, fams, NameDrops, with(labA, "reason", "spoofed-ip"), spoofed)
	mustValue(t, fams, NameEndpoints, map[string]string{"kind": "pod"}, 2)
	mustValue(t, fams, NameAddresses, map[string]string{"state": "allocated"}, 2)
	mustValue(t, fams, NameUp, nil, 1)
	mustValue(t, fams, NameDatapathLoaded, map[string]string{"backend": "bpf"}, 1)
	mustValue(t, fams, NameFeature, map[string]string{"feature": "tcx"}, 1)
	mustValue(t, fams, NameRPCDuration, map[string]string{"method": "Status", "code": "OK"}, 1)

	// The same numbers as the datapath's own API reports.
	c, err := a.Counters(epA.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.FromPackets != good || c.Drops[datapath.DropSpoofedIP] != spoofed {
		t.Errorf("agent counters of a = %+v", c)
	}
	// Pins gone under a running agent: the datapath is reported not loaded.
	if err := datapath.Unpin(pinDir); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, url)
	mustValue(t, fams, NameDatapathLoaded, map[string]string{"backend": "bpf"}, 0)
	mustValue(t, fams, NameUp, nil, 1)
}
