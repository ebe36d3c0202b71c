package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nodeBins returns the directory of scripts/k8s-node-bins.sh, or skips when
// the binaries the test needs are not built (they are opt-in).
func nodeBins(t *testing.T, need ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "scripts/k8s-node-bins.sh"), "dir").Output()
	if err != nil {
		t.Fatalf("scripts/k8s-node-bins.sh dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			if os.Getenv("LANEKIT_K8S_NODE_REQUIRED") != "" { // make test-real-nodes
				t.Fatalf("node binaries not built (LANEKIT_K8S_NODE_REQUIRED is set): %v", err)
			}
			t.Skipf("node binaries not built (opt-in: make k8s-lab-bins or k8s-node-bins): %v", err)
		}
	}
	return dir
}

// containerd is a throwaway containerd: its own root, state, socket and
// config under a temporary directory, no CRI, NRI or /opt plugin, in a
// private mount namespace with a tmpfs /run (its shims put their sockets in
// /run/containerd/s).
//
// ctr runs in that namespace too (nsenter), so its FIFOs and image mounts stay
// there and vanish with it; the test reads mounted files through
// /proc/PID/root.
type containerd struct {
	bins, sock string
	pid        int
}

func startContainerd(t *testing.T, bins string) *containerd {
	t.Helper()
	d := t.TempDir()
	c := &containerd{bins: bins, sock: filepath.Join(d, "containerd.sock")}
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
  "io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.sock, c.sock+".ttrpc")
	cfgFile := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs tmpfs /run && exec "$0" --config "$1" --log-level warn`,
		filepath.Join(bins, "containerd"), cfgFile)
	cmd.Env = append(os.Environ(), "PATH="+bins+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.pid = cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		killShims(t, c.sock)
		if t.Failed() {
			t.Logf("containerd log:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := c.command("version").Run(); err == nil {
			return c
		}
		select {
		case err := <-done:
			t.Fatalf("containerd exited: %v\n%s", err, log.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not serving on %s after 30 s\n%s", c.sock, log.String())
		}
	}
}

// killShims kills the shims containerd started for sock that outlived it (a
// failed test's container): they name the socket on their command line.
func killShims(t *testing.T, sock string) {
	pids, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range pids {
		cmdline, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(cmdline, []byte(sock)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(f, "/proc/%d/cmdline", &pid); err == nil {
			t.Logf("killing leftover %q (pid %d)", bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// command is ctr with args in containerd's mount namespace.
func (c *containerd) command(args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.pid), "--",
		filepath.Join(c.bins, "ctr"), "--address", c.sock}, args...)...)
}

// path is p as containerd's mount namespace sees it.
func (c *containerd) path(p string) string { return fmt.Sprintf("/proc/%d/root%s", c.pid, p) }

// ctr runs ctr against c in the k8s.io namespace (kubelet's) and returns stdout.
func (c *containerd) ctr(t *testing.T, args ...string) string {
	t.Helper()
	cmd := c.command(append([]string{"--namespace", "k8s.io"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ctr %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// TestCtrImport imports the archives into a throwaway containerd the way the
// lab's nodes will (ctr images import, unpacked into overlayfs), then mounts
// each image and reads its files through the snapshotter: the real pause
// binary, and the agent image's base and top layers.
func TestCtrImport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd unpacks layers with the owners and modes in the image")
	}
	bins := nodeBins(t, "containerd", "ctr", "pause")
	in := fakeInputs(t)
	pause, err := os.ReadFile(filepath.Join(bins, "pause"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in.NodeBins, "pause"), pause, 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := run(out, in, []string{"pause", "agent"}); err != nil {
		t.Fatal(err)
	}
	c := startContainerd(t, bins)
	for _, n := range []string{"pause", "agent"} {
		c.ctr(t, "images", "import", "--digests", filepath.Join(out, n+".tar"))
	}
	listed := c.ctr(t, "images", "list", "--quiet")
	for _, tag := range []string{pauseImage, agentImage} {
		if !strings.Contains(listed, tag+"\n") {
			t.Errorf("ctr images list lacks %s:\n%s", tag, listed)
		}
	}
	checks := []struct {
		tag   string
		files map[string]string // path in the image -> content
		mode  map[string]os.FileMode
	}{
		{pauseImage, map[string]string{"pause": string(pause)}, map[string]os.FileMode{"pause": 0o755}},
		{agentImage, map[string]string{"etc/os-release": "slim", "opt/lanekit/bin/lanekitd": "bin/lanekitd",
			"opt/lanekit/bin/lanekit-vhost": "bin/lanekit-vhost"},
			map[string]os.FileMode{"opt/lanekit/bin/lanekit-cni": 0o755, "opt/lanekit/bin": os.ModeDir | 0o755}},
	}
	for i, ck := range checks {
		mnt := filepath.Join(t.TempDir(), fmt.Sprint("m", i))
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		c.ctr(t, "images", "mount", ck.tag, mnt)
		for p, want := range ck.files {
			if got, err := os.ReadFile(c.path(filepath.Join(mnt, p))); err != nil || string(got) != want {
				t.Errorf("%s: %s = %.40q, %v; want %.40q", ck.tag, p, got, err, want)
			}
		}
		for p, want := range ck.mode {
			st, err := os.Lstat(c.path(filepath.Join(mnt, p)))
			if err != nil {
				t.Errorf("%s: %v", ck.tag, err)
			} else if st.Mode() != want {
				t.Errorf("%s: %s mode %v, want %v", ck.tag, p, st.Mode(), want)
			}
		}
		c.ctr(t, "images", "unmount", "--rm", mnt)
	}
	// The image runs: runc starts the pause binary from the unpacked rootfs.
	// A one-level relative cgroup path nests under our own cgroup and is
	// removed with the container.
	cg := fmt.Sprintf("lkimages-test-%d", os.Getpid())
	got := c.ctr(t, "run", "--rm", "--cgroup", cg, pauseImage, cg, "/pause", "-v")
	if !strings.HasPrefix(got, "pause.c v") {
		t.Errorf("pause -v in the pause image printed %q", got)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/" + cg); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
}
