package datapath

import "testing"

// The drop reasons come from enum lk_drop_reason (bpf2go -type): every one
// has a name, and the Go aliases are the C numbers.
func TestDropReasonsFromC(t *testing.T) {
	for r := DropSpoofedMAC; r <= DropVLAN; r++ {
		if r.String() == "unknown" {
			t.Errorf("drop reason %d has no name", r)
		}
	}
	if DropVLAN != DropReason(podLkDropReasonDROP_VLAN) || metricDropBase != 0x100 {
		t.Errorf("constants do not follow bpf/lib/consts.h")
	}
	if epFlagVM&epFlagL3 != 0 {
		t.Errorf("endpoint flags overlap")
	}
}
