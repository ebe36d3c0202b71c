package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestRSSHashCommand runs `lanekit rss hash` on rows of Microsoft's RSS
// verification suite (see pkg/rss/toeplitz_test.go for the source).
func TestRSSHashCommand(t *testing.T) {
	testutil.RequireRoot(t)
	run := func(args ...string) (string, error) {
		rssHashOpts = rssHashOptions{}
		return runCLI(t, append([]string{"rss", "hash"}, args...)...)
	}
	// First, while --sport/--dport were never set in this process (cobra
	// remembers a flag was changed).
	if _, err := run("--type", "tcpv4", "--src", "66.9.149.187", "--dst", "161.142.100.80"); err == nil ||
		!strings.Contains(err.Error(), "needs --sport and --dport") {
		t.Fatalf("tcpv4 without ports: err %v, want a ports error", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--type", "tcpv4", "--src", "66.9.149.187", "--dst", "161.142.100.80", "--sport", "2794", "--dport", "1766"}, "0x51ccc178"},
		{[]string{"--type", "ipv4", "--src", "199.92.111.2", "--dst", "65.69.140.83"}, "0xd718262a"},
		{[]string{"--type", "udpv4", "--src", "153.39.163.191", "--dst", "202.188.127.2", "--sport", "44251", "--dport", "1303"}, "0x10e828a2"},
		{[]string{"--type", "ipv6", "--src", "3ffe:501:8::260:97ff:fe40:efab", "--dst", "ff02::1"}, "0x0f0c461c"},
		{[]string{"--type", "tcpv6", "--src", "3ffe:1900:4545:3:200:f8ff:fe21:67cf", "--dst", "fe80::200:f8ff:fe21:67cf",
			"--sport", "44251", "--dport", "38024", "--key", "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa"}, "0x02d1feef"},
	} {
		out, err := run(c.args...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if strings.TrimSpace(out) != c.want {
			t.Errorf("%v: %q, want %s", c.args, out, c.want)
		}
	}
	if _, err := run("--type", "tcpv4", "--src", "10.0.0.1", "--dst", "fd00::1", "--sport", "1", "--dport", "2"); err == nil {
		t.Errorf("mixed families: no error")
	}
}

// TestRSSHashFrameCommand hashes whole frames with `lanekit rss hash
// --frame`: an MLD report (IPv6, hop-by-hop header, ICMPv6: the addresses),
// a UDP datagram behind a hop-by-hop header (the ports too), ARP (none). The
// expected hashes are Microsoft's vectors (pkg/rss/toeplitz_test.go).
func TestRSSHashFrameCommand(t *testing.T) {
	testutil.RequireRoot(t)
	run := func(args ...string) (string, error) {
		rssHashOpts = rssHashOptions{}
		// cobra remembers that a flag was set in an earlier Execute.
		rssHashCmd.Flags().VisitAll(func(f *pflag.Flag) { f.Changed = false })
		return runCLI(t, append([]string{"rss", "hash"}, args...)...)
	}
	const eth6, eth4 = "020000000002020000000001" + "86dd", "020000000002020000000001" + "0806"
	// 3ffe:2501:200:1fff::7 -> 3ffe:2501:200:3::1, ports 2794 -> 1766
	const addrs = "3ffe250102001fff00000000000000073ffe2501020000030000000000000001"
	hbh := "11000104" + "00000000" // next: UDP, PadN
	udp := "0aea06e6" + "0010" + "0000" + "0000000000000000"
	for _, c := range []struct {
		name, frame, types, want string
	}{
		{"mld", eth6 + "60000000" + "0010" + "00" + "01" + addrs + "3a000104" + "00000000" + "8f000000" + "00000000", "all", "0x2cc18cd5 ipv6 (32 input bytes)"},
		{"udp after hop-by-hop", eth6 + "60000000" + "0018" + "00" + "40" + addrs + hbh + udp, "all", "0x40207d3d udpv6 (36 input bytes)"},
		{"udp after hop-by-hop, ipv6 only", eth6 + "60000000" + "0018" + "00" + "40" + addrs + hbh + udp, "ipv6", "0x2cc18cd5 ipv6 (32 input bytes)"},
		{"arp", eth4 + strings.Repeat("00", 28), "all", "none"},
	} {
		out, err := run("--frame", c.frame, "--type", c.types, "-v")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !strings.HasPrefix(strings.TrimSpace(out), c.want) {
			t.Errorf("%s: %q, want it to start with %q", c.name, out, c.want)
		}
	}
	if _, err := run("--frame", "zz", "--type", "all"); err == nil {
		t.Errorf("bad hex: no error")
	}
	if _, err := run("--frame", eth4, "--type", "all", "--src", "10.0.0.1"); err == nil {
		t.Errorf("--frame with --src: no error")
	}
}
