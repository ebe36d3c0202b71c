package netdev

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtool ioctl numbers (linux/ethtool.h).
const (
	ethtoolGTXCSUM = 0x00000016
	ethtoolSTXCSUM = 0x00000017
)

type ethtoolValue struct {
	cmd  uint32
	data uint32
}

type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte // the rest of the ifreq union
}

func ethtoolValueIoctl(ifname string, v *ethtoolValue) error {
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q too long", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	var req ifreqData
	copy(req.name[:], ifname)
	req.data = uintptr(unsafe.Pointer(v))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req))); errno != 0 {
		return errno
	}
	return nil
}

// SetTxChecksum turns transmit checksum offload of ifname on or off, in the
// calling thread's netns. With it off, the kernel completes checksums of
// packets sent through the device (skb_checksum_help), as a VM's device needs:
// AF_XDP copy mode would hand a guest partial checksums.
func SetTxChecksum(ifname string, on bool) error {
	v := ethtoolValue{cmd: ethtoolSTXCSUM}
	if on {
		v.data = 1
	}
	if err := ethtoolValueIoctl(ifname, &v); err != nil {
		return fmt.Errorf("set tx checksumming of %s: %w", ifname, err)
	}
	return nil
}

// TxChecksum reports whether transmit checksum offload of ifname is on.
func TxChecksum(ifname string) (bool, error) {
	v := ethtoolValue{cmd: ethtoolGTXCSUM}
	if err := ethtoolValueIoctl(ifname, &v); err != nil {
		return false, fmt.Errorf("get tx checksumming of %s: %w", ifname, err)
	}
	return v.data != 0, nil
}
