package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestReapDeadRuns: a dead run's namespace file and pin directory go, a live
// run's and other names stay.
func TestReapDeadRuns(t *testing.T) {
	root := t.TempDir()
	netns, pins := filepath.Join(root, "netns"), filepath.Join(root, "bpf")
	for _, p := range []string{
		filepath.Join(netns, "lk-vhb-100"), filepath.Join(netns, "lk-vhb-200"), filepath.Join(netns, "lk-vhs-100"),
		filepath.Join(netns, "lk-vhb-x"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"lk-vhb-100/maps", "lk-vhb-200/maps"} {
		if err := os.MkdirAll(filepath.Join(pins, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var deleted []string
	del := func(_ context.Context, ns string) error {
		deleted = append(deleted, ns)
		return os.Remove(filepath.Join(netns, ns))
	}
	alive := func(pid int) bool { return pid == 200 }
	got := reapDeadRunsIn(context.Background(), "lk-vhb-", netns, pins, alive, del)
	want := []string{filepath.Join(netns, "lk-vhb-100"), filepath.Join(pins, "lk-vhb-100")}
	if !slices.Equal(got, want) || !slices.Equal(deleted, []string{"lk-vhb-100"}) {
		t.Fatalf("removed %v (netns del %v), want %v", got, deleted, want)
	}
	for _, keep := range []string{filepath.Join(netns, "lk-vhb-200"), filepath.Join(netns, "lk-vhs-100"),
		filepath.Join(netns, "lk-vhb-x"), filepath.Join(pins, "lk-vhb-200")} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s removed: %v", keep, err)
		}
	}
	if !processAlive(os.Getpid()) {
		t.Error("this process is not alive")
	}
}
