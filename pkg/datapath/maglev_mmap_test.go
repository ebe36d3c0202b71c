package datapath

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
	"github.com/lanekit/lanekit/pkg/service"
)

// mappings counts this process's memory mappings (what vm.max_map_count
// bounds).
func mappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

// TestMaglevTablesLeaveNoMappings: writing and dumping 1,500 Maglev tables
// leaves no mapping of theirs behind, even with the garbage collector off.
// Each array used to stay mapped until a collection found its
// ebpf.Memory, and a full set of 100,000 Services passed vm.max_map_count
// (65,530): every mmap failed, the Go runtime's too, and the agent died
// with "fatal error: runtime: out of memory" with gigabytes free.
func TestMaglevTablesLeaveNoMappings(t *testing.T) {
	testutil.RequireBPFFS(t)
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("lk-test-%d-maglevmmap", os.Getpid()))
	t.Cleanup(func() { Unpin(pin) })
	dp, err := Open(Config{PinDir: pin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	u := newServicesUpdate(t, service.NewTables(), 1500, 0)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := mappings(t)
	if err := dp.ApplyServices(u); err != nil {
		t.Fatal(err)
	}
	got, err := dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Maglev) != 1500 {
		t.Fatalf("%d Maglev tables dumped, want 1500", len(got.Maglev))
	}
	for id, want := range u.Maglev {
		if g, want := got.Maglev[id].Table(), want.Table(); len(g) != len(want) || g[0] != want[0] || g[len(g)-1] != want[len(want)-1] {
			t.Fatalf("frontend %d: table read back differs (%d entries, want %d)", id, len(g), len(want))
		}
	}
	if grew := mappings(t) - before; grew > 200 {
		t.Errorf("%d more memory mappings after writing and reading 1,500 tables: the arrays stay mapped", grew)
	}
}
