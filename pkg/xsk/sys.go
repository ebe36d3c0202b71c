package xsk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// setsockoptUmemReg passes struct xdp_umem_reg (x/sys has the type but no
// setter for it).
func setsockoptUmemReg(fd int, reg *unix.XDPUmemReg) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_UMEM_REG,
		uintptr(unsafe.Pointer(reg)), unsafe.Sizeof(*reg), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
