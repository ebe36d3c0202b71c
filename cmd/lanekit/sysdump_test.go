package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// fakeAgent serves the Agent API on a unix socket: Status answers ready
// once ready is set (with reason otherwise); ListServices fails.
type fakeAgent struct {
	apiv1.UnimplementedAgentServer
	ready atomic.Bool
}

func (f *fakeAgent) Status(context.Context, *apiv1.StatusRequest) (*apiv1.StatusResponse, error) {
	if !f.ready.Load() {
		return &apiv1.StatusResponse{Version: "fake", Reason: "k8s caches synced: not yet"}, nil
	}
	return &apiv1.StatusResponse{Version: "fake", Ready: true, PodCidr: "10.244.9.0/24", EndpointCount: 3}, nil
}

func (f *fakeAgent) ListEndpoints(context.Context, *apiv1.ListEndpointsRequest) (*apiv1.ListEndpointsResponse, error) {
	return &apiv1.ListEndpointsResponse{Endpoints: []*apiv1.Endpoint{{Id: 7, Netns: "/run/netns/fake-pod"}}}, nil
}

func serveFakeAgent(t *testing.T, path string, f *fakeAgent) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	apiv1.RegisterAgentServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
}

func readArchive(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		_, name, _ := strings.Cut(h.Name, "/")
		out[name] = string(data)
	}
}

// A sysdump against a fake agent: the answers it gives are in the archive,
// the calls that fail (ListServices, unimplemented; no pinned maps; a log
// glob matching nothing) are recorded with their errors and the rest is
// still there.
func TestSysdumpFakeAgent(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	f := &fakeAgent{}
	f.ready.Store(true)
	serveFakeAgent(t, sock, f)
	if err := os.WriteFile(filepath.Join(dir, "agent.log"), []byte("old line\n"+`{"msg":"agent started"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agentSocket = sock
	sysdumpOpts.bpfDir = filepath.Join(dir, "no-bpffs")
	sysdumpOpts.logs = []string{filepath.Join(dir, "*.log"), filepath.Join(dir, "absent", "*.log")}
	sysdumpOpts.logBytes = 24
	out := filepath.Join(dir, "dump.tar.gz")
	failed, err := writeSysdump(context.Background(), out, sysdumpParts())
	if err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, out)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	t.Logf("archive: %v; failed %v", names, failed)
	if s := files["agent/status.json"]; !strings.Contains(s, "10.244.9.0/24") || !strings.Contains(s, `"ready"`) {
		t.Errorf("agent/status.json = %q", s)
	}
	if s := files["agent/endpoints.json"]; !strings.Contains(s, "/run/netns/fake-pod") {
		t.Errorf("agent/endpoints.json = %q", s)
	}
	if s := files["agent/services.json.error"]; !strings.Contains(s, "Unimplemented") {
		t.Errorf("agent/services.json.error = %q, want the call's error", s)
	}
	if s := files["maps.txt.error"]; !strings.Contains(s, "no-bpffs") {
		t.Errorf("maps.txt.error = %q", s)
	}
	logName := strings.ReplaceAll(strings.TrimPrefix(filepath.Join(dir, "agent.log"), "/"), "/", "_")
	if s := files["logs/"+logName]; s != `{"msg":"agent started"}`+"\n" {
		t.Errorf("log tail %q, want the last 24 bytes", s)
	}
	if s := files["status.txt"]; !strings.Contains(s, "pod CIDR:     10.244.9.0/24") {
		t.Errorf("status.txt = %q", s)
	}
	if _, ok := files["versions.txt"]; !ok {
		t.Error("no versions.txt")
	}
	if _, ok := files["node-check.txt"]; !ok {
		if _, ok := files["node-check.txt.error"]; !ok {
			t.Error("node check neither dumped nor recorded as failed")
		}
	}
	for _, want := range []string{"agent/services.json", "agent/policies.json", "maps.txt"} {
		found := false
		for _, f := range failed {
			found = found || f == want
		}
		if !found {
			t.Errorf("failed parts %v lack %s", failed, want)
		}
	}
}

// status --wait against an agent whose socket appears late and that is
// not ready at first: it waits, says for what, and returns once ready;
// with a deadline before readiness it fails naming the last reason.
func TestStatusWaitLateSocket(t *testing.T) {
	dir := t.TempDir()
	agentSocket = filepath.Join(dir, "agent.sock")
	f := &fakeAgent{}
	go func() {
		time.Sleep(700 * time.Millisecond)
		serveFakeAgent(t, agentSocket, f)
		time.Sleep(1500 * time.Millisecond)
		f.ready.Store(true)
	}()
	var out bytes.Buffer
	start := time.Now()
	if err := waitAgentReady(context.Background(), &out, 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	took := time.Since(start)
	for _, want := range []string{"does not exist yet", "not ready: k8s caches synced: not yet", "is ready"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if took < 2*time.Second {
		t.Errorf("returned after %s, before the agent was ready", took)
	}

	f.ready.Store(false)
	out.Reset()
	err := waitAgentReady(context.Background(), &out, 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "k8s caches synced") {
		t.Errorf("waiting on a never-ready agent: %v, want the reason", err)
	}
}
