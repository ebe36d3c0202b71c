package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/lanekit/lanekit/internal/nsexec"
)

// beforeLab runs before anything reads or changes the machine's one lab
// (its namespaces, state, daemons, commands run for it). pkg/lab's tests set
// it to take the global lab lock (LockPath) on first use, so their pure unit
// tests never wait for another lab user.
var beforeLab = func() {}

// run runs a bounded command and returns its stdout; stderr goes into the error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	beforeLab()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ip runs `ip args...`.
func ip(ctx context.Context, args ...string) error {
	_, err := run(ctx, "ip", args...)
	return err
}

// inNS runs a command inside a netns with `ip netns exec`.
func inNS(ctx context.Context, ns string, args ...string) (string, error) {
	return run(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

// nsCommand builds a command in a netns, in its own process group so that
// cancelling kills it and its children.
func nsCommand(ctx context.Context, ns string, args ...string) *exec.Cmd {
	beforeLab()
	return nsexec.Command(ctx, ns, args...)
}

// netnsPath is where `ip netns` mounts a named namespace.
func netnsPath(ns string) string { return "/run/netns/" + ns }

// labNetnsRe matches the namespaces the lab creates: lk-wire, lk-node<i>,
// lk-n<i>-<kind letter><j>, lk-p-<name> (lab pod add). Other lk- namespaces (e.g. the lk-t-* ones of
// other packages' tests) are not the lab's and are left alone.
var labNetnsRe = regexp.MustCompile(`^lk-(wire|node[0-9]+|n[0-9]+-[a-z][0-9]+|n[0-9]+-d[0-9]+-[a-z0-9]+|p-[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`)

// listLabNetns returns the lab's namespaces that exist.
func listLabNetns() []string {
	beforeLab()
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if labNetnsRe.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// netnsExists reports whether a named namespace exists.
func netnsExists(ns string) bool {
	beforeLab()
	_, err := os.Stat(netnsPath(ns))
	return err == nil
}

// addNetns creates a namespace with lo up.
func addNetns(ctx context.Context, ns string) error {
	if err := ip(ctx, "netns", "add", ns); err != nil {
		return err
	}
	return ip(ctx, "-n", ns, "link", "set", "lo", "up")
}

// sysctl sets key=value inside ns.
func sysctl(ctx context.Context, ns, key, value string) error {
	_, err := inNS(ctx, ns, "sysctl", "-q", "-w", key+"="+value)
	return err
}

// podIP reads the IPv4 address of a pod's eth0.
func podIP(ctx context.Context, ns string) string {
	out, err := run(ctx, "ip", "-n", ns, "-4", "-o", "addr", "show", "dev", PodIfName)
	if err != nil {
		return ""
	}
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "inet" {
			addr, _, _ := strings.Cut(f[i+1], "/")
			return addr
		}
	}
	return ""
}
