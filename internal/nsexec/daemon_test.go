package nsexec

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// waitLog waits (bounded) for the daemon's last line and returns the log.
func waitLog(t *testing.T, path, last string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), last) {
			return string(b)
		}
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("%s: no %q within 10s:\n%s", path, last, b)
	return ""
}

// A daemon runs in a session of its own, appends stdout and stderr to the
// log and does not get a descriptor the caller inherited without
// close-on-exec (flock(1)'s lock).
func TestStartDaemon(t *testing.T) {
	dir := t.TempDir()
	fd, err := syscall.Open(filepath.Join(dir, "lock"), syscall.O_CREAT|syscall.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	log := filepath.Join(dir, "d.log")
	if err := os.WriteFile(log, []byte("earlier\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Field 6 of /proc/PID/stat is the session id (sh's comm has no spaces).
	cmd, err := StartDaemon("", log, "sh", "-c",
		fmt.Sprintf(`echo "pid $$ sid $(cut -d' ' -f6 /proc/$$/stat)"; echo stderr >&2; test -e /proc/self/fd/%d && echo "fd %d inherited"; echo done`, fd, fd))
	if err != nil {
		t.Fatal(err)
	}
	out := waitLog(t, log, "done")
	pid := cmd.Process.Pid
	for _, want := range []string{"earlier\n", fmt.Sprintf("pid %d sid %d\n", pid, pid), "stderr\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "inherited") {
		t.Errorf("the caller's descriptor reached the daemon:\n%s", out)
	}
}

// With a namespace, the daemon runs inside it (nsenter --net).
func TestStartDaemonNetns(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "nsenter")
	ns := fmt.Sprintf("lk-t-nsexec-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "add", "lkt-ns0", "type", "veth", "peer", "name", "lkt-ns1").CombinedOutput(); err != nil {
		t.Fatalf("veth in %s: %v: %s", ns, err, out)
	}
	log := filepath.Join(t.TempDir(), "d.log")
	if _, err := StartDaemon("/run/netns/"+ns, log, "sh", "-c", "ip -o link show; echo done"); err != nil {
		t.Fatal(err)
	}
	if out := waitLog(t, log, "done"); !strings.Contains(out, "lkt-ns0") {
		t.Errorf("daemon did not run in %s:\n%s", ns, out)
	}
}
