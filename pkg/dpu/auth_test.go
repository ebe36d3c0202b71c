package dpu

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/pkg/metrics"
	"github.com/lanekit/lanekit/pkg/vf"
)

// oneCA is a CA with a DPU certificate for dpu.test (127.0.0.1) and host
// certificates for host-a and host-b, all in dir.
type oneCA struct {
	ca          *LinkCA
	dpu, a, b   TLSFiles
	caFile, dir string
}

func newOneCA(t *testing.T) *oneCA {
	t.Helper()
	dir := t.TempDir()
	ca, err := NewCA(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	o := &oneCA{ca: ca, dir: dir, caFile: filepath.Join(dir, "ca.pem")}
	files := func(n string) TLSFiles {
		return TLSFiles{Cert: filepath.Join(dir, n+".pem"), Key: filepath.Join(dir, n+"-key.pem"), CA: o.caFile}
	}
	o.dpu, o.a, o.b = files("dpu"), files("host-a"), files("host-b")
	if err := ca.WriteCert(o.caFile); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(o.dpu, "dpu.test", []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		f    TLSFiles
		name string
	}{{o.a, "host-a"}, {o.b, "host-b"}} {
		if err := ca.IssueClient(h.f, h.name, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// serveLink serves a DPU link for host-a with a streaming service (gRPC
// health's Watch) registered beside the DPU and agent services.
func serveLink(t *testing.T, o *oneCA, api apiv1.AgentServer, hostObjects bool) (*Server, string) {
	t.Helper()
	creds, err := LoadCreds(o.dpu, quiet())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{API: api, Reps: vf.Veth{}, Node: "dpu-test", Log: quiet(), Creds: creds, HostIdentity: "host-a", HostObjects: hostObjects,
		register: func(srv *grpc.Server) { healthpb.RegisterHealthServer(srv, health.NewServer()) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.ServeListener(ctx, lis); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, lis.Addr().String()
}

func dial(t *testing.T, addr string, f TLSFiles) *grpc.ClientConn {
	t.Helper()
	tc, err := ClientTLS(f, "dpu.test")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// every unary method of the DPU and Agent services.
func everyMethod() []string {
	var out []string
	for _, sd := range []grpc.ServiceDesc{apiv1.DPU_ServiceDesc, apiv1.Agent_ServiceDesc} {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
	}
	return out
}

// watch opens the health Watch stream and reads its first message.
func watch(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

func wantDenied(t *testing.T, what string, err error, msg string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), msg) {
		t.Errorf("%s: %v, want PermissionDenied with %q", what, err, msg)
	}
}

// A DPU serves one host: a certificate from the same CA that names another
// host is refused on every call, unary and streaming, before the DPU or
// its agent sees it; the right host passes that check, and then only the
// RPCs a host may make go through.
func TestLinkHostIdentity(t *testing.T) {
	o := newOneCA(t)
	api := &fakeAPI{}
	s, addr := serveLink(t, o, api, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	other := dial(t, addr, o.b) // host-b: same CA, another host
	for _, m := range everyMethod() {
		err := other.Invoke(ctx, m, &apiv1.StatusRequest{}, &apiv1.StatusResponse{})
		wantDenied(t, "host-b "+m, err, `this DPU serves host "host-a"`)
	}
	wantDenied(t, "host-b stream", watch(other), `this DPU serves host "host-a"`)
	if api.adds != 0 {
		t.Errorf("the agent saw %d adds from host-b", api.adds)
	}
	if st := s.LinkStatus(); st.GetRefusedCalls() != uint64(len(everyMethod())+1) || !strings.Contains(st.GetLastRefusal(), "host-b") {
		t.Errorf("link status after host-b's calls: %v", st)
	}

	own := dial(t, addr, o.a)
	if _, err := apiv1.NewDPUClient(own).Hello(ctx, &apiv1.HelloRequest{Host: "host-a"}); err != nil {
		t.Fatalf("host-a hello: %v", err)
	}
	if _, err := apiv1.NewAgentClient(own).Status(ctx, &apiv1.StatusRequest{}); err != nil {
		t.Errorf("host-a status: %v", err)
	}
	// What the host must never call directly (auth.go says why).
	refused := []string{
		apiv1.Agent_AddEndpoint_FullMethodName, apiv1.Agent_DelEndpoint_FullMethodName, apiv1.Agent_GC_FullMethodName,
		apiv1.Agent_AddVM_FullMethodName, apiv1.Agent_DelVM_FullMethodName, apiv1.Agent_VMMigrationChanged_FullMethodName,
		apiv1.Agent_SyncEndpointRoutes_FullMethodName, apiv1.Agent_ApplyObjects_FullMethodName, apiv1.Agent_DeleteObject_FullMethodName,
	}
	for _, m := range refused {
		err := own.Invoke(ctx, m, &apiv1.StatusRequest{}, &apiv1.StatusResponse{})
		wantDenied(t, "host-a "+m, err, "not for the host agent to call")
	}
	wantDenied(t, "host-a stream", watch(own), "not for the host agent to call")
	if api.adds != 0 {
		t.Errorf("the agent saw %d raw adds", api.adds)
	}
	// The DPU service's CreateEndpoint is the host's way in (it reaches the
	// agent's AddEndpoint, which the fake fails).
	_, err := apiv1.NewDPUClient(own).CreateEndpoint(ctx, &apiv1.AddEndpointRequest{Attachment: &apiv1.Attachment{ContainerId: "c", Ifname: "eth0"}})
	if status.Code(err) != codes.Internal || api.adds != 1 {
		t.Errorf("host-a CreateEndpoint: %v (adds %d), want the agent's own error", err, api.adds)
	}
	if st := s.LinkStatus(); len(st.GetCertificates()) != 3 || st.GetCertificates()[2].GetWhich() != "peer" ||
		!strings.Contains(st.GetCertificates()[2].GetSubject(), "host-a") {
		t.Errorf("link status does not show host-a as the peer: %v", st.GetCertificates())
	}

	// Without a Kubernetes source the host applies objects (the fake has
	// none: Unimplemented means the call went through).
	_, addr2 := serveLink(t, o, api, true)
	err = dial(t, addr2, o.a).Invoke(ctx, apiv1.Agent_ApplyObjects_FullMethodName, &apiv1.ApplyObjectsRequest{}, &apiv1.ApplyObjectsResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("ApplyObjects with HostObjects: %v, want it to reach the agent", err)
	}
}

// The host checks the DPU's certificate names the DPU it dials: a server
// certificate from the same CA for another name is refused.
func TestLinkDPUIdentity(t *testing.T) {
	o := newOneCA(t)
	wrong := TLSFiles{Cert: filepath.Join(o.dir, "dpu2.pem"), Key: filepath.Join(o.dir, "dpu2-key.pem"), CA: o.caFile}
	if err := o.ca.IssueServer(wrong, "dpu-other", nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	o.dpu = wrong
	_, addr := serveLink(t, o, &fakeAPI{}, false)
	creds, err := LoadCreds(o.a, quiet())
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: creds, ServerName: "dpu.test", Name: "host-a", Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Probe(context.Background())
	if p := h.Peer(); p.Up || !strings.Contains(p.Err, "dpu.test") {
		t.Fatalf("host reached a DPU whose certificate names dpu-other: %+v", p)
	}
}

// Certificates are read again when the files change, without a restart:
// after a rotation to a new CA the running host agent's link moves to the
// new certificates on both sides (the DPU recycles connections) and the
// old CA's host certificate is refused; files that do not load (a key
// others can read) leave the last good ones in use.
func TestLinkCertRotation(t *testing.T) {
	c := certs(t, "rot")
	srv, addr, _ := startDPU(t, "127.0.0.1:0", c, &fakeAPI{}, func(s *Server) { s.MaxConnectionAge = time.Second })
	old := CertSet{Dir: t.TempDir()} // the old host files, kept
	for _, p := range [][2]string{{c.Host().Cert, old.Host().Cert}, {c.Host().Key, old.Host().Key}, {c.CA(), old.CA()}} {
		data, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p[1], data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hc := hostCreds(t, c)
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hc, ServerName: "dpu.test", Name: "h", Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Probe(context.Background())
	before := h.LinkStatus().GetCertificates()
	if !h.Peer().Up || len(before) != 3 {
		t.Fatalf("before the rotation: %+v %v", h.Peer(), before)
	}
	hostBefore := srv.LinkStatus().GetCertificates()[2].GetNotAfterUnix() // the host's, as the DPU saw it

	// Rotate everything to a new CA, certificates valid for 2h now.
	ca, err := NewCA(2 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCert(c.CA()); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(c.DPU(), "dpu.test", []net.IP{net.IPv4(127, 0, 0, 1)}, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueClient(c.Host(), hostID(c), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	rotated := func() bool {
		after, dpuSeen := h.LinkStatus().GetCertificates(), srv.LinkStatus().GetCertificates()
		for i := range after {
			if after[i].GetNotAfterUnix()-before[i].GetNotAfterUnix() < 3000 {
				return false
			}
		}
		return dpuSeen[2].GetNotAfterUnix()-hostBefore >= 3000
	}
	for deadline := time.Now().Add(10 * time.Second); !rotated() && time.Now().Before(deadline); {
		h.Probe(context.Background())
		time.Sleep(100 * time.Millisecond)
	}
	if !rotated() || !h.Peer().Up {
		t.Fatalf("the running link did not move to the rotated certificates: host sees %v, the DPU sees %v (peer %+v)",
			h.LinkStatus().GetCertificates(), srv.LinkStatus().GetCertificates(), h.Peer())
	}
	tc := hc.ClientConfig("dpu.test")
	oldTC, err := ClientTLS(old.Host(), "dpu.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := hello(t, addr, oldTC); status.Code(err) != codes.Unavailable {
		t.Errorf("the old CA's host certificate after the rotation: %v, want refused", err)
	}

	// A bad file: refused with the reason, the link keeps working.
	if err := os.Chmod(c.Host().Key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := hello(t, addr, tc); err != nil {
		t.Errorf("hello with an unreadable-by-policy key file: %v, want the last good key in use", err)
	}
	if e := h.LinkStatus().GetReloadError(); !strings.Contains(e, "readable by group or others") {
		t.Errorf("reload error %q", e)
	}
}

// Keys are written 0600 (also over an older, wider file) and a key file
// group or others can read is refused with a clear error.
func TestLinkKeyMode(t *testing.T) {
	c := CertSet{Dir: t.TempDir()}
	if err := os.WriteFile(c.Host().Key, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteCerts("dpu.test", nil, "h", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{c.Host().Key, c.DPU().Key} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %04o, want 0600", f, fi.Mode().Perm())
		}
	}
	if _, err := LoadCreds(c.Host(), quiet()); err != nil {
		t.Fatalf("0600 key: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604} {
		os.Chmod(c.Host().Key, mode)
		_, err := LoadCreds(c.Host(), quiet())
		if err == nil || !strings.Contains(err.Error(), "readable by group or others") || !strings.Contains(err.Error(), c.Host().Key) {
			t.Errorf("key mode %04o: %v, want refused", mode, err)
		}
	}
}

// `lanekit status` through the host shows the link's certificates: this
// host's, the CA and the DPU's, with their notAfter; both sides export the
// seconds left as lanekit_dpu_cert_expiry_seconds.
func TestLinkStatusExpiry(t *testing.T) {
	c := certs(t, "exp")
	srv, addr, _ := startDPU(t, "127.0.0.1:0", c, &fakeAPI{})
	h, err := NewHost(HostConfig{DPUAddr: addr, Creds: hostCreds(t, c), ServerName: "dpu.test", Name: "h", Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Probe(context.Background())
	st, err := (&hostAPI{h: h}).Status(context.Background(), &apiv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	l := st.GetDpuLink()
	if l.GetRole() != "host" || l.GetPeerIdentity() != "dpu.test" || len(l.GetCertificates()) != 3 {
		t.Fatalf("link status %v", l)
	}
	for _, cert := range l.GetCertificates() {
		left := time.Until(time.Unix(cert.GetNotAfterUnix(), 0))
		if left < 58*time.Minute || left > time.Hour {
			t.Errorf("%s certificate: %s left, want the files' hour", cert.GetWhich(), left)
		}
	}
	if p := l.GetCertificates()[2]; p.GetWhich() != "peer" || !strings.Contains(p.GetSubject(), "dpu.test") {
		t.Errorf("peer certificate %v, want the DPU's", p)
	}

	got := map[string]float64{}
	for _, src := range []metrics.DPULinkSource{h, srv} { // each side's agent has its registry
		m := metrics.New(metrics.Options{Log: quiet()})
		if err := m.WatchDPULink(src); err != nil {
			t.Fatal(err)
		}
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		gauges(fams, got)
	}
	for _, k := range []string{"host/local", "host/ca", "host/peer", "dpu/local", "dpu/ca", "dpu/peer"} {
		if v, ok := got[k]; !ok || v < 3480 || v > 3600 {
			t.Errorf("%s{%s} = %v (present %v), want the hour the files are valid", metrics.NameDPUCertExpiry, k, v, ok)
		}
	}
}

// gauges collects lanekit_dpu_cert_expiry_seconds by "role/cert".
func gauges(fams []*dto.MetricFamily, got map[string]float64) {
	for _, f := range fams {
		if f.GetName() != metrics.NameDPUCertExpiry {
			continue
		}
		for _, mt := range f.GetMetric() {
			var role, cert string
			for _, lp := range mt.GetLabel() {
				switch lp.GetName() {
				case "role":
					role = lp.GetValue()
				case "cert":
					cert = lp.GetValue()
				}
			}
			got[role+"/"+cert] = mt.GetGauge().GetValue()
		}
	}
}

// A connection outlives its handshake: a host certificate that expires
// while the connection is open is refused from then on.
func TestLinkExpiredMidConnection(t *testing.T) {
	o := newOneCA(t)
	if err := o.ca.IssueClient(o.a, "host-a", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	_, addr := serveLink(t, o, &fakeAPI{}, false)
	conn := dial(t, addr, o.a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := apiv1.NewDPUClient(conn).Hello(ctx, &apiv1.HelloRequest{Host: "host-a"}); err != nil {
		t.Fatalf("hello while valid: %v", err)
	}
	time.Sleep(2500 * time.Millisecond)
	_, err := apiv1.NewDPUClient(conn).Hello(ctx, &apiv1.HelloRequest{Host: "host-a"})
	wantDenied(t, "hello after the certificate expired", err, "not now")
}
