package xsk

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// rxGSORcvBuf is a receive socket's buffer: room for a burst of 64 KiB packets
// (each skb's truesize is about twice its length) while the backend sleeps.
const rxGSORcvBuf = 8 << 20

// fanoutIDs hands each set of receive sockets its own fanout group: a
// reconnecting backend's new sockets must not join the group its old ones
// are still leaving.
var fanoutIDs atomic.Uint32

// OpenRxGSO opens a queue's wire -> guest socket on ifindex: AF_PACKET,
// SOCK_RAW, bound for every protocol (ETH_P_ALL) with PACKET_VNET_HDR (the
// kernel puts a virtio_net_hdr in front of each frame: a GSO skb arrives whole,
// with its gso_type, gso_size and checksum state) and PACKET_IGNORE_OUTGOING
// (what the VM sends out of the device is not its input) and a socket filter
// that drops frames for another MAC, joined to fanout
// group (PACKET_FANOUT_QM: a frame goes to member skb->queue_mapping % members,
// that is to the socket of the rx queue the datapath chose, when the members
// joined in queue order). The calling thread must be in the device's network
// namespace; needs CAP_NET_RAW.
func OpenRxGSO(ifindex int, group uint16) (fd int, err error) {
	proto := int(htons(unix.ETH_P_ALL))
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("open rx gso socket: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	for _, o := range []struct {
		opt  int
		name string
	}{{unix.PACKET_VNET_HDR, "PACKET_VNET_HDR"}, {unix.PACKET_IGNORE_OUTGOING, "PACKET_IGNORE_OUTGOING"}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, o.opt, 1); err != nil {
			return -1, fmt.Errorf("open rx gso socket: %s: %w", o.name, err)
		}
	}
	// Frames for another MAC (PACKET_OTHERHOST) are not the VM's: steer_vm
	// drops them too. The filter runs before the frame is queued.
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: skfAdOff + skfAdPktType},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.PACKET_OTHERHOST},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		return -1, fmt.Errorf("open rx gso socket: filter: %w", err)
	}
	// Best effort: the default buffer holds two or three 64 KiB packets.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rxGSORcvBuf)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		return -1, fmt.Errorf("open rx gso socket: bind ifindex %d: %w", ifindex, err)
	}
	// Fanout needs a bound socket. The group receives through its own hook,
	// which ignores outgoing frames only with the group's flag.
	fanout := int(group) | (unix.PACKET_FANOUT_QM|unix.PACKET_FANOUT_FLAG_IGNORE_OUTGOING)<<16
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_FANOUT, fanout); err != nil {
		return -1, fmt.Errorf("open rx gso socket: PACKET_FANOUT: %w", err)
	}
	return fd, nil
}

// AddRxGSO gives every socket of socks, in queue order, a wire -> guest
// socket on ifindex (OpenRxGSO), all in one new fanout group; on failure the
// ones added are closed again and socks are as before.
func AddRxGSO(socks []*Socket, ifindex int) error {
	group := uint16(fanoutIDs.Add(1))
	for i, s := range socks {
		fd, err := OpenRxGSO(ifindex, group)
		if err != nil {
			for _, d := range socks[:i] {
				d.closeRxGSO()
			}
			return fmt.Errorf("queue %d: %w", s.Config.Queue, err)
		}
		s.RxGSOFD, s.Config.RxGSO = fd, true
	}
	return nil
}

func (s *Socket) closeRxGSO() error {
	if !s.Config.RxGSO {
		return nil
	}
	s.Config.RxGSO = false
	err := unix.Close(s.RxGSOFD)
	s.RxGSOFD = -1
	return err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Classic BPF ancillary data (linux/filter.h): SKF_AD_OFF + SKF_AD_PKTTYPE
// loads skb->pkt_type.
const (
	skfAdOff     = 0xfffff000 // -0x1000 as the instruction's u32
	skfAdPktType = 4
)
