package agent

import (
	"testing"

	"github.com/lanekit/lanekit/pkg/datapath"
)

func TestCountersToProto(t *testing.T) {
	pc := CountersToProto(datapath.Counters{FromPackets: 3, FromBytes: 300, ToPackets: 2, ToBytes: 200,
		StackPackets: 1, StackBytes: 1500,
		Drops: map[datapath.DropReason]uint64{datapath.DropSpoofedIP: 4, datapath.DropUnsupported: 1}})
	if pc.GetFromPackets() != 3 || pc.GetFromBytes() != 300 || pc.GetToPackets() != 2 || pc.GetToBytes() != 200 ||
		pc.GetStackPackets() != 1 || pc.GetStackBytes() != 1500 {
		t.Fatalf("counters %+v", pc)
	}
	if pc.GetDrops()["spoofed-ip"] != 4 || pc.GetDrops()["unsupported-l3"] != 1 || len(pc.GetDrops()) != 2 {
		t.Fatalf("drops by reason name: %v", pc.GetDrops())
	}
	if d := CountersToProto(datapath.Counters{}).GetDrops(); d != nil {
		t.Fatalf("no drops must encode as none, got %v", d)
	}
}
