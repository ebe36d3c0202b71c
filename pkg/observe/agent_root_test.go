package observe

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestObserveRealAgent runs an agent with the BPF datapath in test
// namespaces and the Observer service on its socket, sends spoofed frames
// from a pod and reads them back through the gRPC Observe stream, named.
func TestObserveRealAgent(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBPFFS(t)
	node := netnstest.New(t, "onode")
	podA := netnstest.New(t, "opoda")
	podB := netnstest.New(t, "opodb")
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-observe-%d", os.Getpid()))
	t.Cleanup(func() { datapath.Unpin(pinDir) })
	stateDir := t.TempDir()
	sock := filepath.Join(stateDir, "agent.sock")

	var a *agent.Agent
	a, err := agent.New(agent.Config{
		StateDir: stateDir, Socket: sock,
		PodCIDR: netip.MustParsePrefix("10.78.0.0/28"), MTU: 1400, HostNetns: node.Path(),
		BPFDir: pinDir,
		ExtraServices: func(s *grpc.Server) {
			NewServer(NewHub(Options{Open: OpenPinned(pinDir), Endpoints: a, Log: quiet()})).Register(s)
		},
	}, quiet())
	if err != nil {
		t.Fatalf("as root the BPF datapath must open: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runDone })

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

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	var stream grpc.ServerStreamingClient[apiv1.FlowEvent]
	for i := 0; ; i++ { // the server starts in the background
		stream, err = apiv1.NewObserverClient(conn).Observe(sctx, &apiv1.ObserveRequest{Endpoint: "obs/a"})
		if err == nil {
			_, err = stream.Header() // sent once the events are on
		}
		if err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("observe over the agent socket: %v", err)
	}
	events := make(chan *apiv1.FlowEvent, 256)
	go func() {
		defer close(events)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	recv := func() *apiv1.FlowEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("observe stream ended")
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no flow event within 10s")
		}
		return nil
	}

	// Forwarded frames (no sampling asked) and spoofed ones of a known size.
	good := testutil.UDPFrame(hostA, macA, epA.IP.String(), epB.IP.String(), 64, make([]byte, 100))
	bad := testutil.UDPFrame(hostA, macA, "10.99.0.1", epB.IP.String(), 64, make([]byte, 10))
	const spoofed = 5
	testutil.SendFrames(t, podA, "eth0", good, 10)
	testutil.SendFrames(t, podA, "eth0", bad, spoofed)
	for i := 0; i < spoofed; i++ {
		ev := recv()
		if ev.GetEtherType() != unix.ETH_P_IP {
			i-- // the pod's own IPv6 (router solicitations): dropped, reported, not ours
			continue
		}
		want := fmt.Sprintf("DROPPED spoofed-ip obs/a (ep %d) 10.99.0.1:40000 -> %s:5201 UDP %dB on %s",
			epA.ID, epB.IP, len(bad), epA.HostIfName)
		got := fmt.Sprintf("%s %s %s (ep %d) %s:%d -> %s:%d %s %dB on %s",
			map[apiv1.Verdict]string{apiv1.Verdict_VERDICT_DROPPED: "DROPPED"}[ev.GetVerdict()], ev.GetDropReason(),
			ev.GetEndpoint().GetName(), ev.GetEndpoint().GetId(), ev.GetSrcIp(), ev.GetSrcPort(), ev.GetDstIp(), ev.GetDstPort(),
			map[uint32]string{17: "UDP"}[ev.GetIpProtocol()], ev.GetLength(), ev.GetIfname())
		if got != want {
			t.Fatalf("event %d:\n got %s\nwant %s", i, got, want)
		}
		if d := time.Since(time.Unix(0, ev.GetTimeUnixNano())); d < 0 || d > time.Minute {
			t.Errorf("event time %s away from now", d)
		}
	}
	c, err := a.Counters(epA.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Drops[datapath.DropSpoofedIP] != spoofed || c.FromPackets != 10 {
		t.Errorf("counters of a: %+v, want %d spoofed drops and 10 forwarded", c, spoofed)
	}

	// The stream closed, the agent turns the BPF events off again.
	scancel()
	for range events {
	}
	cfg, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "lk_events_cfg"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Close()
	var v [2]uint32
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := cfg.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		if v == [2]uint32{} || time.Now().After(deadline) {
			break
		}
	}
	if v != [2]uint32{} {
		t.Fatalf("events config %v with nobody observing, want off", v)
	}
}
