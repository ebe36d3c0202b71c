package lab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanekit/lanekit/pkg/datapath"
)

// TestCheckImagesAgentDatapath: lab up refuses node images whose agent
// carries other BPF programs than this binary (built before the datapath
// changed: it would run and benchmark the older programs), or that say
// nothing about them; it takes images stamped with this binary's.
func TestCheckImagesAgentDatapath(t *testing.T) {
	b := Bins{Dir: t.TempDir()}
	if err := os.MkdirAll(b.ImagesDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range NodeImages {
		if err := os.WriteFile(filepath.Join(b.ImagesDir(), n+".tar"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stamp := filepath.Join(b.ImagesDir(), AgentDatapathStamp)
	for _, c := range []struct {
		name, stamp string // "": no stamp file
		ok          bool
	}{
		{"no stamp", "", false},
		{"another datapath", "0123456789abcdef\n", false},
		{"this datapath", datapath.ObjectsDigest() + "\n", true},
	} {
		os.Remove(stamp)
		if c.stamp != "" {
			if err := os.WriteFile(stamp, []byte(c.stamp), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		err := b.checkImages()
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "make k8s-node-images")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
