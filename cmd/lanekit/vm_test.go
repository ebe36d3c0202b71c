package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/agent"
	"github.com/lanekit/lanekit/pkg/datapath"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
	"github.com/lanekit/lanekit/pkg/xsk"
	"golang.org/x/sys/unix"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// Flag variables keep their values between Execute calls in one process.
	vmNetns, vmQueues, vmMAC, vmMTU, vmJSON = "", 1, "", 0, false
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&out)
	rootCmd.SetArgs(args)
	err := rootCmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestVMCommands drives `lanekit vm add|list|del` against an in-process agent
// with the memory datapath.
func TestVMCommands(t *testing.T) {
	testutil.RequireRoot(t)
	node := netnstest.New(t, "clinode")
	vmNS := netnstest.New(t, "clivm")
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	a, err := agent.New(agent.Config{
		StateDir: dir, Socket: sock, PodCIDR: netip.MustParsePrefix("10.78.0.0/28"),
		MTU: 1500, OpenDatapath: func(datapath.Config, *slog.Logger) (datapath.Datapath, error) {
			return agenttest.NewMemoryDatapath(), nil
		}, HostNetns: node.Path(), VMSocketDir: filepath.Join(dir, "vm"),
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket did not appear")
		}
	}

	out, err := runCLI(t, "vm", "add", "vm1", "--netns", vmNS.Path(), "--queues", "2", "--json=true", "--socket", sock)
	if err != nil {
		t.Fatalf("vm add: %v: %s", err, out)
	}
	var v vmView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("vm add --json printed %q: %v", out, err)
	}
	if v.Name != "vm1" || v.Address != "10.78.0.1/32" || v.Gateway != "169.254.1.1" || len(v.MAC) != 17 ||
		v.Queues != 2 || v.Socket != filepath.Join(dir, "vm", "vm1.sock") || !v.Serving || v.Netns != vmNS.Path() {
		t.Fatalf("vm add = %+v", v)
	}
	_, fds, err := xsk.Fetch(v.Socket, "vm1", 10*time.Second)
	if err != nil || len(fds) != 4 {
		t.Fatalf("fetch from the printed socket: %d fds, %v", len(fds), err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}

	out, err = runCLI(t, "vm", "add", "vm1", "--netns", vmNS.Path(), "--queues", "1", "--json=false", "--socket", sock)
	if err == nil || !strings.Contains(err.Error(), "AlreadyExists") {
		t.Fatalf("duplicate vm add = %v: %s", err, out)
	}
	if _, err := runCLI(t, "vm", "add", "vm2", "--netns", vmNS.Path(), "--queues", "17", "--socket", sock); err == nil ||
		!strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("vm add --queues 17 = %v", err)
	}
	if _, err := runCLI(t, "vm", "add", "vm2", "--socket", sock); err == nil || !strings.Contains(err.Error(), "--netns is required") {
		t.Fatalf("vm add without --netns = %v", err)
	}

	out, err = runCLI(t, "vm", "list", "--json=false", "--socket", sock)
	if err != nil || !strings.Contains(out, "vm1") || !strings.Contains(out, "10.78.0.1/32") || !strings.Contains(out, v.MAC) {
		t.Fatalf("vm list = %v: %s", err, out)
	}
	out, err = runCLI(t, "vm", "list", "--json=true", "--socket", sock)
	var list struct{ VMs []vmView }
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.VMs) != 1 || list.VMs[0] != v {
		t.Fatalf("vm list --json = %v: %s", err, out)
	}

	if out, err = runCLI(t, "vm", "del", "vm1", "--socket", sock); err != nil || !strings.Contains(out, "deleted vm vm1") {
		t.Fatalf("vm del = %v: %s", err, out)
	}
	if out, err = runCLI(t, "vm", "del", "vm1", "--socket", sock); err != nil || !strings.Contains(out, "no vm vm1") {
		t.Fatalf("second vm del = %v: %s", err, out)
	}
	out, err = runCLI(t, "vm", "list", "--json=true", "--socket", sock)
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.VMs) != 0 {
		t.Fatalf("vm list after del = %v: %s", err, out)
	}
}
