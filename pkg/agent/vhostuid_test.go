package agent

import (
	"net/netip"
	"strings"
	"testing"
)

// TestVhostUIDsClearOfKubeletUserns: VM backend uids must not be uids
// kubelet may give a user-namespaced pod (from 65536 up, any 65536 block,
// chosen at random): the default is below it, and agent.New refuses a
// configured range or shared uid inside kubelet's range, default or given,
// before touching the node.
func TestVhostUIDsClearOfKubeletUserns(t *testing.T) {
	if DefaultVhostUIDRange.overlaps(KubeletUsernsRange) {
		t.Fatalf("default backend uids %s overlap kubelet's user namespaces %s", DefaultVhostUIDRange, KubeletUsernsRange)
	}
	// Kubelet's first pod block with its defaults is idsPerPod (65536) up;
	// the old default (200000-265535) sat in pod blocks 3 and 4.
	r := func(s string) *UIDRange {
		u, err := ParseUIDRange(s)
		if err != nil {
			t.Fatal(err)
		}
		return &u
	}
	uid := func(u uint32) *uint32 { return &u }
	for _, tc := range []struct {
		name    string
		cfg     Config
		refused string
	}{
		{name: "old default", cfg: Config{VhostUIDRange: r("200000-265535")}, refused: "overlap"},
		{name: "straddles 65536", cfg: Config{VhostUIDRange: r("65000-65536")}, refused: "overlap"},
		{name: "top block", cfg: Config{VhostUIDRange: r("4294901760-4294901761")}, refused: "overlap"},
		{name: "below", cfg: Config{VhostUIDRange: r("50000-65535")}},
		{name: "default", cfg: Config{}},
		{name: "kubelet's subuids elsewhere", cfg: Config{VhostUIDRange: r("200000-265535"), KubeletUserns: r("1000000-1999999")}},
		{name: "in kubelet's subuids", cfg: Config{VhostUIDRange: r("1500000-1500100"), KubeletUserns: r("1000000-1999999")}, refused: "overlap"},
		{name: "default in kubelet's subuids", cfg: Config{KubeletUserns: r("60000-69999")}, refused: "overlap"},
		{name: "userns off", cfg: Config{VhostUIDRange: r("200000-265535"), KubeletUserns: &UIDRange{}}},
		{name: "shared uid inside", cfg: Config{VhostUID: uid(300000), VhostGID: uid(300000)}, refused: "--vhost-user uid 300000"},
		{name: "shared uid below", cfg: Config{VhostUID: uid(107), VhostGID: uid(107)}},
	} {
		tc.cfg.StateDir = t.TempDir()
		tc.cfg.PodCIDR = netip.MustParsePrefix("10.9.0.0/24")
		// An accepted config fails next, opening a network namespace that
		// does not exist (nothing on the machine is touched), never with
		// the uid check's words.
		tc.cfg.HostNetns = "/nonexistent/netns"
		_, err := New(tc.cfg, quietLog())
		got := err != nil && strings.Contains(err.Error(), "kubelet gives user-namespaced pods")
		switch {
		case tc.refused != "" && (!got || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s: New = %v, want refused (%q)", tc.name, err, tc.refused)
		case tc.refused == "" && got:
			t.Errorf("%s: New = %v, want the uids accepted", tc.name, err)
		}
	}
}
