//! Dirty page logging for live migration: `VHOST_F_LOG_ALL` switching every region's log on or
//! off, carrying the log over a new memory table, and the frontend's log eventfd (`dirty.rs`
//! holds the bitmaps themselves).

use super::*;

/// The dirty log bitmap of a region (vm-memory's `GuestMemoryRegion::bitmap` returns a slice).
pub(super) fn region_bitmap(r: &GuestRegionMmap<DirtyBitmap>) -> &DirtyBitmap {
    let m: &MmapRegion<DirtyBitmap> = r;
    m.bitmap()
}

impl NetBackend {
    /// `VHOST_F_LOG_ALL` was acked (or cleared): switch logging of every region on or off.
    pub(super) fn set_log_all(&self, on: bool) {
        let was = self.log_all.swap(on, Ordering::SeqCst);
        if let Some(atomic) = self.memory() {
            let mem = atomic.memory().into_inner();
            if on {
                self.carry_log(&mem);
            }
            for r in mem.iter() {
                region_bitmap(r).set_on(on);
            }
        }
        if was != on {
            info!("dirty page logging {}", if on { "on (VHOST_F_LOG_ALL acked)" } else { "off" });
        }
    }

    /// A new memory table (or logging switched on): regions without a log get the log of the
    /// previous table's regions (vhost-user-backend gives each new region an empty bitmap, and a
    /// frontend only sends `SET_LOG_BASE` again when the log must grow), and the current
    /// on/off state. A region the log does not cover stays unlogged, with a warning (QEMU
    /// grows the log before it grows the memory table).
    pub(super) fn carry_log(&self, mem: &Arc<GuestMem>) {
        let on = self.log_all.load(Ordering::SeqCst);
        let mut last = lock(&self.logged_mem);
        let log = mem
            .iter()
            .find_map(|r| region_bitmap(r).log())
            .or_else(|| last.as_ref().and_then(|m| m.iter().find_map(|r| region_bitmap(r).log())));
        for r in mem.iter() {
            let bitmap = region_bitmap(r);
            if let Some(log) = log.as_ref().filter(|_| bitmap.log().is_none()) {
                match RegionLog::new(r, log.clone()) {
                    Ok(l) => vhost_user_backend::bitmap::BitmapReplace::replace(bitmap, l),
                    Err(e) => warn!("guest memory region {:#x}: not logged: {e}", r.start_addr().0),
                }
            }
            bitmap.set_on(on);
        }
        *last = Some(mem.clone());
    }

    /// Writes to guest memory are being logged (`VHOST_F_LOG_ALL` acked and a log set).
    pub fn dirty_logging(&self) -> bool {
        self.memory().is_some_and(|m| {
            let mem = m.memory();
            mem.num_regions() > 0 && mem.iter().all(|r| region_bitmap(r).logging())
        })
    }

    /// The frontend's `SET_LOG_FD` eventfd (the relay checked it is one).
    pub(crate) fn set_log_fd(&self, fd: EventFd) {
        *lock(&self.log_fd) = Some(fd);
    }

    pub(super) fn signal_log(&self) {
        if let Some(fd) = lock(&self.log_fd).as_ref() {
            if let Err(e) = fd.write(1) {
                warn!("signal log eventfd: {e}");
            }
        }
    }
}
