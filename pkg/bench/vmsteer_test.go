package bench

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// steerTable spreads the flows' hash buckets over the queues (flows sharing
// a bucket share a queue) and leaves the other entries round robin.
func TestSteerTable(t *testing.T) {
	// Buckets (h & 127): 5, 5, 9, 17, 33, 65, 70, 100 -> 7 groups, 8 flows.
	hashes := []uint32{5, 128 + 5, 9, 17, 33, 65, 70, 100}
	tab := steerTable(hashes, 4, 128)
	if len(tab) != 128 {
		t.Fatalf("%d entries", len(tab))
	}
	load := make([]int, 4)
	for _, h := range hashes {
		load[tab[h&127]]++
	}
	for q, n := range load {
		if n != 2 {
			t.Fatalf("queue %d gets %d flows (loads %v), want 2 each", q, n, load)
		}
	}
	if tab[1] != 1 || tab[2] != 2 || tab[127] != 3 {
		t.Fatalf("entries without flows are not round robin: %v", tab[:8])
	}
	if b := balance([]uint64{100, 120, 110, 105}); b != 1.2 {
		t.Fatalf("balance %v", b)
	}
	if b := balance([]uint64{100, 0}); b != -1 {
		t.Fatalf("balance with an empty queue %v, want -1", b)
	}
}

// The generator's frames are what the guest's flow names and the pcap say.
func TestSteerFlowsAndPcap(t *testing.T) {
	fs := steerFlows(3, 64)
	if len(fs) != 3 || len(fs[2]) != 64 || flowName(fs[2]) != "udp 10.99.1.1:10002 10.99.0.2:5201" {
		t.Fatalf("flows: %d, %d bytes, %q", len(fs), len(fs[2]), flowName(fs[2]))
	}
	p := filepath.Join(t.TempDir(), "f.pcap")
	if err := writePcap(p, fs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 || len(b) != 24+3*(16+64) {
		t.Fatalf("pcap header/size: %x, %d bytes", b[:24], len(b))
	}
	if rec := b[24+2*(16+64):]; binary.LittleEndian.Uint32(rec[8:]) != 64 || !bytes.Equal(rec[16:], fs[2]) {
		t.Fatal("third record is not the third frame")
	}
}
