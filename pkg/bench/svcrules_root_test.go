package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lanekit/lanekit/internal/testutil"
)

// tempNetns creates a throwaway netns for rule loading, removed at cleanup.
func tempNetns(t *testing.T, tag string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads rules into a throwaway netns")
	}
	testutil.RequireTools(t, "ip", "iptables-restore", "iptables-save", "nft")
	ns := fmt.Sprintf("lk-t-svc%s-%d", tag, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}

func nsOutput(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v: %s", args, ns, err, out)
	}
	return string(out)
}

// The generated full and partial syncs load into the kernel for both modes
// and leave exactly the expected DNAT targets; Clear empties the netns.
func TestSvcRulesLoad(t *testing.T) {
	ns := tempNetns(t, "l")
	set, err := NewSvcSet(1000, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.245.2.2"), netip.MustParseAddr("10.245.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	ch := set.DefaultChange()
	without, err := set.Without(ch)
	if err != nil {
		t.Fatal(err)
	}
	gone := set.Services[ch.Service].Endpoints[ch.Endpoint].String() + ":8080"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		mode  string
		dnats func() string
		match string
	}{
		{SvcModeIptables, func() string { return nsOutput(t, ns, "iptables-save", "-t", "nat") }, "-j DNAT --to-destination "},
		{SvcModeNftables, func() string { return nsOutput(t, ns, "nft", "list", "table", "ip", NftTable) }, "dnat to "},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			r := RuleProgrammer{NS: ns, Mode: tc.mode}
			if err := r.Clear(ctx); err != nil {
				t.Fatal(err)
			}
			took, err := r.Program(ctx, set, 5*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			rules := tc.dnats()
			if n := strings.Count(rules, tc.match); n != set.Endpoints() {
				t.Fatalf("%d DNAT rules after the full sync, want %d", n, set.Endpoints())
			}
			d1, err := r.Change(ctx, set, without, ch.Service)
			if err != nil {
				t.Fatal(err)
			}
			rules = tc.dnats()
			if n := strings.Count(rules, tc.match); n != set.Endpoints()-1 || strings.Contains(rules, tc.match+gone+"\n") {
				t.Fatalf("after removing %s: %d DNAT rules (want %d), removed one present: %v", gone, n, set.Endpoints()-1,
					strings.Contains(rules, tc.match+gone+"\n"))
			}
			d2, err := r.Change(ctx, without, set, ch.Service)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(tc.dnats(), tc.match); n != set.Endpoints() {
				t.Fatalf("%d DNAT rules after restoring the endpoint, want %d", n, set.Endpoints())
			}
			t.Logf("%s, 1000 services: full sync %s, one endpoint removed %s, restored %s", tc.mode, took, d1, d2)
			if err := r.Clear(ctx); err != nil {
				t.Fatal(err)
			}
			if out := nsOutput(t, ns, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
				t.Fatalf("rules left after Clear:\n%s", out)
			}
		})
	}
}

// 10,000 services: nft -c and iptables-restore --test accept the full sync.
// iptables-nft needs minutes for it, so this runs only when
// LANEKIT_SVC_10K=1 (as root).
func TestSvcRulesCheck10000(t *testing.T) {
	if os.Getenv("LANEKIT_SVC_10K") != "1" {
		t.Skip("set LANEKIT_SVC_10K=1: checking 10,000 services with iptables-restore --test takes minutes")
	}
	ns := tempNetns(t, "c")
	set, err := NewSvcSet(10000, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.245.2.2"), netip.MustParseAddr("10.245.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	r := RuleProgrammer{NS: ns}
	for _, c := range []struct {
		input string
		argv  []string
	}{
		{set.NftFull(), []string{"nft", "-c", "-f", "-"}},
		{set.IptablesFull(), []string{"iptables-restore", "--test", "--noflush"}},
	} {
		took, err := r.load(ctx, c.input, c.argv...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: 10000 services accepted in %s", strings.Join(c.argv, " "), took)
	}
}

// Loading in chunks (the fallback when one restore takes too long) leaves
// exactly the rules of the one full restore, in the same order.
func TestSvcRulesChunks(t *testing.T) {
	ns := tempNetns(t, "k")
	set, err := NewSvcSet(300, svcUsedPorts, []netip.Addr{netip.MustParseAddr("10.245.2.2"), netip.MustParseAddr("10.245.2.3")},
		netip.MustParsePrefix("10.244.0.0/14"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := RuleProgrammer{NS: ns, Mode: SvcModeIptables}
	save := func() string {
		var keep []string
		for _, l := range strings.Split(nsOutput(t, ns, "iptables-save"), "\n") {
			if !strings.HasPrefix(l, "#") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	if _, err := r.load(ctx, set.IptablesFull(), "iptables-restore", "--noflush"); err != nil {
		t.Fatal(err)
	}
	want := save()
	if err := r.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	chunks := set.IptablesChunks(70)
	if len(chunks) != 5 {
		t.Fatalf("%d chunks of 70 for 300 services", len(chunks))
	}
	for _, c := range chunks {
		if _, err := r.load(ctx, c, "iptables-restore", "--noflush"); err != nil {
			t.Fatal(err)
		}
	}
	if got := save(); got != want {
		t.Errorf("chunked load differs from the full restore:\n--- full\n%s\n--- chunks\n%s", want, got)
	}
}
