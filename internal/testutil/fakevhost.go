package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakeVhost stands in for lanekit-vhost where a test needs the agent's
// backend supervision, not the backend: it listens on --socket (removing a
// stale file first, as lanekit-vhost does) until SIGTERM. With
// --metrics-listen it serves /metrics there as lanekit-vhost does
// (OpenMetrics), lanekit_vhost_tx_packets_total being the number in the file
// FakeVhostTxFile names (0 without it): a test writes it to play the guest's
// first frames; as many acked feature bits as the number in
// FakeVhostAckedFile (0 without it: a device not started), one offered;
// lanekit_vhost_device_running the number in FakeVhostRunningFile (not
// exported without it, as by a backend older than the hand-over).
const fakeVhost = `#!/usr/bin/python3
import http.server, os, signal, socket, socketserver, sys, threading
a = sys.argv[1:]
path = a[a.index("--socket") + 1]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(1)
if "--metrics-listen" in a:
    mpath = a[a.index("--metrics-listen") + 1]
    class H(http.server.BaseHTTPRequestHandler):
        def address_string(self):
            return "unix"
        def log_message(self, *args):
            pass
        def do_GET(self):
            def num(ext):
                try:
                    return int(open(mpath + ext).read().strip() or "0")
                except (FileNotFoundError, ValueError):
                    return 0
            body = "# TYPE lanekit_vhost_virtio_features gauge\n"
            for bit in range(num(".acked")):
                body += 'lanekit_vhost_virtio_features{vm="fake",set="acked",bit="%d"} 1\n' % bit
            body += 'lanekit_vhost_virtio_features{vm="fake",set="offered",bit="0"} 1\n'
            if os.path.exists(mpath + ".running"):
                body += ("# TYPE lanekit_vhost_device_running gauge\n"
                         'lanekit_vhost_device_running{vm="fake"} %d\n' % num(".running"))
            body = (body + "# TYPE lanekit_vhost_tx_packets counter\n"
                    'lanekit_vhost_tx_packets_total{vm="fake",queue="0"} %d\n# EOF\n' % num(".tx")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    try:
        os.unlink(mpath)
    except FileNotFoundError:
        pass
    srv = socketserver.ThreadingUnixStreamServer(mpath, H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
`

// FakeVhostTxFile is the file whose number the fake backend serving metrics
// at sock reports as the frames it moved out of the guest.
func FakeVhostTxFile(sock string) string { return sock + ".tx" }

// FakeVhostAckedFile is the file whose number the fake backend serving
// metrics at sock reports as the count of virtio feature bits acked.
func FakeVhostAckedFile(sock string) string { return sock + ".acked" }

// FakeVhostRunningFile is the file whose number the fake backend serving
// metrics at sock reports as lanekit_vhost_device_running.
func FakeVhostRunningFile(sock string) string { return sock + ".running" }

// FakeVhost writes the fake backend and returns its path; every process of
// it is killed when the test ends (backends outlive their agent by design).
// Needs /usr/bin/python3 (make deps installs it; MissingDep otherwise).
func FakeVhost(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		MissingDep(t, "the fake vhost-user backend needs /usr/bin/python3")
	}
	bin := filepath.Join(t.TempDir(), "fake-vhost")
	if err := os.WriteFile(bin, []byte(fakeVhost), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("pkill", "-KILL", "-f", bin).Run() })
	return bin
}
