//! Dirty page logging for live migration (`VHOST_F_LOG_ALL`, `VHOST_USER_PROTOCOL_F_LOG_SHMFD`).
//!
//! While a VM migrates, QEMU copies guest memory to the destination in rounds and re-copies the
//! pages written since. Writes the backend makes (RX buffers, used rings, `avail_event`, control
//! acks) are invisible to KVM's dirty tracking, so the backend reports them in a bitmap QEMU
//! shares with it: one bit per 4 KiB page of guest *physical* address, bit `p % 8` of byte
//! `p / 8` for page `p` (QEMU reads it as 64-bit words, `xchg`ing each to zero while we run, so
//! every mark is an atomic OR).
//!
//! What the crates provide and what is ours:
//! - vhost (0.18) parses `SET_LOG_BASE` and refuses it unless `LOG_SHMFD` was negotiated;
//!   vhost-user-backend (0.24) maps the log fd (`bitmap::MmapLogReg`) and hands it to every
//!   region's bitmap through [`BitmapReplace`] / [`MemRegionBitmap`]; vm-memory calls
//!   [`Bitmap::mark_dirty`] after every write through a `VolatileSlice`, `Bytes::write*` or
//!   `store` (all guest writes of this crate go that way, virtio-queue's used ring updates
//!   included), with the region-relative offset.
//! - vhost-user-backend's own bitmap (`BitmapMmapRegion`) is not used: it logs from the
//!   first `SET_LOG_BASE` on even when `VHOST_F_LOG_ALL` is never acked or is cleared again
//!   (its TODO), takes an `RwLock` on every guest write, logging or not (one shared cache line
//!   for all workers), assumes page-aligned regions, and a region added or replaced after
//!   `SET_LOG_BASE` silently stops logging. [`DirtyBitmap`] keeps the crate's mapping and its
//!   size check (`AtomicBitmapMmap::new`), and adds: an on/off switch the backend sets from the
//!   acked `VHOST_F_LOG_ALL` (one relaxed load per write when off), the carry-over of the log to
//!   new regions (`NetBackend::update_memory`), guest physical page numbers for any region start,
//!   and Release ordering so QEMU never sees a bit before the data it covers.
//!
//! The relay (`validate.rs`) checks `SET_LOG_BASE` before the library sees it (protocol feature,
//! one sealed regular file, offset and size within it, size covering the memory table), so the
//! mapping can neither SIGBUS nor be indexed past its end.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{Address, GuestMemoryRegion};

/// The vhost dirty log granularity (`VHOST_LOG_PAGE`).
pub const LOG_PAGE: u64 = 0x1000;
/// `VHOST_F_LOG_ALL`: the frontend wants every write logged.
pub const VHOST_F_LOG_ALL: u32 = 26;

/// Log bytes needed to cover guest physical addresses `[0, end)`.
pub fn log_bytes_for(end: u64) -> u64 {
    if end == 0 {
        0
    } else {
        (end - 1) / LOG_PAGE / 8 + 1
    }
}

/// One memory region's view of the frontend's shared log.
pub struct RegionLog {
    log: Arc<MmapLogReg>,
    /// Guest physical address of the region's first byte.
    gpa: u64,
    len: u64,
}

impl fmt::Debug for RegionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegionLog {{ gpa: {:#x}, len: {:#x} }}", self.gpa, self.len)
    }
}

impl RegionLog {
    /// Set the bits of the pages `[offset, offset + len)` of the region touches.
    fn mark(&self, offset: usize, len: usize) {
        let (offset, len) = (offset as u64, len as u64);
        if len == 0 || offset >= self.len {
            return;
        }
        let end = offset.saturating_add(len).min(self.len);
        let first = (self.gpa + offset) / LOG_PAGE;
        let last = (self.gpa + end - 1) / LOG_PAGE;
        for page in first..=last {
            // In range: `new` checked (with the library's own check) that the log covers the
            // region's last page, and `end` is clamped to the region.
            // Release: QEMU must not see the bit before the data written under it.
            self.log[(page / 8) as usize].fetch_or(1 << (page % 8), Ordering::Release);
        }
    }

