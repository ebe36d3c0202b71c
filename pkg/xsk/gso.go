package xsk

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// gsoSndBuf is the GSO socket's send buffer: room for a few 64 KiB packets in
// flight (a full buffer makes the backend cut the frame itself, counted).
const gsoSndBuf = 4 << 20

// OpenGSO opens a queue's GSO socket on ifindex: AF_PACKET, SOCK_RAW, bound
// with protocol 0 (it receives nothing), PACKET_VNET_HDR (the kernel takes a
// virtio_net_hdr in front of each frame and builds one GSO, CHECKSUM_PARTIAL
// skb from it) and PACKET_QDISC_BYPASS. The backend sends a guest's TSO/USO
// frame whole through it instead of cutting it into AF_XDP frames; the skb
// crosses the endpoint's veth like a pod's TSO traffic, so tcx from_pod applies
// identity, policy and routing to one packet. The calling thread must be in
// the device's network namespace; needs CAP_NET_RAW.
func OpenGSO(ifindex int) (fd int, err error) {
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open gso socket: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return -1, fmt.Errorf("open gso socket: PACKET_VNET_HDR: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
		return -1, fmt.Errorf("open gso socket: PACKET_QDISC_BYPASS: %w", err)
	}
	// Best effort: without the raise the default send buffer still holds one packet.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, gsoSndBuf)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: 0, Ifindex: ifindex}); err != nil {
		return -1, fmt.Errorf("open gso socket: bind ifindex %d: %w", ifindex, err)
	}
	return fd, nil
}

// AddGSO gives every socket of socks a GSO socket on ifindex (OpenGSO); on
// failure the ones added are closed again and socks are as before.
func AddGSO(socks []*Socket, ifindex int) error {
	for i, s := range socks {
		fd, err := OpenGSO(ifindex)
		if err != nil {
			for _, d := range socks[:i] {
				d.closeGSO()
			}
			return fmt.Errorf("queue %d: %w", s.Config.Queue, err)
		}
		s.GSOFD, s.Config.GSO = fd, true
	}
	return nil
}

func (s *Socket) closeGSO() error {
	if !s.Config.GSO {
		return nil
	}
	s.Config.GSO = false
	err := unix.Close(s.GSOFD)
	s.GSOFD = -1
	return err
}
