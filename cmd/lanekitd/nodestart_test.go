package main

import (
	"net/netip"
	"testing"

	"github.com/lanekit/lanekit/pkg/ipam"
	"github.com/lanekit/lanekit/pkg/store"
)

// TestStoredNodeFacts: a start without the API server needs what the last
// start took from the Node: the record it keeps, else (a state dir of an
// agent from before the record) the pod CIDRs its address pools recorded;
// nothing for an empty state dir or another node's record.
func TestStoredNodeFacts(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := loadNodeFacts(dir, "n1"); ok || err != nil {
		t.Fatalf("empty state dir: ok %v err %v, want nothing stored", ok, err)
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"10.244.1.0/24", "fd00:10:244:1::/64"} {
		if _, err := ipam.New(st, netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	nf, ok, err := loadNodeFacts(dir, "n1")
	if !ok || err != nil || nf != (nodeFacts{Node: "n1", PodCIDR: "10.244.1.0/24", PodCIDR6: "fd00:10:244:1::/64"}) {
		t.Fatalf("from the pools' records: %+v %v %v", nf, ok, err)
	}
	want := nodeFacts{Node: "n1", PodCIDR: "10.244.1.0/24", Zone: "z1", Uplink: "eth1"}
	if err := saveNodeFacts(dir, want); err != nil {
		t.Fatal(err)
	}
	if nf, ok, err := loadNodeFacts(dir, "n1"); !ok || err != nil || nf != want {
		t.Fatalf("the record: %+v %v %v, want %+v", nf, ok, err, want)
	}
	if nf, ok, err := loadNodeFacts(dir, "n2"); ok || err != nil {
		t.Fatalf("another node's record taken for n2: %+v %v", nf, err)
	}
}
