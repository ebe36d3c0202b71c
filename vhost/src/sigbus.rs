//! Surviving guest memory that shrinks under the backend's mapping.
//!
//! The frontend owns the files behind guest memory. `validate.rs` checks each region against
//! its file's size when the memory table arrives, but the frontend can still shrink the file
//! afterwards (`ftruncate` on a memfd that is not sealed with `F_SEAL_SHRINK`, or on a tmpfs or
//! hugetlbfs file), and the next access by the backend to a page past the new end raises
//! SIGBUS, which kills the whole process. QEMU's `memory-backend-memfd` seals its memfds against
//! shrinking by default (`seal=on`), so it cannot do this; DPDK's virtio_user and
//! `memory-backend-file` use unsealed files, so refusing unsealed memory would refuse them.
//!
//! Instead the backend survives the fault and fails only the device that caused it: a SIGBUS
//! handler looks the faulting address up in a table of guest memory mappings (registered by
//! the backend when memory is set, removed when the connection ends). For a guest page it maps
//! anonymous zero memory over the lost page (so the faulting access completes, reading zeros),
//! counts the fault and writes the owning backend's fault eventfd; the relay polls that fd and
//! ends the connection with an error. Any other SIGBUS goes to the previous handler (Rust's
//! stack-overflow handler) or the default action, exactly as without this module.
//!
//! The table is fixed-size and lock-free for the handler (atomics only); writers serialize on
//! a mutex. The handler calls only `mmap` and `write`, both plain system calls.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

/// Guest memory mappings tracked at once (all backends in the process).
pub const SLOTS: usize = 128;

struct Slot {
    /// 0 while the slot is free or being written.
    end: AtomicUsize,
    start: AtomicUsize,
    /// Page size of the mapping (huge page size on hugetlbfs).
    align: AtomicUsize,
    fd: AtomicI32,
    owner: AtomicUsize,
    /// Registration order, to evict an owner's oldest stale mapping when the table is full.
    gen: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            end: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            align: AtomicUsize::new(0),
            fd: AtomicI32::new(-1),
            owner: AtomicUsize::new(0),
            gen: AtomicU64::new(0),
        }
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// Serializes writers; holds the next generation number.
static WRITER: Mutex<u64> = Mutex::new(1);
static INSTALL: Once = Once::new();
static INSTALLED: OnceLock<io::Result<()>> = OnceLock::new();
/// The SIGBUS action that was in place before ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static FAULTS: AtomicU64 = AtomicU64::new(0);

/// A guest memory mapping in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// First byte.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// Page size of the mapping (a power of two).
    pub align: usize,
}

/// Guest memory faults survived so far (all backends in the process).
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

/// Install the handler (once per process).
pub fn install() -> io::Result<()> {
    INSTALL.call_once(|| {
        let r = (|| {
            // SAFETY: all-zero is a valid sigaction; sigaction only reads `act` and fills `old`.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
            type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
            act.sa_sigaction = on_sigbus as Handler as libc::sighandler_t;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: act.sa_mask is a valid sigset_t to initialize.
            unsafe { libc::sigemptyset(&mut act.sa_mask) };
            // SAFETY: read the current action first, so the handler can chain to it.
            if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let _ = PREVIOUS.set(old);
            // SAFETY: act is fully initialized and on_sigbus has the SA_SIGINFO signature.
            if unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })();
        let _ = INSTALLED.set(r);
    });
    match INSTALLED.get() {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(io::Error::new(e.kind(), format!("install SIGBUS handler: {e}"))),
        None => Err(io::Error::other("SIGBUS handler installation did not complete")),
    }
}

/// Track `maps` for `owner`; a fault in them writes 1 to `fd` (an eventfd that outlives the
/// registration). Mappings already registered for the owner stay (they may still be in use).
/// When the table is full, the owner's oldest mappings not in `maps` make room.
pub fn register(owner: usize, fd: RawFd, maps: &[Mapping]) -> io::Result<()> {
    let mut gen = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    for m in maps {
        let end = m.start.checked_add(m.len).ok_or_else(|| io::Error::other("mapping wraps"))?;
        let same = TABLE.iter().find(|s| {
            s.end.load(Ordering::Relaxed) == end
                && s.start.load(Ordering::Relaxed) == m.start
                && s.owner.load(Ordering::Relaxed) == owner
        });
        let slot = match same {
            Some(s) => s,
            None => free_slot(owner, maps)
                .ok_or_else(|| io::Error::other(format!("more than {SLOTS} guest memory mappings to guard")))?,
        };
        slot.end.store(0, Ordering::Release);
        slot.start.store(m.start, Ordering::Relaxed);
        slot.align.store(m.align.max(page_size()), Ordering::Relaxed);
        slot.fd.store(fd, Ordering::Relaxed);
        slot.owner.store(owner, Ordering::Relaxed);
        slot.gen.store(*gen, Ordering::Relaxed);
        slot.end.store(end, Ordering::Release);
        *gen += 1;
    }
    Ok(())
}

