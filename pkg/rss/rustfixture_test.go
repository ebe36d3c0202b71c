package rss

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rustFixture is the file lanekit-vhost's frame hash (vhost/src/rss_hash.rs,
// used where no steer_vm computes it: --rx-gso kernel) is held to: one line
// per random frame, "frame-hex types-hex key-hex hash-hex report", the
// answer of this package's model, which TestBPFFrameInputDifferential holds
// to the BPF code.
var rustFixture = filepath.Join("..", "..", "vhost", "testdata", "rss_frames.txt")

// renderRustFixture is the fixture's text: 1,500 random frames (the
// differential test's generator), random enabled types, a random key for
// every third frame (the default key otherwise).
func renderRustFixture() string {
	rng := rand.New(rand.NewPCG(37, 11))
	var b strings.Builder
	b.WriteString("# written by pkg/rss TestRustFixture (LANEKIT_UPDATE_FIXTURES=1): frame types key hash report\n")
	for i := 0; i < 1500; i++ {
		frame := randomFrame(rng)
		types := HashTypes(rng.Uint32()) & AllTypes
		if i%2 == 0 {
			types = AllTypes
		}
		key := DefaultKey
		if i%3 == 0 {
			for j := range key {
				key[j] = byte(rng.Uint32())
			}
		}
		f, r := FrameInput(frame, types)
		var hash uint32
		if r != ReportNone {
			hash = refToeplitz(key, f.Input(r))
		}
		fmt.Fprintf(&b, "%s %x %s %08x %d\n", hex.EncodeToString(frame), uint32(types), hex.EncodeToString(key[:]), hash, r)
	}
	return b.String()
}

// TestRustFixture fails when the fixture is not what the model says (the
// model or the generator changed): rerun with LANEKIT_UPDATE_FIXTURES=1.
func TestRustFixture(t *testing.T) {
	want := renderRustFixture()
	if os.Getenv("LANEKIT_UPDATE_FIXTURES") == "1" {
		if err := os.MkdirAll(filepath.Dir(rustFixture), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(rustFixture, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(rustFixture)
	if err != nil {
		t.Fatalf("%v (write it: LANEKIT_UPDATE_FIXTURES=1 go test ./pkg/rss -run TestRustFixture)", err)
	}
	if string(got) != want {
		t.Fatalf("%s is not the model's answer: rerun with LANEKIT_UPDATE_FIXTURES=1", rustFixture)
	}
}
