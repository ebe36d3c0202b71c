//! The shared-memory side of an AF_XDP socket: the UMEM mapping, the four rings (producer and
//! consumer indexes shared with the kernel) and the kernel's per-socket statistics.

use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{SOL_XDP, XDP_MMAP_OFFSETS, XDP_RING_NEED_WAKEUP, XDP_STATISTICS};

/// `struct xdp_ring_offset`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct MmapOffsets {
    pub(super) rx: RingOffset,
    pub(super) tx: RingOffset,
    pub(super) fr: RingOffset,
    pub(super) cr: RingOffset,
}

/// A shared memory mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Mmap {
    pub(super) ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; access is synchronised by
// the owner (`XskPort` is used by one thread at a time through `&mut self`).
unsafe impl Send for Mmap {}

impl Mmap {
    pub(super) fn map(fd: RawFd, len: usize, offset: libc::off_t) -> io::Result<Mmap> {
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL); fd and length are checked by
        // the kernel, and the result is checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mmap { ptr, len })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping created by `Mmap::map` and not unmapped before.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One of the four AF_XDP rings: shared producer/consumer indexes and an entry array.
#[derive(Debug)]
pub(super) struct Ring<T> {
    /// Keeps the mapping the pointers below point into alive.
    _map: Mmap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    mask: u32,
    /// Our copy of the index we own (producer for fill/tx, consumer for rx/comp).
    pub(super) local: u32,
    /// Last seen value of the index the kernel owns.
    cached: u32,
}

// SAFETY: the raw pointers point into `map`, owned by the ring; the ring is used from one thread
// at a time (through `&mut`), and the kernel side is synchronised with atomics.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    pub(super) fn map(
        fd: RawFd,
        off: &RingOffset,
        size: u32,
        pgoff: libc::off_t,
        producer_side: bool,
    ) -> io::Result<Self> {
        let len = usize::try_from(off.desc)
            .ok()
            .and_then(|d| d.checked_add(size as usize * size_of::<T>()))
            .ok_or_else(|| io::Error::other("ring offsets overflow"))?;
        for o in [off.producer, off.consumer, off.flags] {
            if o.saturating_add(4) > off.desc {
                return Err(io::Error::other("ring offsets out of range"));
            }
        }
        let map = Mmap::map(fd, len, pgoff)?;
        let base = map.ptr.as_ptr();
        // SAFETY: every offset was checked to lie inside the mapping of `len` bytes above; the
        // kernel aligns the indexes to 4 bytes and the descriptors to their size.
        let (producer, consumer, flags, entries) = unsafe {
            (
                base.add(off.producer as usize).cast::<AtomicU32>().cast_const(),
                base.add(off.consumer as usize).cast::<AtomicU32>().cast_const(),
                base.add(off.flags as usize).cast::<AtomicU32>().cast_const(),
                base.add(off.desc as usize).cast::<T>(),
            )
        };
        let mut r = Ring { _map: map, producer, consumer, flags, entries, mask: size - 1, local: 0, cached: 0 };
        if producer_side {
            r.local = r.producer().load(Ordering::Relaxed);
            r.cached = r.consumer().load(Ordering::Acquire);
        } else {
            r.local = r.consumer().load(Ordering::Relaxed);
            r.cached = r.producer().load(Ordering::Acquire);
        }
        Ok(r)
    }

    pub(super) fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping owned by self (checked in `map`).
        unsafe { &*self.producer }
    }

    pub(super) fn consumer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping owned by self (checked in `map`).
        unsafe { &*self.consumer }
    }

    pub(super) fn needs_wakeup(&self) -> bool {
        // SAFETY: points into the live mapping owned by self (checked in `map`).
        unsafe { &*self.flags }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }

    pub(super) fn write(&mut self, idx: u32, v: T) {
        // SAFETY: idx & mask < ring size, so the slot is inside the mapping.
        unsafe { self.entries.add((idx & self.mask) as usize).write_volatile(v) }
    }

    pub(super) fn read(&self, idx: u32) -> T {
        // SAFETY: idx & mask < ring size, so the slot is inside the mapping.
        unsafe { self.entries.add((idx & self.mask) as usize).read_volatile() }
    }

    /// Producer side: free slots, refreshing the consumer index when needed.
    pub(super) fn free(&mut self, want: u32) -> u32 {
        let size = self.mask + 1;
        let mut free = size - self.local.wrapping_sub(self.cached);
        if free < want {
            self.cached = self.consumer().load(Ordering::Acquire);
            free = size - self.local.wrapping_sub(self.cached);
        }
        free.min(size)
    }

    /// Producer side: publish `n` entries written at `local..local+n`.
    pub(super) fn submit(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.producer().store(self.local, Ordering::Release);
    }

    /// Consumer side: entries ready, refreshing the producer index when none are cached.
    pub(super) fn ready(&mut self, want: u32) -> u32 {
        let mut avail = self.cached.wrapping_sub(self.local);
        if avail == 0 {
            self.cached = self.producer().load(Ordering::Acquire);
            avail = self.cached.wrapping_sub(self.local);
        }
        avail.min(want).min(self.mask + 1)
    }

    /// Consumer side: give `n` entries back to the kernel.
    pub(super) fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.consumer().store(self.local, Ordering::Release);
    }
}

/// `struct xdp_statistics` (`getsockopt(SOL_XDP, XDP_STATISTICS)`): the kernel's counters of
/// one AF_XDP socket. Kernels before 5.9 fill only the first three (the others read 0).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Frames dropped for reasons other than invalid descriptors (e.g. no fill ring entry).
    pub rx_dropped: u64,
    /// Invalid descriptors dropped on RX (fill ring).
    pub rx_invalid_descs: u64,
    /// Invalid descriptors dropped on TX.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty when the kernel needed a buffer.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty when the kernel looked for frames to send.
    pub tx_ring_empty_descs: u64,
}

/// Read `XDP_STATISTICS` of the AF_XDP socket `fd`.
pub fn xdp_statistics(fd: RawFd) -> io::Result<XdpStatistics> {
    let mut st = XdpStatistics::default();
    let mut len = size_of::<XdpStatistics>() as libc::socklen_t;
    // SAFETY: st is a writable, initialised buffer of `len` bytes; the kernel writes at most len
    // bytes and reports how many in len. A bad fd only makes the call fail.
    let r = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_STATISTICS, (&raw mut st).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub(super) fn getsockopt_offsets(fd: RawFd) -> io::Result<MmapOffsets> {
    let mut off = MmapOffsets::default();
    let mut len = size_of::<MmapOffsets>() as libc::socklen_t;
    // SAFETY: off is a writable buffer of `len` bytes; the kernel writes at most len bytes.
    let r = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_MMAP_OFFSETS, (&raw mut off).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < size_of::<MmapOffsets>() {
        return Err(io::Error::other("kernel without flags in XDP_MMAP_OFFSETS is not supported"));
    }
    Ok(off)
}
