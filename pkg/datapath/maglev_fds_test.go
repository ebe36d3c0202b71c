package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/service"
)

// openFiles is how many file descriptors the process has open.
func openFiles(t *testing.T) uint64 {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return uint64(len(ents))
}

// limitOpenFiles lowers the soft RLIMIT_NOFILE to n until the test ends.
func limitOpenFiles(t *testing.T, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

// newServicesUpdate programs n new ClusterIP services (4 backends each,
// base..base+n-1 in the addresses) into tables and returns the update:
// n new Maglev tables.
func newServicesUpdate(t *testing.T, tables *service.Tables, n, base int) *service.Update {
	t.Helper()
	svcs, eps := scaleObjects(base+n, 4)
	m, err := service.Build(svcs[base:], eps[base:], service.Options{})
	if err != nil {
		t.Fatal(err)
	}
	u := tables.Apply(service.Diff(nil, m))
	if len(u.Maglev) != n {
		t.Fatalf("%d new Maglev tables, want %d", len(u.Maglev), n)
	}
	return u
}

// A first full set creates a Maglev array per frontend, each a file
// descriptor until lk_lb_maglev holds it: installed in batches, an update
// of any size holds at most a batch open, and 1,500 new tables program
// with room for one batch under RLIMIT_NOFILE (all held to one install,
// they ran the 30,000-Service agent out of descriptors). When the kernel
// does refuse, the error carries its errno and the limit, not cilium/ebpf's
// "inner maps not supported".
func TestMaglevTablesBoundOpenFiles(t *testing.T) {
	testutil.RequireBPFFS(t)
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-%d-maglevfds", os.Getpid()))
	t.Cleanup(func() { Unpin(pin) })
	dp, err := Open(Config{PinDir: pin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	tables := service.NewTables()
	u := newServicesUpdate(t, tables, 1500, 0)

	t.Run("batched", func(t *testing.T) {
		const room = 600 // a batch and some
		if maglevInstallBatch > room-64 {
			t.Fatalf("maglevInstallBatch %d: more than this test leaves room for", maglevInstallBatch)
		}
		limitOpenFiles(t, openFiles(t)+room)
		if err := dp.ApplyServices(u); err != nil {
			t.Fatalf("1,500 new Maglev tables with room for %d open files: %v", room, err)
		}
		got, err := dp.DumpServices()
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Maglev) != 1500 || len(got.Services) != 1500 {
			t.Errorf("programmed %s, want 1,500 services with their tables", got)
		}
	})

	t.Run("errno", func(t *testing.T) {
		u := newServicesUpdate(t, tables, 50, 1500)
		limitOpenFiles(t, openFiles(t)+8)
		err := dp.ApplyServices(u)
		if err == nil {
			t.Fatal("50 new Maglev tables with room for 8 open files: no error")
		}
		if !errors.Is(err, unix.EMFILE) || !strings.Contains(err.Error(), "RLIMIT_NOFILE") {
			t.Errorf("error does not say the agent is out of file descriptors: %v", err)
		}
		t.Logf("%v", err)
	})
}