fn free_slot(owner: usize, keep: &[Mapping]) -> Option<&'static Slot> {
    if let Some(s) = TABLE.iter().find(|s| s.end.load(Ordering::Relaxed) == 0) {
        return Some(s);
    }
    TABLE
        .iter()
        .filter(|s| s.owner.load(Ordering::Relaxed) == owner)
        .filter(|s| !keep.iter().any(|m| m.start == s.start.load(Ordering::Relaxed)))
        .min_by_key(|s| s.gen.load(Ordering::Relaxed))
}

/// Stop tracking every mapping of `owner` (its memory is unmapped or about to be).
pub fn unregister(owner: usize) {
    let _gen = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    for s in TABLE.iter().filter(|s| s.owner.load(Ordering::Relaxed) == owner) {
        s.end.store(0, Ordering::Release);
        s.owner.store(0, Ordering::Relaxed);
    }
}

/// Mappings currently tracked for `owner`.
pub fn registered(owner: usize) -> usize {
    TABLE.iter().filter(|s| s.end.load(Ordering::Acquire) != 0 && s.owner.load(Ordering::Relaxed) == owner).count()
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; for SIGBUS si_addr is
    // the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in TABLE.iter() {
        let end = s.end.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Relaxed);
        if end == 0 || addr < start || addr >= end || s.end.load(Ordering::Acquire) != end {
            continue;
        }
        let align = s.align.load(Ordering::Relaxed);
        let page = addr & !(align - 1);
        // SAFETY: the page lies in a guest memory mapping this process owns (registered while
        // mapped); replacing it with private anonymous memory only changes what the backend
        // reads there (zeros), and the device is torn down. mmap is a plain system call.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                align,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        FAULTS.fetch_add(1, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) of 8 bytes from a live buffer; a stale fd at worst gets an error.
        let _ = unsafe { libc::write(s.fd.load(Ordering::Relaxed), one.as_ptr().cast(), one.len()) };
        return;
    }
    previous(sig, info, ctx);
}

/// Hand a SIGBUS that is not ours to the action that was in place before.
fn previous(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let old = PREVIOUS.get().copied();
    match old {
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO the previous handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: without SA_SIGINFO the previous handler takes only the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: all-zero sigaction is SIG_DFL with an empty mask. Returning then re-runs
            // the faulting access, which now terminates the process as it would have.
            unsafe {
                let dfl: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn a_truncated_guest_page_reads_as_zero_and_is_reported() {
        install().unwrap();
        let size = 4 * page_size();
        let file = crate::xsk::memfd("sigbus-test", size as u64).unwrap();
        // SAFETY: a fresh shared mapping of our own memfd, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let base = p as usize;
        let ev = EventFd::new(EFD_NONBLOCK).unwrap();
        let owner = &ev as *const EventFd as usize;
        register(owner, ev.as_raw_fd(), &[Mapping { start: base, len: size, align: page_size() }]).unwrap();
        assert_eq!(registered(owner), 1);
        let last = (base + 3 * page_size()) as *mut u8;
        // SAFETY: inside our mapping, still backed by the file.
        unsafe { last.write_volatile(7) };
        file.set_len(page_size() as u64).unwrap();
        let before = faults();
        // SAFETY: inside our mapping; past the new end of the file this faults, and the handler
        // maps a zero page over it.
        let v = unsafe { last.read_volatile() };
        assert_eq!(v, 0);
        assert_eq!(faults(), before + 1);
        assert_eq!(ev.read().unwrap(), 1, "fault eventfd written");
        unregister(owner);
        assert_eq!(registered(owner), 0);
        // SAFETY: unmapping the mapping created above.
        unsafe { libc::munmap(p, size) };
    }
}
