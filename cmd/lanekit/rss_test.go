package main

import (
	"strings"
	"testing"

	"github.com/lanekit/lanekit/internal/testutil"
)

// TestRSSHashCommand runs `lanekit rss hash` on rows of Microsoft's RSS
// verification suite (see pkg/rss/toeplitz_test.go for the source).
func TestRSSHashCommand(t *testing.T) {
	testutil.RequireRoot(t)
	run := func(args ...string) (string, error) {
		rssHashOpts = struct {
			key, typ, src, dst string
			sport, dport       uint16
			verbose            bool
		}{}
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
