package xsk_test

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// testBackend plays lanekit-vhost's part for one queue: it maps the UMEM and
// the rings of a socket received from the agent.
type testBackend struct {
	fd               int
	umem             []byte
	frameSize        uint32
	fill, comp       ring
	rx, tx           ring
	nextFree, frames uint32
}

type ring struct {
	mem        []byte
	prod, cons *uint32
	desc       unsafe.Pointer
	mask       uint32
}

func mapRing(fd int, off unix.XDPRingOffset, pgoff int64, n uint32, descSize uintptr) (ring, error) {
	size := int(off.Desc) + int(n)*int(descSize)
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring{}, fmt.Errorf("mmap ring at %#x: %w", pgoff, err)
	}
	base := unsafe.Pointer(&mem[0])
	return ring{mem: mem, prod: (*uint32)(unsafe.Add(base, off.Producer)), cons: (*uint32)(unsafe.Add(base, off.Consumer)),
		desc: unsafe.Add(base, off.Desc), mask: n - 1}, nil
}

func newTestBackend(xskFD, umemFD int, umemSize uint64, frameSize, frames, ringSize uint32) (*testBackend, error) {
	var off unix.XDPMmapOffsets
	l := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(xskFD), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return nil, fmt.Errorf("mmap offsets: %w", e)
	}
	b := &testBackend{fd: xskFD, frameSize: frameSize, frames: frames}
	var err error
	if b.umem, err = unix.Mmap(umemFD, 0, int(umemSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap umem: %w", err)
	}
	if b.rx, err = mapRing(xskFD, off.Rx, unix.XDP_PGOFF_RX_RING, ringSize, 16); err != nil {
		return nil, err
	}
	if b.tx, err = mapRing(xskFD, off.Tx, unix.XDP_PGOFF_TX_RING, ringSize, 16); err != nil {
		return nil, err
	}
	if b.fill, err = mapRing(xskFD, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, ringSize, 8); err != nil {
		return nil, err
	}
	if b.comp, err = mapRing(xskFD, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, ringSize, 8); err != nil {
		return nil, err
	}
	return b, nil
}

// fillFrames gives the kernel n frames to receive into.
func (b *testBackend) fillFrames(n uint32) {
	p := atomic.LoadUint32(b.fill.prod)
	for i := uint32(0); i < n; i++ {
		*(*uint64)(unsafe.Add(b.fill.desc, uintptr((p+i)&b.fill.mask)*8)) = uint64(b.nextFree) * uint64(b.frameSize)
		b.nextFree++
	}
	atomic.StoreUint32(b.fill.prod, p+n)
}

// recv returns the frames the kernel has put on the rx ring.
func (b *testBackend) recv() [][]byte {
	c := atomic.LoadUint32(b.rx.cons)
	p := atomic.LoadUint32(b.rx.prod)
	var out [][]byte
	for ; c != p; c++ {
		d := (*unix.XDPDesc)(unsafe.Add(b.rx.desc, uintptr(c&b.rx.mask)*16))
		out = append(out, append([]byte(nil), b.umem[d.Addr:d.Addr+uint64(d.Len)]...))
	}
	atomic.StoreUint32(b.rx.cons, c)
	return out
}

// send transmits one frame from the last frame of the UMEM.
func (b *testBackend) send(frame []byte) error {
	addr := uint64(b.frames-1) * uint64(b.frameSize)
	copy(b.umem[addr:], frame)
	p := atomic.LoadUint32(b.tx.prod)
	d := (*unix.XDPDesc)(unsafe.Add(b.tx.desc, uintptr(p&b.tx.mask)*16))
	d.Addr, d.Len, d.Options = addr, uint32(len(frame)), 0
	atomic.StoreUint32(b.tx.prod, p+1)
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(b.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	if e != 0 && e != unix.EAGAIN && e != unix.EBUSY {
		return fmt.Errorf("tx kick: %w", e)
	}
	return nil
}

func (b *testBackend) close() {
	for _, r := range []ring{b.rx, b.tx, b.fill, b.comp} {
		if r.mem != nil {
			unix.Munmap(r.mem)
		}
	}
	if b.umem != nil {
		unix.Munmap(b.umem)
	}
}
