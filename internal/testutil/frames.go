package testutil

import (
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// SendFrames writes count copies of the raw Ethernet frame on ifname inside n
// (AF_PACKET): exactly those bytes, so BPF counters can be checked to the byte.
func SendFrames(t testing.TB, n ns.NetNS, ifname string, frame []byte, count int) {
	t.Helper()
	err := n.Do(func(ns.NetNS) error {
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := int(uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8) // htons
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Protocol: uint16(proto)}
		for i := 0; i < count; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send frame %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send frames in %s: %v", n.Path(), err)
	}
}
