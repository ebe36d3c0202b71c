package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// upLabCLI brings up a 2-node lab with one pod per node through the built
// CLI and takes it down when the test ends, checking that no lab netns is
// left. It returns what labCLIPath does.
func upLabCLI(t *testing.T) (func(t *testing.T, args ...string) (string, error), string) {
	t.Helper()
	lk, cli := labCLIPath(t)
	t.Cleanup(func() {
		if _, err := lk(t, "lab", "down"); err != nil {
			t.Errorf("cleanup lab down: %v", err)
		}
		if left := listLabNetns(); len(left) > 0 {
			t.Errorf("lab netns left behind: %v", left)
		}
	})
	start := time.Now()
	if _, err := lk(t, "lab", "up", "--nodes", "2", "--pods-per-node", "1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("lab up in %s", time.Since(start).Round(100*time.Millisecond))
	return lk, cli
}

// labCLIPath builds the lanekit CLI and returns a runner for it and its path
// (for background helpers such as tcp-whoami); it skips when not root or
// when the lab's binaries are missing. Run the tests that use it under
// `flock /tmp/lanekit-lab.lock` (the lab is global).
func labCLIPath(t *testing.T) (func(t *testing.T, args ...string) (string, error), string) {
	t.Helper()
	bins := requireLabBins(t, "creates network namespaces", "ip", "iptables-restore", "nsenter", "sysctl")
	binDir := bins.Dir
	if _, err := os.Stat(StateFile); err == nil {
		t.Skip("a lab is up; this test brings up its own (run it under flock /tmp/lanekit-lab.lock with no lab up)")
	}
	cli := CLIForTests(t)
	return func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, cli, args...)
		cmd.Env = append(os.Environ(), "LANEKIT_BIN="+binDir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("lanekit %s:\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
		if err != nil {
			return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
		}
		return stdout.String(), nil
	}, cli
}

func agentStatus(t *testing.T, node int) *apiv1.StatusResponse {
	t.Helper()
	return agentStatusOf(t, AgentSocket(node))
}

// TestLabPods: `lanekit lab pod add` creates pods with Kubernetes identities
// through the CNI path, every agent learns their Pod objects, the local
// agent shows namespace/labels/identity, `pod del` reverses it (twice is
// fine) and `lab down` leaves nothing.
func TestLabPods(t *testing.T) {
	lk, _ := upLabCLI(t)
	out, err := lk(t, "lab", "pod", "add", "web", "--node", "1", "--namespace", "shop", "--labels", "app=web,tier=front", "--port", "http=8080/TCP")
	if err != nil || !strings.Contains(out, "pod shop/web on lk-node1: 10.244.1.") {
		t.Fatalf("pod add web = %v: %s", err, out)
	}
	if _, err := lk(t, "lab", "pod", "add", "client", "--node", "2", "--namespace", "shop", "--labels", "role=client"); err != nil {
		t.Fatal(err)
	}
	if _, err := lk(t, "lab", "pod", "add", "web", "--node", "2"); err == nil || !strings.Contains(err.Error(), "pod web exists") {
		t.Errorf("second pod add web = %v", err)
	}
	if _, err := lk(t, "lab", "pod", "add", "bad", "--node", "1", "--labels", "a b=c"); err == nil || !strings.Contains(err.Error(), "metadata.labels") {
		t.Errorf("pod add with a bad label = %v", err)
	}
	if netnsExists(NamedPodNS("bad")) {
		t.Error("failed pod add left its netns")
	}
	for node := 1; node <= 2; node++ {
		if n := agentStatus(t, node).GetControlPlane().GetObjects()["Pod"]; n != 2 {
			t.Errorf("node %d agent holds %d Pod objects, want 2", node, n)
		}
	}
	out, err = lk(t, "endpoint", "list", "--socket", AgentSocket(1))
	if err != nil || !strings.Contains(out, "shop/web") || !strings.Contains(out, "app=web,tier=front") {
		t.Errorf("endpoint list on node 1 = %v: %s", err, out)
	}
	st, err := LoadState()
	if err != nil || len(st.NamedPods) != 2 {
		t.Fatalf("lab state: %v %+v", err, st)
	}
	web := st.NamedPods[0]
	// The pods reach each other across nodes (the CNI path made them).
	if out, err := inNS(context.Background(), NamedPodNS("client"), append(pingCommand(), "-c", "1", "-W", "2", web.IP)...); err != nil {
		t.Errorf("client -> web ping: %v: %s", err, out)
	}

	for i, want := range []string{"deleted pod web", "no pod web"} {
		if out, err := lk(t, "lab", "pod", "del", "web"); err != nil || !strings.Contains(out, want) {
			t.Errorf("pod del web #%d = %v: %s", i+1, err, out)
		}
	}
	if netnsExists(NamedPodNS("web")) {
		t.Error("pod del left the netns")
	}
	for node := 1; node <= 2; node++ {
		if n := agentStatus(t, node).GetControlPlane().GetObjects()["Pod"]; n != 1 {
			t.Errorf("node %d agent holds %d Pod objects after del, want 1", node, n)
		}
	}
	out, err = lk(t, "endpoint", "list", "--socket", AgentSocket(1))
	if err != nil || strings.Contains(out, "shop/web") {
		t.Errorf("endpoint list on node 1 after del = %v: %s", err, out)
	}
}
