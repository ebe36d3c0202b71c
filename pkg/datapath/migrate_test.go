package datapath

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/service"
)

// TestMigrateConntrackUnderTraffic: an agent restarted with a bigger
// conntrack table (or an upgrade that resizes a map) starts, resizes the
// pinned table with its flows, and a service connection opened before the
// restart keeps working after it: the backend speaks first after the
// restart, so its packet needs the flow's rev-NAT state from before (a
// reselection on the client's next packet would hide a loss). Before
// migration the agent refused to start until the pins were deleted.
func TestMigrateConntrackUnderTraffic(t *testing.T) {
	e := newLiveEnv(t)
	// web echoes the first line, then hands its side of the connection to
	// the test.
	served := make(chan net.Conn, 1)
	e.in(t, e.pod2, func() {
		ln, err := net.Listen("tcp4", "10.244.1.11:8080")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Write([]byte(line))
			served <- c
		}()
	})
	m := service.NewModel(service.Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("10.77.0.1")}})
	applyYAML(t, e.dp, m, service.NewTables(), svcYAML("web", "10.96.0.40", 80, "TCP", "", "10.244.1.11"))
	var c net.Conn
	var err error
	e.in(t, e.pod1, func() { c, err = net.DialTimeout("tcp4", "10.96.0.40:80", 3*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintln(c, "before")
	if line, err := r.ReadString('\n'); err != nil || line != "before\n" {
		t.Fatalf("echo before the restart: %q %v", line, err)
	}
	var srv net.Conn
	select {
	case srv = <-served:
		defer srv.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the server never handed over its connection")
	}
	before, err := e.dp.pod.LkCt4.Info()
	if err != nil {
		t.Fatal(err)
	}
	// The agent restarts with a conntrack table twice the size.
	e.dp.Close()
	e.dp = nil
	e.in(t, e.node, func() {
		dp, err := Open(Config{PinDir: e.pinDir, Uplink: "lk-lv-up", ConntrackEntries: int(before.MaxEntries) * 2}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatalf("restart with a bigger conntrack table: %v", err)
		}
		e.dp = dp
		for _, ep := range []Endpoint{e.ep1, e.ep2} {
			if err := dp.UpsertEndpoint(ep); err != nil {
				t.Fatal(err)
			}
		}
	})
	after, err := e.dp.pod.LkCt4.Info()
	if err != nil {
		t.Fatal(err)
	}
	if after.MaxEntries != before.MaxEntries*2 {
		t.Fatalf("lk_ct4 holds %d entries, want %d", after.MaxEntries, before.MaxEntries*2)
	}
	// The backend speaks first: its packet must leave as the service's.
	srv.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintln(srv, "after")
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "after\n" {
		t.Fatalf("the service connection did not survive the resize: %q %v", line, err)
	}
	if _, err := os.Stat(filepath.Join(e.pinDir, "lk_ct4_migrating")); !os.IsNotExist(err) {
		t.Errorf("the migration left its temporary pin: %v", err)
	}
}

// TestMigrateLayoutChange: a pinned map of another layout (an upgrade that
// changed a value struct) is replaced by an empty map of the new layout;
// a smaller table keeps what fits.
func TestMigrateLayoutChange(t *testing.T) {
	testutil.RequireBPFFS(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-t-migrate-%d", os.Getpid()))
	t.Cleanup(func() { Unpin(dir) })
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// An "older" lk_policy_ipcache with 8-byte values, and an lk_ct4 too
	// big for the table about to load.
	oldIPCache, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lk_policy_ipcache", Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer oldIPCache.Close()
	if err := oldIPCache.Put(uint32(1), uint64(7)); err != nil {
		t.Fatal(err)
	}
	if err := oldIPCache.Pin(filepath.Join(dir, "lk_policy_ipcache")); err != nil {
		t.Fatal(err)
	}
	spec, err := loadPod()
	if err != nil {
		t.Fatal(err)
	}
	ctSpec := spec.Maps["lk_ct4"].Copy()
	ctSpec.Pinning, ctSpec.MaxEntries = ebpf.PinNone, 64
	oldCT, err := ebpf.NewMap(ctSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer oldCT.Close()
	for i := range 64 {
		if err := oldCT.Put(podCtKey{Saddr: uint32(i + 1), Proto: 6}, podCtEntry{LastSeen: monotonicNow()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := oldCT.Pin(filepath.Join(dir, "lk_ct4")); err != nil {
		t.Fatal(err)
	}
	l, err := Open(Config{PinDir: dir, ConntrackEntries: 32}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open over maps of another shape: %v", err)
	}
	defer l.Close()
	info, _ := l.pod.LkPolicyIpcache.Info()
	if l.pod.LkPolicyIpcache.ValueSize() != 4 {
		t.Fatalf("lk_policy_ipcache has %d-byte values, want the new layout's 4", l.pod.LkPolicyIpcache.ValueSize())
	}
	if n, _ := countEntries(l.pod.LkPolicyIpcache); n != 0 {
		t.Errorf("a map whose layout changed kept %d entries of the old one (%v)", n, info.Name)
	}
	n, _ := countEntries(l.pod.LkCt4)
	if l.pod.LkCt4.MaxEntries() != 32 || n == 0 || n > 32 {
		t.Errorf("shrunk lk_ct4: %d slots holding %d entries, want 32 slots and what fits", l.pod.LkCt4.MaxEntries(), n)
	}
}