    fn dirty(&self, offset: usize) -> bool {
        let offset = offset as u64;
        if offset >= self.len {
            return false;
        }
        let page = (self.gpa + offset) / LOG_PAGE;
        self.log[(page / 8) as usize].load(Ordering::Acquire) & (1 << (page % 8)) != 0
    }

    /// The shared log behind this view (to give new regions the same log).
    pub fn log(&self) -> Arc<MmapLogReg> {
        self.log.clone()
    }
}

impl MemRegionBitmap for RegionLog {
    fn new<R: GuestMemoryRegion>(region: &R, logmem: Arc<MmapLogReg>) -> io::Result<Self> {
        let (gpa, len) = (region.start_addr().raw_value(), region.len());
        // The library's check that the log covers the region (the log's length is private to
        // it); the relay made the same check with a clearer message before.
        AtomicBitmapMmap::new(region, logmem.clone()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "dirty log too small for guest memory {gpa:#x}..{:#x} (needs {} bytes): {e}",
                    gpa + len,
                    log_bytes_for(gpa + len)
                ),
            )
        })?;
        Ok(RegionLog { log: logmem, gpa, len })
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// `VHOST_F_LOG_ALL` is acked (set by the backend for every region).
    on: AtomicBool,
    /// The frontend's log, from `SET_LOG_BASE` (or carried over from the previous memory table).
    log: RwLock<Option<RegionLog>>,
}

/// The bitmap of one guest memory region (`GuestMemoryMmap<DirtyBitmap>`): marks the region's
/// pages in the frontend's shared log while logging is switched on and a log is set.
#[derive(Debug, Default, Clone)]
pub struct DirtyBitmap(Arc<Slot>);

impl DirtyBitmap {
    /// Switch logging on or off (the acked `VHOST_F_LOG_ALL`).
    pub fn set_on(&self, on: bool) {
        self.0.on.store(on, Ordering::Release);
    }

    /// Logging is switched on.
    pub fn is_on(&self) -> bool {
        self.0.on.load(Ordering::Acquire)
    }

    /// The shared log this region writes to, if any.
    pub fn log(&self) -> Option<Arc<MmapLogReg>> {
        self.0.log.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(RegionLog::log)
    }

    /// Drop the log (the connection ended).
    pub fn clear(&self) {
        self.set_on(false);
        *self.0.log.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Logging is on and a log is set: writes are being logged.
    pub fn logging(&self) -> bool {
        self.is_on() && self.0.log.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl<'a> WithBitmapSlice<'a> for DirtyBitmap {
    type S = RefSlice<'a, DirtyBitmap>;
}

impl DirtyBitmap {
    #[cold]
    #[inline(never)]
    fn mark_logged(&self, offset: usize, len: usize) {
        if let Some(l) = self.0.log.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            l.mark(offset, len);
        }
    }
}

impl Bitmap for DirtyBitmap {
    #[inline]
    fn mark_dirty(&self, offset: usize, len: usize) {
        // Off (no migration running): one relaxed load per write, the rest out of line.
        if self.0.on.load(Ordering::Relaxed) {
            self.mark_logged(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.0.log.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|l| l.dirty(offset))
    }

    #[inline]
    fn slice_at(&self, offset: usize) -> RefSlice<'_, DirtyBitmap> {
        RefSlice::new(self, offset)
    }
}

impl NewBitmap for DirtyBitmap {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}

impl BitmapReplace for DirtyBitmap {
    type InnerBitmap = RegionLog;

    fn replace(&self, log: RegionLog) {
        *self.0.log.write().unwrap_or_else(|e| e.into_inner()) = Some(log);
    }
}
