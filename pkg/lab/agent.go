package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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
		args = append(args, "--kubeconfig", Kubeconfig, "--node-name", KubeNodeName(i))
	} else {
		args = append(args, "--pod-cidr", PodCIDR(i))
	}
	return append(args,
		"--bpf-dir", BPFDir(i),
		"--vm-socket-dir", NodeDir(i)+"/vm",
		// VM attachments (lab kubelet + NetworkAttachmentDefinition): the
		// pod volumes are the lab kubelets', backends run as nobody.
		"--kubelet-root-dir", KubeletRootDir(),
		"--vhost-user", fmt.Sprintf("%d:%d", backendUser, backendUser),
	)
}

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
	// startDaemon writes AgentLog(i) and AgentPIDFile(i): base NodeDir(i)/agent.
	pid, err := startDaemon(NodeNS(i), filepath.Join(NodeDir(i), "agent"), b.Agent(), agentArgs(i, k8s)...)
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

// logTail returns the last lines of a log for error messages.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// readPID reads a pid file; 0 when missing or malformed.
func readPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	return pid
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the ")" closing the command name
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// terminate sends SIGTERM, waits up to grace, then SIGKILL.
func terminate(pid int, grace time.Duration) {
	if !alive(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(2 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}
