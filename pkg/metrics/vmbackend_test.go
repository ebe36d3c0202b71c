package metrics

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/agent"
)

// serveMetrics serves body as /metrics on a unix socket in dir (made with
// mode) and returns the socket's path.
func serveMetrics(t *testing.T, dir string, mode os.FileMode, body string) string {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "metrics.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

const backendText = `# TYPE lanekit_vhost_rx_packets_total counter
lanekit_vhost_rx_packets_total{queue="0",vm="someone-else"} 5
lanekit_vhost_rx_packets_total{queue="1"} 7
`

// TestParseBackendChecks: the agent merges a VM backend's metrics only from
// a socket owned by the VM's uid in a directory no one else can enter, with
// no symbolic link on the way and a server running as that uid; every series
// is labelled with the VM the agent knows, whatever the backend claimed.
func TestParseBackendChecks(t *testing.T) {
	uid := uint32(os.Getuid())
	root := t.TempDir()
	good := serveMetrics(t, filepath.Join(root, "m-good"), 0o700, backendText)
	fams, err := parseBackend(good, uid, "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	f := fams["lanekit_vhost_rx_packets_total"]
	if f == nil || len(f.Metric) != 2 {
		t.Fatalf("parsed %v", fams)
	}
	for _, m := range f.Metric {
		vms := 0
		for _, l := range m.Label {
			if l.GetName() == "vm" {
				vms++
				if l.GetValue() != "vm-a" {
					t.Errorf("series %v keeps the backend's vm label %q", m, l.GetValue())
				}
			}
		}
		if vms != 1 {
			t.Errorf("series %v has %d vm labels, want 1", m, vms)
		}
	}

	open := serveMetrics(t, filepath.Join(root, "m-open"), 0o755, backendText)
	if err := os.Symlink(filepath.Join(root, "m-good"), filepath.Join(root, "m-link")); err != nil {
		t.Fatal(err)
	}
	big := serveMetrics(t, filepath.Join(root, "m-big"), 0o700, backendText+strings.Repeat("# padding\n", agent.BackendMetricsMaxBody/10+1))
	plain := filepath.Join(root, "m-good", "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, sock string
		uid        uint32
		want       string
	}{
		{"directory others can enter", open, uid, "no access for group or others"},
		{"symbolic link to a good directory", filepath.Join(root, "m-link", "metrics.sock"), uid, "symbolic link, want a directory"},
		{"another uid's socket", good, uid + 1, "not owned by the backend's uid"},
		{"an answer over the bound", big, uid, "body over"},
		{"not a socket", plain, uid, "regular file, want a socket"},
	} {
		if _, err := parseBackend(c.sock, c.uid, "vm-a"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}
