package bench

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// The datapath-only programmer loads a set into fresh pinned maps, applies
// the change, and removes its pins.
func TestDatapathProgrammer(t *testing.T) {
	testutil.RequireBPFFS(t)
	set, err := NewSvcSet(1000, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.244.2.1"), netip.MustParseAddr("10.244.2.2")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	d := NewDatapathProgrammer()
	d.PinDir += "-test"
	ctx := context.Background()
	t.Cleanup(d.Close)
	took, err := d.Program(ctx, set, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dump, err := d.dp.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(dump.Services), 999+2; got != want {
		t.Fatalf("%d frontends in the maps, want %d", got, want)
	}
	ch := set.DefaultChange()
	without, _ := set.Without(ch)
	c, err := d.Change(ctx, set, without, ch.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1000 services: program %s, one change %s", took, c)
	if err := d.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.PinDir); !os.IsNotExist(err) {
		t.Errorf("pin dir %s left: %v", d.PinDir, err)
	}
}
