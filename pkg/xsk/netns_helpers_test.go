package xsk_test

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lanekit/lanekit/internal/testutil"
)

// newTestNS is a new network namespace (the calling thread stays in its
// own), closed with the test.
func newTestNS(t *testing.T) netns.NsHandle {
	t.Helper()
	var h netns.NsHandle
	must(t, "new netns", func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			return err
		}
		defer orig.Close()
		if h, err = netns.New(); err != nil {
			return err
		}
		return netns.Set(orig)
	}())
	t.Cleanup(func() { h.Close() })
	return h
}

// vethToVM adds a veth name in host (queues tx and rx queues each; 0: the
// kernel's default) whose peer is eth0 in vm, sets name up and returns its
// ifindex.
func vethToVM(t *testing.T, host, vm netns.NsHandle, name string, queues int) int {
	t.Helper()
	var idx int
	must(t, "veth", testutil.InNetns(host, func() error {
		attrs := netlink.LinkAttrs{Name: name, NumTxQueues: queues, NumRxQueues: queues}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0"}); err != nil {
			return err
		}
		p, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(p, int(vm)); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return netlink.LinkSetUp(l)
	}))
	return idx
}
