package bench

import (
	"context"
	"strings"
	"testing"
)

func TestOffloadsFromBits(t *testing.T) {
	// Bits 0, 1, 5 (mac), 11 and 32 (version 1) set.
	bits := "11000100000100000000000000000000" + "10000000000000000000000000000000" + "\n"
	got, err := offloadsFromBits(bits)
	if err != nil || got != "csum guest_csum host_tso4" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := offloadsFromBits("0000010000000000"); err != nil || got != "none" {
		t.Fatalf("no offloads: got %q, %v", got, err)
	}
	for _, bad := range []string{"", "cat: can't open", "0101x"} {
		if got, err := offloadsFromBits(bad); err == nil {
			t.Errorf("%q: got %q, want an error", bad, got)
		}
	}
}

// TestGuestOffloads: the bench reads the guest's own file through its
// shell, and a failing read is an error naming the guest.
func TestGuestOffloads(t *testing.T) {
	g := &Guest{Name: "vm1", Shell: catShell{guestFeaturesFile: "1100000000011110\n"}}
	got, err := g.Offloads(context.Background())
	if err != nil || got != "csum guest_csum host_ecn host_tso4 host_tso6 host_ufo" {
		t.Fatalf("got %q, %v", got, err)
	}
	g = &Guest{Name: "vm2", Shell: catShell{}}
	if _, err := g.Offloads(context.Background()); err == nil || !strings.Contains(err.Error(), "vm2") {
		t.Fatalf("missing file: err = %v, want one naming the guest", err)
	}
}

// catShell is a guest whose files are its map: cat of another fails as
// busybox's does.
type catShell map[string]string

func (c catShell) Run(_ context.Context, cmd string) (string, int, error) {
	f, _ := strings.CutPrefix(cmd, "cat ")
	if out, ok := c[f]; ok {
		return out, 0, nil
	}
	return "cat: can't open '" + f + "': No such file or directory\n", 1, nil
}
