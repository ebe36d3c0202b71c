//! Checks on frontend messages that vhost-user-backend 0.24 / vm-memory 0.18 do not make, run
//! by the relay (`relay.rs`) before a message reaches the daemon. The frontend (QEMU in the
//! virt-launcher pod) is less trusted than the backend; each check below closes a way for it
//! to crash or wedge the backend process, not just its own device:
//!
//! - **Memory regions** (`SET_MEM_TABLE`, `ADD_MEM_REG`): the fd must be a regular file (memfd,
//!   tmpfs, hugetlbfs) and `mmap_offset + memory_size` must lie within its size (`fstat`).
//!   Upstream maps whatever size is declared, and touching a page past the end of the file is
//!   SIGBUS for the whole process. (A file that shrinks *after* this check is handled by
//!   `sigbus.rs`.) Address ranges must not wrap.
//! - **Vring addresses** (`SET_VRING_ADDR`): the descriptor table, avail and used rings (sized
//!   from the last `SET_VRING_NUM`) must each lie inside one region of the memory table.
//!   Upstream accepts them and the ring then silently never works.
//! - **Vring sizes** (`SET_VRING_NUM`): a power of two up to the maximum (split rings).
//!   Upstream keeps its previous size when given another, silently disagreeing with the guest.
//! - **Kick, call and err fds**: must be eventfds (a pipe or socket is refused), and are made
//!   non-blocking. Upstream reads kicks with a blocking 8-byte `read_exact` and signals calls
//!   with a blocking `write` while holding the vring lock: a pipe holding one byte, or an
//!   eventfd already at its maximum count, blocks a worker forever and with it every control
//!   message that needs that vring (`GET_VRING_BASE` never answered). QEMU creates its
//!   eventfds non-blocking already (`O_NONBLOCK` is on the shared open file description).
//!
//! - **The dirty log** (`SET_LOG_BASE`, live migration; see `dirty.rs`): only with
//!   `VHOST_USER_PROTOCOL_F_LOG_SHMFD` negotiated (without it the payload would be an address in
//!   the frontend's own process), exactly one fd, a regular file sealed against shrinking
//!   (`F_SEAL_SHRINK`: QEMU's `vhost-log` memfd is sealed; an unsealed file shrunk later would
//!   SIGBUS the backend on its next mark, and the SIGBUS guard only covers guest memory), a
//!   page-aligned offset, `mmap_offset + mmap_size` within the file, and a size covering every
//!   guest page of the memory table (one bit per 4 KiB page). `SET_LOG_FD` must carry one
//!   eventfd (made non-blocking). Upstream maps whatever it is given and reports a too-small
//!   log as a bare `InvalidData`.
//!
//! A failed check ends the connection with an error naming the cause (logged and counted by
//! the serve loop), the way the library ends a connection on its own errors.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::backend::MAX_QUEUE_SIZE;

const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_MEM_TABLE: u32 = 5;
const SET_LOG_BASE: u32 = 6;
const SET_LOG_FD: u32 = 7;
/// `VHOST_USER_PROTOCOL_F_LOG_SHMFD`.
const PROTOCOL_F_LOG_SHMFD: u64 = 1 << 1;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ERR: u32 = 14;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;
/// `VHOST_USER_VRING_NOFD_MASK`: the u64 payload of KICK/CALL/ERR says no fd follows.
const VRING_NOFD: u64 = 1 << 8;
const HDR: usize = 12;
const REGION: usize = 32;

fn refuse(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One region as the frontend described it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    gpa: u64,
    size: u64,
    uaddr: u64,
    offset: u64,
}

impl Region {
    fn parse(b: &[u8]) -> Region {
        let f = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        Region { gpa: f(0), size: f(1), uaddr: f(2), offset: f(3) }
    }

    /// The user address range `[start, end)` if it contains `[addr, addr + len)`.
    fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        addr >= self.uaddr && end <= self.uaddr + self.size
    }
}

/// Per-connection validation state: the memory table and vring sizes seen so far.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    regions: Vec<Region>,
    nums: HashMap<u32, u64>,
    protocol_features: u64,
}

