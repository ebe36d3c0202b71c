package datapath

import (
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestDropReasonNames walks enum lk_drop_reason as the compiled object
// declares it (BTF), so a reason added in C is covered without touching
// this test: each has its own name and a counter slot that Counters reads.
func TestDropReasonNames(t *testing.T) {
	spec, err := loadPod()
	if err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("lk_drop_reason", &enum); err != nil {
		t.Fatalf("enum lk_drop_reason in the pod object's BTF: %v", err)
	}
	if len(enum.Values) < 11 {
		t.Fatalf("enum lk_drop_reason has only %d values", len(enum.Values))
	}
	seen := map[string]DropReason{}
	for _, v := range enum.Values {
		r := DropReason(v.Value)
		n := r.String()
		if n == "unknown" {
			t.Errorf("drop reason %s (%d) has no name", v.Name, r)
		}
		if o, dup := seen[n]; dup {
			t.Errorf("drop reasons %d and %d share the name %q", o, r, n)
		}
		seen[n] = r
		if v.Value >= metricDropKinds {
			t.Errorf("drop reason %s (%d) has no counter slot: metricDropKinds is %d", v.Name, v.Value, metricDropKinds)
		}
	}
}
