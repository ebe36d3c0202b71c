package dpu

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/vf"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeAPI is a DPU agent's API without a datapath: ready, counting calls.
type fakeAPI struct {
	apiv1.UnimplementedAgentServer
	adds int
}

func (f *fakeAPI) Status(context.Context, *apiv1.StatusRequest) (*apiv1.StatusResponse, error) {
	return &apiv1.StatusResponse{Ready: true, PodCidr: "10.244.1.0/24"}, nil
}

func (f *fakeAPI) AddEndpoint(context.Context, *apiv1.AddEndpointRequest) (*apiv1.AddEndpointResponse, error) {
	f.adds++
	return nil, status.Error(codes.Internal, "fake")
}

func (f *fakeAPI) ListEndpoints(context.Context, *apiv1.ListEndpointsRequest) (*apiv1.ListEndpointsResponse, error) {
	return &apiv1.ListEndpointsResponse{}, nil
}

func certs(t *testing.T, name string) CertSet {
	t.Helper()
	c := CertSet{Dir: filepath.Join(t.TempDir(), name)}
	if err := c.WriteCerts("dpu.test", []net.IP{net.IPv4(127, 0, 0, 1)}, "host-"+name, time.Hour); err != nil {
		t.Fatal(err)
	}
	return c
}

// hostID is the host identity of certs(t, name): its host certificate's.
func hostID(c CertSet) string { return "host-" + filepath.Base(c.Dir) }

// hostCreds loads c's host certificates.
func hostCreds(t *testing.T, c CertSet) *Creds {
	t.Helper()
	creds, err := LoadCreds(c.Host(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// startDPU serves a DPU link on addr ("127.0.0.1:0" for any port) until the
// returned stop is called.
func startDPU(t *testing.T, addr string, c CertSet, api apiv1.AgentServer, opts ...func(*Server)) (*Server, string, func()) {
	t.Helper()
	creds, err := LoadCreds(c.DPU(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	for i := 0; i < 50; i++ { // a restart may race the old socket's close
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{API: api, Reps: vf.Veth{}, Node: "dpu-test", Log: quiet(), Creds: creds, HostIdentity: hostID(c)}
	for _, o := range opts {
		o(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.ServeListener(ctx, lis); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(func() { cancel() })
	return s, lis.Addr().String(), stop
}

func hello(t *testing.T, addr string, tc *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = apiv1.NewDPUClient(conn).Hello(ctx, &apiv1.HelloRequest{Host: "h"})
	return err
}

// The link is mutual TLS: the host's certificate from the same CA works;
// one from another CA, none at all, or a host that trusts another CA are
// refused.
func TestLinkMutualTLS(t *testing.T) {
	good, other := certs(t, "good"), certs(t, "other")
	s, addr, _ := startDPU(t, "127.0.0.1:0", good, &fakeAPI{})

	ok, err := ClientTLS(good.Host(), "dpu.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := hello(t, addr, ok); err != nil {
		t.Fatalf("hello with the right certificates: %v", err)
	}
	if loc := s.Location(); !strings.Contains(loc, `certificate "host-good"`) {
		t.Errorf("location %q does not name the host's certificate", loc)
	}

	wrongCA, _ := ClientTLS(other.Host(), "dpu.test") // a cert and trust from another CA
	mixed, _ := ClientTLS(TLSFiles{Cert: other.Host().Cert, Key: other.Host().Key, CA: good.CA()}, "dpu.test")
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ok.RootCAs, ServerName: "dpu.test"}
	for name, tc := range map[string]*tls.Config{"client cert from another CA": mixed, "trusting another CA": wrongCA, "no client cert": noCert} {
		err := hello(t, addr, tc)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if c := status.Code(err); c != codes.Unavailable {
			t.Errorf("%s: code %v (%v), want Unavailable", name, c, err)
		}
	}
	if _, err := ServerTLS(TLSFiles{Cert: good.DPU().Cert, Key: good.DPU().Key}); err == nil {
		t.Error("a server without a CA (no client verification) was configured")
	}
}

// The host agent reconnects with backoff after the DPU agent goes away and
// comes back on the same address, and reconciles when it does; an ADD while
// the DPU is down fails with Unavailable (the CNI plugin's code 11) and
// reaches nothing.
func TestHostReconnects(t *testing.T) {
	c := certs(t, "rc")
	api := &fakeAPI{}
	_, addr, stop := startDPU(t, "127.0.0.1:0", c, api)
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hostCreds(t, c), ServerName: "dpu.test", Name: "host-1", Log: quiet(),
		Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	h.Probe(ctx)
	if p := h.Peer(); !p.Up || p.Reconnects != 1 || p.Reconciled != 1 || p.Hello.GetPodCidr() != "10.244.1.0/24" {
		t.Fatalf("after the first hello: %+v", p)
	}
	stop()
	h.Probe(ctx)
	if p := h.Peer(); p.Up {
		t.Fatalf("DPU stopped but the peer is up: %+v", p)
	}
	netns := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(netns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = (&hostAPI{h: h}).AddEndpoint(ctx, &apiv1.AddEndpointRequest{
		Attachment: &apiv1.Attachment{ContainerId: "c1", Ifname: "eth0"}, Netns: netns})
	if c := status.Code(err); c != codes.Unavailable {
		t.Fatalf("ADD with the DPU down: %v (code %v), want Unavailable", err, c)
	}
	if api.adds != 0 {
		t.Fatalf("the DPU saw %d adds", api.adds)
	}
	_, _, stop2 := startDPU(t, addr, c, api)
	defer stop2()
	deadline := time.Now().Add(10 * time.Second)
	for !h.Peer().Up && time.Now().Before(deadline) {
		h.Probe(ctx)
		time.Sleep(100 * time.Millisecond)
	}
	if p := h.Peer(); !p.Up || p.Reconnects != 2 || p.Reconciled != 2 {
		t.Fatalf("after the DPU came back: %+v", p)
	}
}
