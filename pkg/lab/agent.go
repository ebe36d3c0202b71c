package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/lanekit/lanekit/internal/labswitch"
	"github.com/lanekit/lanekit/internal/nsexec"
)

// agentArgs are lanekitd's flags for node i; with k8s the pod CIDR comes
// from the node's Node object.
func agentArgs(i int, k8s bool) []string {
	args := []string{
		"--state-dir", NodeDir(i) + "/state",
		"--socket", AgentSocket(i),
		"--uplink", Uplink,
	}
	if k8s {
		args = append(args, "--kubeconfig", Kubeconfig, "--node-name", KubeNodeName(i),
			"--metrics-listen", AgentMetricsAddr(i)) // the scale bench reads the programming latencies (scale.go)
	} else {
		if !labIPv6Only() { // ipv6only.go
			args = append(args, "--pod-cidr", PodCIDR(i))
		}
		args = append(args, labIPv6AgentArgs(i)...) // dual-stack and IPv6-only labs (ipfamily.go)
	}
	return append(append(args,
		"--bpf-dir", BPFDir(i),
		"--cgroup-root", NodeCgroup(i),
		"--vm-socket-dir", NodeDir(i)+"/vm",
		// VM attachments (lab kubelet + NetworkAttachmentDefinition): the
		// pod volumes are the lab kubelets', backends run as nobody.
		"--kubelet-root-dir", KubeletRootDir(),
		"--vhost-user", fmt.Sprintf("%d:%d", backendUser, backendUser),
		// The lab's own kubelets (lab kubelet) have no device plugin API;
		// the default directory is the host's, where a real kubelet of the
		// machine may listen: never register there.
		"--device-plugin-dir", "",
	), labRxGSOArgs()...)
}

// AgentMetricsAddr is where a --k8s lab's agent i serves its metrics: on
// its underlay address, which the host reaches.
func AgentMetricsAddr(i int) string { return net.JoinHostPort(UnderlayIP(i), agentMetricsPort) }

// agentMetricsPort is lanekitd's metrics port, the stand-in lab's and the
// deployed one's (deploy/configmap.yaml's metrics-port).
const agentMetricsPort = "9964"

// startAgent starts lanekitd for node i as a detached daemon inside the node
// netns, writes its pid file and waits until its socket accepts connections.
//
// It enters only the network namespace (nsenter --net): `ip netns exec` also
// remounts /sys, which would hide the host's bpffs at /sys/fs/bpf and so the
// agent's pins.
func startAgent(ctx context.Context, b Bins, i int, k8s bool) (int, error) {
	if err := os.MkdirAll(NodeDir(i)+"/state", 0o755); err != nil {
		return 0, fmt.Errorf("agent dir: %w", err)
	}
	// The agent is a process of its node: in the node's cgroup.
	if err := ensureNodeCgroup(i); err != nil {
		return 0, err
	}
	// startDaemon writes AgentLog(i) and AgentPIDFile(i): base NodeDir(i)/agent.
	pid, err := startAgentDaemon(NodeNS(i), NodeCgroup(i), filepath.Join(NodeDir(i), "agent"), b.Agent(), agentArgsFor(i, k8s))
	if err != nil {
		return pid, fmt.Errorf("start lanekitd on %s: %w", NodeNS(i), err)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return pid, fmt.Errorf("wait for lanekitd on %s: %w", NodeNS(i), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if !alive(pid) {
			return pid, fmt.Errorf("lanekitd on %s exited; log %s: %s", NodeNS(i), AgentLog(i), logTail(AgentLog(i)))
		}
		if c, err := net.DialTimeout("unix", AgentSocket(i), time.Second); err == nil {
			c.Close()
			return pid, nil
		}
	}
	return pid, fmt.Errorf("lanekitd on %s: socket %s not answering after 20s; log: %s", NodeNS(i), AgentSocket(i), logTail(AgentLog(i)))
}

// startAgentDaemon is startDaemonIn for lanekitd with the lab switch on
// (LANEKIT_LAB=1, by env(1), which execs it in place: the pid is the
// agent's): the lab's agents take lanekitd's lab-only flags (--vf-kind veth
// on a DPU, --tunnel-node without an API server), which it refuses
// otherwise (internal/labswitch).
func startAgentDaemon(ns, cgroup, base, lanekitd string, args []string) (int, error) {
	return startDaemonIn(ns, cgroup, base, "env", append([]string{labswitch.Env + "=1", lanekitd}, args...)...)
}

// Process helpers shared with the agent and the test API server.
var (
	alive     = nsexec.Alive
	readPID   = nsexec.ReadPIDFile
	terminate = nsexec.Terminate
)

// logTail returns the last lines of a log for error messages.
func logTail(path string) string { return nsexec.LogTail(path, 5) }
