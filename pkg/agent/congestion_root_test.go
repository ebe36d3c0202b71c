package agent

import (
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/lanekit/lanekit/internal/agenttest"
	"github.com/lanekit/lanekit/pkg/netdev/netnstest"
)

// TestPodCongestionControl: --pod-congestion-control sets every new pod
// namespace's TCP congestion control (one other than the default a new
// namespace gets: bbr, or reno where that default is bbr already), which a
// TCP socket the pod opens then uses; a name pods may not use is refused at
// start.
func TestPodCongestionControl(t *testing.T) {
	allowed, err := os.ReadFile("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
	if err != nil || !strings.Contains(string(allowed), "bbr") || !strings.Contains(string(allowed), "reno") {
		t.Skipf("bbr and reno not both allowed here (%q, %v)", allowed, err)
	}
	// socketCC is the congestion control of a new TCP socket in n.
	socketCC := func(n ns.NetNS) string {
		var cc string
		if err := n.Do(func(ns.NetNS) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			cc, err = unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return strings.TrimRight(cc, "\x00")
	}
	fx := newFixture(t)
	want := "bbr"
	if socketCC(fx.nodeNS) == "bbr" { // a new namespace's default
		want = "reno"
	}
	if _, err := fx.startCfg(t, agenttest.NewMemoryDatapath(), func(c *Config) { c.PodCongestionControl = "nosuch" }); err == nil ||
		!strings.Contains(err.Error(), `"nosuch" is not available to pods`) {
		t.Fatalf("unknown congestion control: %v", err)
	}
	a, err := fx.startCfg(t, agenttest.NewMemoryDatapath(), func(c *Config) { c.PodCongestionControl = want })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	pod := netnstest.New(t, "ccpod")
	if _, err := a.Add(AddRequest{ContainerID: "cc", IfName: "eth0", Netns: pod.Path()}); err != nil {
		t.Fatal(err)
	}
	if got := socketCC(pod); got != want {
		t.Errorf("a TCP socket in the pod uses %q, want %s", got, want)
	}
}
