package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/endpoint"
	"github.com/lanekit/lanekit/pkg/k8sobj"
	"github.com/lanekit/lanekit/pkg/netdev"
)

type fakeSource struct {
	eps      []endpoint.Endpoint
	counters map[uint32]datapath.Counters
	st       agent.StatusInfo
	listErr  error
	// backendMetrics is vm2's backend metrics socket.
	backendMetrics string
}

func (f *fakeSource) List() ([]endpoint.Endpoint, error) { return f.eps, f.listErr }

// ListVMs: vm1 runs its backend elsewhere; vm2's backend runs (restarted
// twice), vm3's is between restarts.
func (f *fakeSource) ListVMs() ([]agent.VMInfo, error) {
	withBackend := func(name string) endpoint.Endpoint {
		return endpoint.Endpoint{Kind: endpoint.KindVM, VM: &endpoint.VM{Name: name, Backend: &endpoint.VMBackend{}}}
	}
	return []agent.VMInfo{
		{Endpoint: endpoint.Endpoint{Kind: endpoint.KindVM, VM: &endpoint.VM{Name: "vm1"}}},
		{Endpoint: endpoint.Endpoint{Kind: endpoint.KindVM, VM: &endpoint.VM{Name: "vm2", Backend: &endpoint.VMBackend{MetricsSocket: f.backendMetrics}}},
			Serving: true, HandoverRefused: 3, Backend: &agent.BackendInfo{PID: 42, Restarts: 2}},
		{Endpoint: withBackend("vm3"), Backend: &agent.BackendInfo{Restarts: 5}},
	}, nil
}
func (f *fakeSource) Counters(id uint32) (datapath.Counters, error) {
	c, ok := f.counters[id]
	if !ok {
		return datapath.Counters{}, errors.New("no such endpoint")
	}
	return c, nil
}
func (f *fakeSource) Status() (agent.StatusInfo, error) { return f.st, nil }

func (f *fakeSource) ControlStats() agent.ControlStats {
	return agent.ControlStats{
		Objects:  map[k8sobj.Kind]int{k8sobj.KindService: 2, k8sobj.KindPod: 5},
		Refused:  map[k8sobj.Kind]int{k8sobj.KindService: 1},
		Services: 2, Frontends: 3, FrontendsByScope: map[string]int{"ClusterIP": 2, "NodePort": 1}, Backends: 6,
		Policies: 1, Identities: 4, Rules: 9, PendingSvc: 1, GCRemoved: 11,
		Conntrack: &datapath.ServiceStats{ConntrackEntries: 100, ConntrackCapacity: 1000, ConntrackEvicted: 3, ConntrackFailed: 1, ConntrackCreated: 500, NoBackend: 2},
	}
}

func (f *fakeSource) Policies() ([]agent.PolicyInfo, error) {
	return []agent.PolicyInfo{{Namespace: "shop", Name: "web", Ingress: true, Verdict: datapath.PolicyVerdict{Allowed: 40, Denied: 8}}}, nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newFakeSource() *fakeSource {
	return &fakeSource{
		eps: []endpoint.Endpoint{
			{ID: 3, Kind: endpoint.KindPod, ContainerID: "0123456789abcdef", Labels: map[string]string{"K8S_POD_NAME": "web-1", "K8S_POD_NAMESPACE": "shop"}},
			{ID: 7, Kind: endpoint.KindVM, ContainerID: "vm-x", VM: &endpoint.VM{Name: "vm1"}},
			{ID: 9, Kind: endpoint.KindPod, ContainerID: "fedcba9876543210"},
		},
		counters: map[uint32]datapath.Counters{
			0: {Drops: map[datapath.DropReason]uint64{datapath.DropUnknownEP: 4}},
			3: {FromPackets: 10, FromBytes: 1000, ToPackets: 20, ToBytes: 3000, StackPackets: 2, Drops: map[datapath.DropReason]uint64{datapath.DropSpoofedIP: 5, datapath.DropFIBFailed: 1}},
			7: {FromPackets: 1, FromBytes: 60, Drops: map[datapath.DropReason]uint64{datapath.DropNoSocket: 2}},
			9: {},
		},
		st: agent.StatusInfo{Backend: "bpf", Ready: true, DeviceMode: datapath.ModeVeth, IPsAllocated: 3, IPsCapacity: 254,
			Features: netdev.Features{TCX: netdev.Feature{Supported: true}, AFXDPZeroCopy: netdev.Feature{Unknown: true}}},
	}
}

// scrape fetches /metrics over HTTP and parses it with the Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return fams
}

