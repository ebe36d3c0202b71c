package datapath

import (
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

func TestProbeFeatures(t *testing.T) {
	testutil.RequireRoot(t)
	f := ProbeFeatures()
	// This project targets kernels with tcx (>= 6.6); the CI machine has 6.18.
	if !f.TCX {
		t.Skipf("skipping: kernel without tcx: %s", f.Notes)
	}
	if !f.BPFFS {
		t.Errorf("bpffs not detected: %s", f.Notes)
	}
}

func TestDropReasonNames(t *testing.T) {
	seen := map[string]DropReason{}
	for r := DropNone; r <= DropNotForVM; r++ {
		n := r.String()
		if n == "unknown" {
			t.Errorf("drop reason %d has no name", r)
		}
		if o, dup := seen[n]; dup {
			t.Errorf("drop reasons %d and %d share the name %q", o, r, n)
		}
		seen[n] = r
	}
}
