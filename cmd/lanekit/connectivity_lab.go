//go:build !nolab

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/lanekit/lanekit/internal/nsexec"
	"github.com/lanekit/lanekit/pkg/conncheck"
	"github.com/lanekit/lanekit/pkg/lab"
)

// labConnRuntime runs the connectivity test on `lab up --k8s`: its kubelets
// attach pods as network namespaces and run no containers, so the test
// servers are started in them here and probes run there with `ip netns
// exec`; a hostNetwork probe runs in the node's namespace and cgroup (the
// socket load balancer's). No controller manager runs: the test writes its
// EndpointSlices.
var labConnRuntime = func() (conncheck.Runtime, *rest.Config, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	srv, _, err := lab.K8s() // its client config dials into the lab's underlay
	if err != nil {
		return nil, nil, fmt.Errorf("--lab: %w", err)
	}
	return &labRuntime{self: self}, srv.RESTConfig(), nil
}

type labRuntime struct {
	self    string
	mu      sync.Mutex
	servers []*exec.Cmd
}

// labNode is the lab node index of a Node name.
func labNode(name string) (int, error) {
	for i := 1; i <= 64; i++ {
		if lab.KubeNodeName(i) == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("node %q is not a lab node", name)
}

// where is the pod's netns and, for a hostNetwork pod, the node's cgroup.
func (l *labRuntime) where(pod *corev1.Pod) (netns, cgroup string, err error) {
	i, err := labNode(pod.Spec.NodeName)
	if err != nil {
		return "", "", err
	}
	if pod.Spec.HostNetwork {
		return lab.NodeNS(i), lab.NodeCgroup(i), nil
	}
	return lab.PodNetns(i, pod.UID), "", nil
}

func (l *labRuntime) command(ctx context.Context, pod *corev1.Pod, args []string) (*exec.Cmd, func(), error) {
	ns, cg, err := l.where(pod)
	if err != nil {
		return nil, nil, err
	}
	cmd := nsexec.Command(ctx, ns, append([]string{l.self}, args...)...)
	done := func() {}
	if cg != "" {
		f, err := os.Open(cg)
		if err != nil {
			return nil, nil, fmt.Errorf("node cgroup: %w", err)
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
		done = func() { f.Close() }
	}
	return cmd, done, nil
}

func (l *labRuntime) Exec(ctx context.Context, pod *corev1.Pod, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd, done, err := l.command(ctx, pod, args)
	if err != nil {
		return "", err
	}
	defer done()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Start runs each pod's container command (`lanekit connectivity serve`)
// in its namespace and waits until the echo server answers there.
func (l *labRuntime) Start(ctx context.Context, pods []*corev1.Pod) error {
	for _, p := range pods {
		if p.Spec.HostNetwork {
			continue
		}
		cmd, done, err := l.command(context.WithoutCancel(ctx), p, p.Spec.Containers[0].Command[1:])
		if err != nil {
			return err
		}
		err = cmd.Start()
		done()
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		l.mu.Lock()
		l.servers = append(l.servers, cmd)
		l.mu.Unlock()
		probe := []string{"connectivity", "probe", "echo", fmt.Sprintf("127.0.0.1:%d", conncheck.ServerPort), "--timeout", "1s"}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err := l.Exec(ctx, p, probe)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pod %s: echo server not answering: %w", p.Name, err)
			}
		}
	}
	return nil
}

func (l *labRuntime) HostNetworkPods() bool      { return false }
func (l *labRuntime) WritesEndpointSlices() bool { return true }

// Stop kills the servers' process groups.
func (l *labRuntime) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.servers {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		_ = c.Wait()
	}
	l.servers = nil
}