impl Checker {
    /// Check one frontend message (`bytes`: header + payload) and its fds; may adjust the fds
    /// (non-blocking). An error ends the connection.
    pub(crate) fn check(&mut self, bytes: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
        let payload = &bytes[HDR.min(bytes.len())..];
        let request = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        match request {
            SET_MEM_TABLE => self.mem_table(payload, fds),
            ADD_MEM_REG => self.add_region(payload, fds),
            REM_MEM_REG if payload.len() == 8 + REGION => {
                let r = Region::parse(&payload[8..]);
                self.regions.retain(|x| (x.gpa, x.size, x.uaddr) != (r.gpa, r.size, r.uaddr));
                Ok(())
            }
            SET_VRING_NUM if payload.len() == 8 => {
                let index = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
                let num = u32::from_le_bytes([payload[4], payload[5], payload[6], payload[7]]);
                if !num.is_power_of_two() || num as usize > MAX_QUEUE_SIZE {
                    // Split rings only (packed rings are not offered); upstream ignores such a
                    // size and keeps its own, so the two sides would disagree on the layout.
                    return Err(refuse(format!(
                        "vring {index}: size {num} is not a power of two up to {MAX_QUEUE_SIZE}"
                    )));
                }
                self.nums.insert(index, u64::from(num));
                Ok(())
            }
            SET_VRING_ADDR => self.vring_addr(payload),
            SET_PROTOCOL_FEATURES if payload.len() == 8 => {
                self.protocol_features = u64::from_le_bytes(payload.try_into().unwrap_or([0; 8]));
                Ok(())
            }
            SET_LOG_BASE => self.log_base(payload, fds),
            SET_LOG_FD => match fds {
                [fd] => eventfd(fd, "log", 0)
                    .map_err(|_| refuse(format!("SET_LOG_FD: fd is not an eventfd ({})", fd_name(fd)))),
                _ => Err(refuse(format!("SET_LOG_FD: {} fds, expected one eventfd", fds.len()))),
            },
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
                let what = match request {
                    SET_VRING_KICK => "kick",
                    SET_VRING_CALL => "call",
                    _ => "err",
                };
                let index = payload.first().copied().unwrap_or(0);
                let nofd =
                    payload.len() == 8 && u64::from_le_bytes(payload.try_into().unwrap_or([0; 8])) & VRING_NOFD != 0;
                match (fds, nofd) {
                    ([fd], false) => eventfd(fd, what, index),
                    // Message-level problems (missing fd, extra fds) are the library's to refuse.
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    fn mem_table(&mut self, payload: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
        if payload.len() < 8 {
            return Ok(()); // the library refuses it
        }
        let n = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
        let body = &payload[8..];
        if n == 0 || body.len() != n * REGION || fds.len() != n {
            return Ok(()); // malformed: the library refuses it
        }
        let mut regions = Vec::with_capacity(n);
        for (i, (chunk, fd)) in body.chunks_exact(REGION).zip(fds).enumerate() {
            let r = Region::parse(chunk);
            check_region(&r, fd).map_err(|e| refuse(format!("memory region {i}: {e}")))?;
            log::info!(
                "guest memory region {i}: {} KiB of {}, {}",
                r.size >> 10,
                fd_name(fd),
                if sealed_against_shrink(fd) { "sealed against shrinking" } else { "not sealed (SIGBUS guard)" }
            );
            regions.push(r);
        }
        self.regions = regions;
        Ok(())
    }

    fn add_region(&mut self, payload: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
        let ([fd], true) = (fds, payload.len() == 8 + REGION) else { return Ok(()) };
        let r = Region::parse(&payload[8..]);
        check_region(&r, fd).map_err(|e| refuse(format!("added memory region: {e}")))?;
        self.regions.push(r);
        Ok(())
    }

    /// `SET_LOG_BASE` with `struct VhostUserLog { mmap_size, mmap_offset }` and the log's fd.
    fn log_base(&self, payload: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
        let what = |e: String| refuse(format!("SET_LOG_BASE: {e}"));
        if self.protocol_features & PROTOCOL_F_LOG_SHMFD == 0 {
            return Err(what(
                "VHOST_USER_PROTOCOL_F_LOG_SHMFD was not negotiated (a log address in the frontend's own \
                 process cannot be used by the backend)"
                    .into(),
            ));
        }
        let [fd] = fds else { return Err(what(format!("{} fds, expected the log's one", fds.len()))) };
        if payload.len() != 16 {
            return Err(what(format!("payload of {} bytes, expected 16 (mmap_size, mmap_offset)", payload.len())));
        }
        let size = u64::from_le_bytes(payload[..8].try_into().unwrap_or([0; 8]));
        let offset = u64::from_le_bytes(payload[8..].try_into().unwrap_or([0; 8]));
        let st = fstat(fd).map_err(|e| what(format!("fstat: {e}")))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(what(format!("the log fd is not a regular file ({})", fd_name(fd))));
        }
        if size == 0 || offset % 4096 != 0 {
            return Err(what(format!(
                "mmap size {size:#x} / offset {offset:#x}: need a size and a page-aligned offset"
            )));
        }
        let file = u64::try_from(st.st_size).unwrap_or(0);
        if offset.checked_add(size).is_none_or(|end| end > file) {
            return Err(what(format!(
                "mmap offset {offset:#x} + size {size:#x} is past the end of the {file:#x}-byte log file ({})",
                fd_name(fd)
            )));
        }
        if !sealed_against_shrink(fd) {
            return Err(what(format!(
                "the log file is not sealed against shrinking (F_SEAL_SHRINK; QEMU seals its vhost-log memfd): \
                 shrunk later, every mark would SIGBUS the backend ({})",
                fd_name(fd)
            )));
        }
        let end = self.regions.iter().map(|r| r.gpa.saturating_add(r.size)).max().unwrap_or(0);
        let need = crate::dirty::log_bytes_for(end);
        if size < need {
            return Err(what(format!(
                "a log of {size} bytes covers guest memory up to {:#x}, the memory table reaches {end:#x} \
                 (needs {need} bytes: one bit per 4 KiB page)",
                size * 8 * crate::dirty::LOG_PAGE
            )));
        }
        log::info!("dirty log: {size} bytes of {} (guest memory up to {end:#x})", fd_name(fd));
        Ok(())
    }

    fn vring_addr(&self, payload: &[u8]) -> io::Result<()> {
        // struct vhost_vring_addr: index, flags (u32), desc, used, avail, log (u64).
        if payload.len() != 40 || self.regions.is_empty() {
            return Ok(()); // the library refuses it
        }
        let index = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        let f = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&payload[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let num = self.nums.get(&index).copied().unwrap_or(MAX_QUEUE_SIZE as u64);
        for (name, addr, len) in
            [("descriptor table", f(0), 16 * num), ("used ring", f(1), 6 + 8 * num), ("avail ring", f(2), 6 + 2 * num)]
        {
            if !self.regions.iter().any(|r| r.contains(addr, len)) {
                return Err(refuse(format!("vring {index}: {name} at {addr:#x} (+{len}) is outside guest memory")));
            }
        }
        Ok(())
    }
}

/// A region must be mappable without ever touching a page past the end of its file.
fn check_region(r: &Region, fd: &OwnedFd) -> Result<(), String> {
    if r.size == 0 {
        return Err("size 0".into());
    }
    if r.gpa.checked_add(r.size).is_none() || r.uaddr.checked_add(r.size).is_none() {
        return Err(format!("address range wraps (gpa {:#x}, user {:#x}, size {:#x})", r.gpa, r.uaddr, r.size));
    }
    let st = fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("fd is not a regular file ({})", fd_name(fd)));
    }
    let file = u64::try_from(st.st_size).unwrap_or(0);
    match r.offset.checked_add(r.size) {
        Some(end) if end <= file => Ok(()),
        _ => Err(format!(
            "mmap offset {:#x} + size {:#x} is past the end of the {file:#x}-byte file behind it ({})",
            r.offset,
            r.size,
            fd_name(fd)
        )),
    }
}

/// The file cannot shrink under our mapping (`F_SEAL_SHRINK`, e.g. QEMU's memfd default).
fn sealed_against_shrink(fd: &OwnedFd) -> bool {
    // SAFETY: fcntl on an fd we own; F_GET_SEALS takes no argument (EINVAL on non-memfds).
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `stat`; fstat fills it for a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open (owned) and st is a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// What the fd refers to, as /proc shows it (e.g. `anon_inode:[eventfd]`, `pipe:[123]`).
fn fd_name(fd: &OwnedFd) -> String {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("unknown: {e}"))
}

/// Kick/call/err fds must be eventfds; they are made non-blocking.
fn eventfd(fd: &OwnedFd, what: &str, index: u8) -> io::Result<()> {
    let name = fd_name(fd);
    if name != "anon_inode:[eventfd]" {
        return Err(refuse(format!("vring {index}: {what} fd is not an eventfd ({name})")));
    }
    // SAFETY: fcntl on an fd we own, with integer arguments.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        let e = io::Error::last_os_error();
        return Err(refuse(format!("vring {index}: make {what} eventfd non-blocking: {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn msg(req: u32, payload: &[u8]) -> Vec<u8> {
        [&req.to_le_bytes()[..], &1u32.to_le_bytes(), &(payload.len() as u32).to_le_bytes(), payload].concat()
    }

    fn table(regions: &[[u64; 4]]) -> Vec<u8> {
        let mut p = (regions.len() as u64).to_le_bytes().to_vec();
        for r in regions {
            p.extend(r.iter().flat_map(|x| x.to_le_bytes()));
        }
        p
    }

    fn memfd(size: u64) -> OwnedFd {
        crate::xsk::memfd("validate-test", size).unwrap().into()
    }

    #[test]
    fn regions_must_fit_their_files() {
        let mut c = Checker::default();
        let fd = memfd(0x10000);
        assert!(c.check(&msg(SET_MEM_TABLE, &table(&[[0, 0x10000, 0x1000_0000, 0]])), &[fd]).is_ok());
        for (r, why) in [
            ([0, 0x20000, 0x1000_0000, 0], "past the end"),
            ([0, 0x10000, 0x1000_0000, 0x1000], "past the end"),
            ([0, 0x1000, 0x1000_0000, u64::MAX - 0x10], "past the end"),
            ([u64::MAX - 0x10, 0x1000, 0, 0], "wraps"),
            ([0, 0, 0, 0], "size 0"),
        ] {
            let e = c.check(&msg(SET_MEM_TABLE, &table(&[r])), &[memfd(0x10000)]).unwrap_err();
            assert!(e.to_string().contains(why), "{r:?}: {e}");
        }
        let e =
            c.check(&msg(ADD_MEM_REG, &[&[0u8; 8][..], &table(&[[0, 0x20000, 0, 0]])[8..]].concat()), &[memfd(0x1000)]);
        assert!(e.unwrap_err().to_string().contains("past the end"));
        let mut p = [0; 2];
        // SAFETY: p is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: both fds are new and owned here.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let e = c.check(&msg(SET_MEM_TABLE, &table(&[[0, 0x1000, 0, 0]])), &[r]).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn vrings_must_lie_in_guest_memory() {
        let mut c = Checker::default();
        c.check(&msg(SET_MEM_TABLE, &table(&[[0, 0x10000, 0x1000_0000, 0]])), &[memfd(0x10000)]).unwrap();
        c.check(&msg(SET_VRING_NUM, &[1, 0, 0, 0, 64, 0, 0, 0]), &[]).unwrap();
        let addr = |desc: u64, used: u64, avail: u64| {
            let mut p = vec![1, 0, 0, 0, 0, 0, 0, 0];
            for x in [desc, used, avail, 0] {
                p.extend(x.to_le_bytes());
            }
            msg(SET_VRING_ADDR, &p)
        };
        let base = 0x1000_0000u64;
        assert!(c.check(&addr(base, base + 0x1000, base + 0x800), &[]).is_ok());
        // 64 descriptors need 1024 bytes: ending exactly at the region's end fits, a byte more not.
        assert!(c.check(&addr(base + 0x10000 - 1024, base + 0x1000, base + 0x800), &[]).is_ok());
        for (a, what) in [
            (addr(base + 0x10000 - 1023, base + 0x1000, base + 0x800), "descriptor table"),
            (addr(base, base + 0x10000 - 16, base + 0x800), "used ring"),
            (addr(base, base + 0x1000, 0), "avail ring"),
            (addr(u64::MAX - 8, base, base), "descriptor table"),
        ] {
            let e = c.check(&a, &[]).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
    }

    /// A memfd of `size` bytes, sealed against shrinking (as QEMU's vhost-log) or not.
    fn log_memfd(size: u64, sealed: bool) -> OwnedFd {
        // SAFETY: a valid NUL-terminated name; the result is checked and then owned.
        let raw = unsafe { libc::memfd_create(c"validate-log".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0);
        // SAFETY: raw is a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate/fcntl on an fd we own, with integer arguments.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t), 0);
            if sealed {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW), 0);
            }
        }
        fd
    }

    fn new_eventfd() -> OwnedFd {
        // SAFETY: plain eventfd(2); the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, 0) };
        assert!(raw >= 0);
        // SAFETY: raw is a new fd owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(raw) }
    }

    fn log_base(size: u64, offset: u64) -> Vec<u8> {
        msg(SET_LOG_BASE, &[size.to_le_bytes(), offset.to_le_bytes()].concat())
    }

    #[test]
    fn the_dirty_log_must_be_negotiated_sealed_and_cover_guest_memory() {
        let mut c = Checker::default();
        // 64 MiB of guest memory at 1 GiB: pages up to 0x4400_0000 need 0x4400_0000 / 4096 / 8 bytes.
        c.check(&msg(SET_MEM_TABLE, &table(&[[0x4000_0000, 0x400_0000, 0x1000_0000, 0]])), &[memfd(0x400_0000)])
            .unwrap();
        let need = 0x4400_0000u64 / 4096 / 8;
        let e = c.check(&log_base(need, 0), &[log_memfd(need, true)]).unwrap_err();
        assert!(e.to_string().contains("VHOST_USER_PROTOCOL_F_LOG_SHMFD was not negotiated"), "{e}");
        c.check(&msg(SET_PROTOCOL_FEATURES, &(PROTOCOL_F_LOG_SHMFD | 1).to_le_bytes()), &[]).unwrap();
        assert!(c.check(&log_base(need, 0), &[log_memfd(need, true)]).is_ok());
        assert!(c.check(&log_base(need, 4096), &[log_memfd(need + 4096, true)]).is_ok());
        for (m, fds, why) in [
            (log_base(need - 1, 0), vec![log_memfd(need, true)], "needs 34816 bytes"),
            (log_base(need, 0), vec![log_memfd(need - 8, true)], "past the end of the"),
            (log_base(need, 8), vec![log_memfd(2 * need, true)], "page-aligned offset"),
            (log_base(0, 0), vec![log_memfd(need, true)], "need a size"),
            (log_base(need, u64::MAX - 4095), vec![log_memfd(need, true)], "past the end"),
            (log_base(need, 0), vec![log_memfd(need, false)], "not sealed against shrinking"),
            (log_base(need, 0), vec![], "0 fds"),
            (log_base(need, 0), vec![log_memfd(need, true), log_memfd(need, true)], "2 fds"),
            (msg(SET_LOG_BASE, &need.to_le_bytes()), vec![log_memfd(need, true)], "payload of 8 bytes"),
            (log_base(need, 0), vec![new_eventfd()], "not a regular file"),
        ] {
            let e = c.check(&m, &fds).unwrap_err();
            assert!(e.to_string().starts_with("SET_LOG_BASE: ") && e.to_string().contains(why), "{why}: {e}");
        }
        // SET_LOG_FD: one eventfd, made non-blocking.
        let ev = new_eventfd();
        c.check(&msg(SET_LOG_FD, &[]), std::slice::from_ref(&ev)).unwrap();
        // SAFETY: fcntl on an open fd.
        assert_ne!(unsafe { libc::fcntl(ev.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK, 0);
        let e = c.check(&msg(SET_LOG_FD, &[]), &[log_memfd(8, true)]).unwrap_err();
        assert!(e.to_string().contains("SET_LOG_FD: fd is not an eventfd (/memfd:validate-log"), "{e}");
        let e = c.check(&msg(SET_LOG_FD, &[]), &[]).unwrap_err();
        assert!(e.to_string().contains("0 fds, expected one eventfd"), "{e}");
    }

    #[test]
    fn kick_fds_must_be_eventfds_and_become_non_blocking() {
        let mut c = Checker::default();
        // SAFETY: plain eventfd(2); the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, 0) };
        assert!(raw >= 0);
        // SAFETY: raw is a new fd owned by nobody else.
        let ev = unsafe { OwnedFd::from_raw_fd(raw) };
        c.check(&msg(SET_VRING_KICK, &0u64.to_le_bytes()), std::slice::from_ref(&ev)).unwrap();
        // SAFETY: fcntl on an open fd.
        let flags = unsafe { libc::fcntl(ev.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags & libc::O_NONBLOCK, 0, "kick eventfd left blocking");
        let mut p = [0; 2];
        // SAFETY: p is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: both fds are new and owned here.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        for req in [SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR] {
            let e = c.check(&msg(req, &1u64.to_le_bytes()), std::slice::from_ref(&r)).unwrap_err();
            assert!(e.to_string().contains("not an eventfd (pipe:"), "{e}");
        }
        // No fd (NOFD flag): nothing to check.
        assert!(c.check(&msg(SET_VRING_CALL, &(1u64 | VRING_NOFD).to_le_bytes()), &[]).is_ok());
    }
}
