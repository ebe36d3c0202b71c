package datapath

import "testing"

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
