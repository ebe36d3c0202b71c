package xsk

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

// asUID runs a python snippet as uid:uid and returns its output.
func asUID(t *testing.T, uid uint32, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python as uid %d: %v: %s", uid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// fetchPy asks for vm's sockets like a backend and prints the agent's answer.
const fetchPy = `import socket, sys, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(json.dumps({"version": 1, "vm": sys.argv[2]}).encode())
print(json.loads(s.recv(65536)).get("error", ""))`

// TestPeerCredRefusal: a connector running as another VM's backend uid gets
// no sockets even when the socket file's permissions would let it connect
// (SO_PEERCRED is checked, refusals are counted); the VM's own uid passes
// the check (and reaches the provider).
func TestPeerCredRefusal(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: connects as other uids")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testutil.MissingDep(t, "needs /usr/bin/python3")
	}
	dir, err := os.MkdirTemp("", "lk-peercred-") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vm1.sock")
	provided := 0
	srv, err := Listen(path, "vm1", func(Request) ([]*Socket, error) {
		provided++
		return nil, errors.New("provider reached")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const own, other = 200101, 200102
	srv.SetPeerUID(own)
	// A permission mistake must not be enough: only the peer check stands.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if got := asUID(t, other, fetchPy, path, "vm1"); !strings.Contains(got, "peer refused") {
		t.Errorf("uid %d got %q, want a peer refusal", other, got)
	}
	if srv.Refused() != 1 || provided != 0 {
		t.Errorf("refused %d provided %d, want 1 and 0", srv.Refused(), provided)
	}
	if got := asUID(t, own, fetchPy, path, "vm1"); got != "provider reached" {
		t.Errorf("uid %d got %q, want the provider's answer", own, got)
	}
	// Signalling: another uid cannot signal a process of this VM's uid.
	victim := exec.Command("/usr/bin/python3", "-c", "import time; time.sleep(30)")
	victim.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: own, Gid: own, Groups: []uint32{}}}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = victim.Process.Kill(); _ = victim.Wait() }()
	killPy := `import os, sys
try:
    os.kill(int(sys.argv[1]), 0); print("ok")
except PermissionError:
    print("EPERM")`
	if got := asUID(t, other, killPy, strconv.Itoa(victim.Process.Pid)); got != "EPERM" {
		t.Errorf("kill(pid, 0) from uid %d: %s, want EPERM", other, got)
	}
}