// value finds the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string, v float64) {
	t.Helper()
	got, ok := value(t, fams, name, want)
	if !ok {
		t.Errorf("%s%v: no sample", name, want)
		return
	}
	if got != v {
		t.Errorf("%s%v = %v, want %v", name, want, got, v)
	}
}

func TestScrapeFakeAgent(t *testing.T) {
	src := newFakeSource()
	// vm2's backend serves its metrics on a unix socket, as lanekit-vhost
	// --metrics-listen does, in a directory of its own uid that no one
	// else may enter (the agent checks both before merging).
	dir := filepath.Join(t.TempDir(), "vm2")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	src.backendMetrics = filepath.Join(dir, "m.sock")
	lis, err := net.Listen("unix", src.backendMetrics)
	if err != nil {
		t.Fatal(err)
	}
	bsrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# HELP lanekit_vhost_rx_packets_total Frames.\n# TYPE lanekit_vhost_rx_packets_total counter\n"+
			"lanekit_vhost_rx_packets_total{vm=\"vm2\",queue=\"0\"} 7\nlanekit_vhost_rx_packets_total{vm=\"vm2\",queue=\"1\"} 9\n")
	})}
	go bsrv.Serve(lis)
	defer bsrv.Close()
	m := New(Options{Log: quiet()})
	loadedErr := error(nil)
	m.WithDatapathCheck(func() error { return loadedErr })
	if err := m.Watch(src); err != nil {
		t.Fatal(err)
	}
	// One API call through the interceptor, as the gRPC server would make it.
	_, err = m.UnaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/lanekit.v1.Agent/AddEndpoint"},
		func(context.Context, any) (any, error) { return nil, status.Error(codes.ResourceExhausted, "full") })
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("interceptor changed the error: %v", err)
	}
	m.ObserveStartup(1500 * time.Millisecond)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams := scrape(t, srv.URL)

	web := map[string]string{"endpoint": "web-1", "namespace": "shop", "endpoint_id": "3", "kind": "pod"}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range base {
			out[a] = b
		}
		return out
	}
	mustValue(t, fams, NamePackets, with(web, "direction", "from"), 10)
	mustValue(t, fams, NamePackets, with(web, "direction", "to"), 20)
	mustValue(t, fams, NameBytes, with(web, "direction", "from"), 1000)
	mustValue(t, fams, NameBytes, with(web, "direction", "to"), 3000)
	mustValue(t, fams, NameStackFallback, web, 2)
	mustValue(t, fams, NameDrops, with(web, "reason", "spoofed-ip"), 5)
	mustValue(t, fams, NameDrops, with(web, "reason", "fib-failed"), 1)
	mustValue(t, fams, NameDrops, map[string]string{"endpoint": "vm1", "kind": "vm", "reason": "vm-socket-missing"}, 2)
	mustValue(t, fams, NamePackets, map[string]string{"endpoint": "fedcba987654", "namespace": "", "direction": "from"}, 0)
	mustValue(t, fams, NameUnattributed, map[string]string{"reason": "unknown-endpoint"}, 4)
	mustValue(t, fams, NameEndpoints, map[string]string{"kind": "pod"}, 2)
	mustValue(t, fams, NameEndpoints, map[string]string{"kind": "vm"}, 1)
	mustValue(t, fams, NameAddresses, map[string]string{"state": "allocated"}, 3)
	mustValue(t, fams, NameAddresses, map[string]string{"state": "capacity"}, 254)
	mustValue(t, fams, NameUp, nil, 1)
	mustValue(t, fams, NameStartup, nil, 1.5)
	mustValue(t, fams, NameDatapathLoaded, map[string]string{"backend": "bpf"}, 1)
	mustValue(t, fams, NameDeviceMode, map[string]string{"mode": "veth"}, 1)
	mustValue(t, fams, NameFeature, map[string]string{"feature": "tcx"}, 1)
	mustValue(t, fams, NameFeature, map[string]string{"feature": "netkit"}, 0)
	if v, ok := value(t, fams, NameFeature, map[string]string{"feature": "af_xdp_zerocopy"}); ok {
		t.Errorf("undecided feature exported as %v", v)
	}
	mustValue(t, fams, NameRPCDuration, map[string]string{"method": "AddEndpoint", "code": "ResourceExhausted"}, 1)
	// Services, policy and conntrack.
	mustValue(t, fams, NameServiceFrontends, map[string]string{"scope": "ClusterIP"}, 2)
	mustValue(t, fams, NameServiceFrontends, map[string]string{"scope": "NodePort"}, 1)
	mustValue(t, fams, NameServiceBackends, nil, 6)
	mustValue(t, fams, NameServiceObjects, map[string]string{"kind": "Pod"}, 5)
	mustValue(t, fams, NameServiceObjects, map[string]string{"kind": "NetworkPolicy"}, 0)
	mustValue(t, fams, NameObjectsRefused, map[string]string{"kind": "Service"}, 1)
	mustValue(t, fams, NameObjectsRefused, map[string]string{"kind": "Pod"}, 0)
	mustValue(t, fams, NameServiceLBEvents, map[string]string{"event": "no-backend"}, 2)
	mustValue(t, fams, NamePendingUpdates, nil, 1)
	mustValue(t, fams, NamePolicies, nil, 1)
	mustValue(t, fams, NamePolicyIdentities, nil, 4)
	mustValue(t, fams, NamePolicyRules, nil, 9)
	mustValue(t, fams, NamePolicyVerdicts, map[string]string{"policy_namespace": "shop", "policy": "web", "verdict": "allowed"}, 40)
	mustValue(t, fams, NamePolicyVerdicts, map[string]string{"policy_namespace": "shop", "policy": "web", "verdict": "denied"}, 8)
	mustValue(t, fams, NamePolicyPending, nil, 0)
	mustValue(t, fams, NameConntrackEntries, nil, 100)
	mustValue(t, fams, NameConntrackCapacity, nil, 1000)
	mustValue(t, fams, NameConntrackEvicted, nil, 3)
	mustValue(t, fams, NameConntrackFailed, nil, 1)
	mustValue(t, fams, NameConntrackCreated, nil, 500)
	mustValue(t, fams, NameConntrackGC, nil, 11)
	mustValue(t, fams, NameVMBackendUp, map[string]string{"vm": "vm2"}, 1)
	// The backend's own metrics come through the agent's endpoint.
	mustValue(t, fams, "lanekit_vhost_rx_packets_total", map[string]string{"vm": "vm2", "queue": "1"}, 9)
	mustValue(t, fams, NameVMBackendRestarts, map[string]string{"vm": "vm2"}, 2)
	mustValue(t, fams, NameVMHandoverRefused, map[string]string{"vm": "vm2"}, 3)
	mustValue(t, fams, NameVMBackendUp, map[string]string{"vm": "vm3"}, 0)
	mustValue(t, fams, NameVMBackendRestarts, map[string]string{"vm": "vm3"}, 5)
	if _, ok := value(t, fams, NameVMBackendUp, map[string]string{"vm": "vm1"}); ok {
		t.Error("a VM whose backend the agent does not run has a backend metric")
	}
	if f := fams[NamePackets]; f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("%s is %s, want a counter", NamePackets, f.GetType())
	}

	// A broken datapath and a failing agent show up as 0, not as a failed scrape.
	loadedErr = errors.New("pins gone")
	src.listErr = errors.New("store closed")
	fams = scrape(t, srv.URL)
	mustValue(t, fams, NameDatapathLoaded, map[string]string{"backend": "bpf"}, 0)
	mustValue(t, fams, NameUp, nil, 0)
}

func TestMethodName(t *testing.T) {
	if got := methodName("/lanekit.v1.Agent/DelEndpoint"); got != "DelEndpoint" {
		t.Errorf("methodName = %q", got)
	}
}

// TestHealthAndReadiness checks the DaemonSet probes: /healthz while the
// process serves, /readyz following the agent's Ready.
func TestHealthAndReadiness(t *testing.T) {
	src := newFakeSource()
	m := New(Options{Log: quiet()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no agent") {
		t.Errorf("/readyz before Watch = %d %q, want 503", code, body)
	}
	if err := m.Watch(src); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz of a ready agent = %d %q", code, body)
	}
	src.st.Ready, src.st.NotReadyReason = false, "uplink program detached"
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "uplink program detached") {
		t.Errorf("/readyz of a not-ready agent = %d %q, want 503 with the reason", code, body)
	}
}
