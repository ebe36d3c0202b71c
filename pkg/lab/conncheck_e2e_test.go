package lab_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/lanekit/lanekit/api/v1"
	"github.com/lanekit/lanekit/internal/k8stest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/lab"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if dir == filepath.Dir(dir) {
			t.Fatal("go.mod not found")
		}
	}
}

// TestConnectivityLab (pkg/conncheck's command against the lab; an external
// test package of pkg/lab so that it runs under pkg/lab's TestMain, which
// holds the lab lock, instead of a second package waiting on that lock) runs the built CLI's `connectivity test --lab` on a
// 2-node `lab up --k8s`: every check passes and the namespace is gone
// afterwards; then with a deny-all NetworkPolicy slipped into the test's
// namespace as soon as it exists, the pod-to-pod checks fail and the
// command exits non-zero (a check that cannot fail would pass here).
func TestConnectivityLab(t *testing.T) {
	testutil.RequireRoot(t)
	lab.LockForTests()
	k8stest.RequireBins(t)
	testutil.RequireTools(t, "ip", "iptables-restore", "nsenter")
	root := repoRoot(t)
	binDir := os.Getenv("LANEKIT_BIN")
	if binDir == "" {
		binDir = filepath.Join(root, "bin")
	}
	for _, b := range []string{"lanekitd", "lanekit-cni"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			testutil.MissingDep(t, "%s: %v (make build)", b, err)
		}
	}
	cli := lab.CLIForTests(t)
	// pkg/lab's TestMain holds the lab lock.
	lk := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cli, args...)
		cmd.Env = append(os.Environ(), "LANEKIT_BIN="+binDir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := os.Stat(lab.StateFile); err == nil {
		t.Skip("a lab is up (left by a hand run?); this test brings up its own: lanekit lab down first")
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if out, err := lk(dctx, "lab", "down"); err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	if out, err := lk(ctx, "lab", "up", "--k8s", "--nodes", "2", "--pods-per-node", "1"); err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	t.Logf("lab up in %s", time.Since(start).Round(100*time.Millisecond))
	_, c, err := lab.K8s()
	if err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	stopPoll := watchDenied(ctx, "deny-all")
	out, err := lk(ctx, "connectivity", "test", "--lab", "--timeout", "10s")
	ownDeny := stopPoll()
	t.Logf("connectivity test (%s):\n%s", time.Since(start).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("connectivity test on a healthy lab: %v", err)
	}
	// Its deny check was refused by its deny-all policy on the server's
	// node (server-2, node 2), not by anything else.
	if ownDeny[2] == 0 {
		t.Errorf("node 2 agent denied no packet under lanekit-conncheck/deny-all during the deny check")
	}
	for _, want := range []string{
		`pod-to-pod \(same node\)\s+pass`, `pod-to-pod \(across nodes\)\s+pass`, `pod-to-service \(ClusterIP\)\s+pass`,
		`pod-to-service \(NodePort lk-node1\)\s+pass`, `pod-to-service \(NodePort lk-node2\)\s+pass`,
		`host-to-service \(ClusterIP\)\s+pass`, `policy: deny \(client -> server\)\s+pass`,
		`dns\s+skip\s+no kube-dns`, `10 passed, 0 failed, 1 skipped`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, "lanekit-conncheck", metav1.GetOptions{}); err == nil {
		t.Error("namespace lanekit-conncheck left after the run")
	}
	// Nothing of it either (the lab has no namespace controller that
	// would delete what a finalized namespace still holds).
	if l, err := c.CoreV1().Services("lanekit-conncheck").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) > 0 {
		t.Errorf("services left in lanekit-conncheck: %d (%v)", len(l.Items), err)
	}

	// Broken: a deny-all ingress policy in the namespace from its start.
	denied := make(chan error, 1)
	go func() {
		deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "test-deny-all"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		for ctx.Err() == nil {
			if _, err := c.NetworkingV1().NetworkPolicies("lanekit-conncheck").Create(ctx, deny, metav1.CreateOptions{}); err == nil {
				denied <- nil
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		denied <- fmt.Errorf("namespace never appeared")
	}()
	// The path: the agents' verdict counters for that policy (read while
	// it exists: the clean-up removes it).
	stopPoll = watchDenied(ctx, "test-deny-all")
	out, err = lk(ctx, "connectivity", "test", "--lab", "--timeout", "2s")
	deniedMax := stopPoll()
	t.Logf("connectivity test with a deny-all policy:\n%s", out)
	if derr := <-denied; derr != nil {
		t.Fatal(derr)
	}
	for i := 1; i <= 2; i++ {
		if deniedMax[i] == 0 {
			t.Errorf("node %d agent: no packet denied by lanekit-conncheck/test-deny-all (the probes failed for another reason)", i)
		}
	}
	t.Logf("denied by test-deny-all: node 1 %d, node 2 %d packets", deniedMax[1], deniedMax[2])
	if err == nil {
		t.Fatal("connectivity test passed with a deny-all policy in its namespace")
	}
	for _, want := range []string{`pod-to-pod \(same node\)\s+FAIL`, `pod-to-pod \(across nodes\)\s+FAIL`, `checks failed`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("broken run's output lacks %q", want)
		}
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, "lanekit-conncheck", metav1.GetOptions{}); err == nil {
		t.Error("namespace lanekit-conncheck left after the failed run")
	}

	// Interrupted mid-run (its test pods exist): SIGINT, and the namespace
	// is still removed. (Waiting for a later step raced with a fast run:
	// the allow policy lives for well under a second.)
	run := exec.CommandContext(ctx, cli, "connectivity", "test", "--lab", "--timeout", "10s")
	var runOut bytes.Buffer
	run.Stdout, run.Stderr = &runOut, &runOut
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	for {
		if pods, err := c.CoreV1().Pods("lanekit-conncheck").List(ctx, metav1.ListOptions{}); err == nil && len(pods.Items) > 0 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the run ended (%v) before its test pods were seen:\n%s", err, runOut.String())
		case <-ctx.Done():
			_ = run.Process.Signal(syscall.SIGQUIT) // its goroutines, into runOut
			<-exited
			t.Fatalf("the run never made its test pods:\n%s", runOut.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := run.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = <-exited
	t.Logf("interrupted run (%v):\n%s", err, runOut.String())
	if err == nil {
		t.Error("an interrupted run exited 0")
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, "lanekit-conncheck", metav1.GetOptions{}); err == nil {
		t.Error("namespace lanekit-conncheck left after an interrupted run")
	}
	if l, err := c.CoreV1().Pods("lanekit-conncheck").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) > 0 {
		t.Errorf("pods left after an interrupted run: %d (%v)", len(l.Items), err)
	}
}

// watchDenied polls both agents' denied-packet counters of the named
// policy in lanekit-conncheck until the returned stop is called, which
// returns the highest count seen per node.
func watchDenied(ctx context.Context, name string) func() [3]uint64 {
	var max [3]uint64
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for i := 1; i <= 2; i++ {
				if n := policyDenied(ctx, i, "lanekit-conncheck", name); n > max[i] {
					max[i] = n
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() [3]uint64 {
		cancel()
		<-done
		return max
	}
}

// policyDenied is node i's agent's denied-packet count for a policy (0
// when it does not list it).
func policyDenied(ctx context.Context, i int, ns, name string) uint64 {
	conn, err := grpc.NewClient("unix://"+lab.AgentSocket(i), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := apiv1.NewAgentClient(conn).ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
	if err != nil {
		return 0
	}
	for _, p := range resp.GetPolicies() {
		if p.GetNamespace() == ns && p.GetName() == name {
			return p.GetDeniedPackets()
		}
	}
	return 0
}
