//! Harnesses shared by the cargo-fuzz targets in `fuzz/` and the randomized tests that run in
//! `cargo test`: arbitrary bytes as guest rings and memory, and as vhost-user messages.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::net::{self, NetMode, RxState, Stats, StatsSnapshot, TxState};
use crate::offload;
use crate::port::{LoopPort, Port};
use crate::{serve, DeviceConfig, NetBackend};

/// Queue size used by [`queues_from_bytes`].
pub const QSIZE: u16 = 16;
const MEM: usize = 0x2_0000;
const DESC: u64 = 0;
const AVAIL: u64 = 0x100;
const USED: u64 = 0x200;
const DATA: u64 = 0x1000;

/// Lay `data` out as a 16-entry split queue (avail idx, avail ring, descriptor table, then
/// buffer memory) and run the TX, RX and control queue code over it, each on a fresh `Queue`
/// over the same rings. Returns the counters; must never panic or hang.
pub fn queues_from_bytes(data: &[u8]) -> StatsSnapshot {
    let mem = match GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) {
        Ok(m) => m,
        Err(_) => return StatsSnapshot::default(),
    };
    let header = 2 + 2 * usize::from(QSIZE) + 16 * usize::from(QSIZE);
    let mut raw = vec![0u8; header];
    let n = data.len().min(header);
    raw[..n].copy_from_slice(&data[..n]);
    // The lengths fit: header < MEM - DATA and the rest is clamped to the data area.
    let _ = mem.write_slice(&raw[..2], GuestAddress(AVAIL + 2));
    let _ = mem.write_slice(&raw[2..2 + 2 * usize::from(QSIZE)], GuestAddress(AVAIL + 4));
    let _ = mem.write_slice(&raw[2 + 2 * usize::from(QSIZE)..], GuestAddress(DESC));
    let rest = &data[n..];
    let rest = &rest[..rest.len().min(MEM - DATA as usize)];
    let _ = mem.write_slice(rest, GuestAddress(DATA));
    let stats = Stats::default();
    let mode = NetMode {
        hdr_len: net::HDR_LEN,
        mergeable: data.first().is_some_and(|b| b & 1 == 1),
        max_frame: 1518,
        hash_report: false,
        // Half the inputs with every TX offload negotiated: their headers are parsed and
        // checked against the frames.
        offloads: if data.get(2).is_some_and(|b| b & 1 == 1) {
            crate::offload::Offloads::ALL
        } else {
            crate::offload::Offloads::NONE
        },
        rx_hash: None,
    };
    let new_queue = || -> Option<Queue> {
        let mut q = Queue::new(QSIZE).ok()?;
        q.set_size(QSIZE);
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_event_idx(data.get(1).is_some_and(|b| b & 1 == 1));
        q.set_ready(true);
        Some(q)
    };
    let Ok(mut port) = LoopPort::new(0) else { return stats.snapshot() };
    if let Some(mut q) = new_queue() {
        net::tx_queue(&mut q, &mem, &mut port, &mut TxState::default(), mode, &stats, 64);
    }
    if let Some(mut q) = new_queue() {
        // Frames looped back from the TX run plus one of every size class, and (GUEST_TSO
        // negotiated with every offload) a TCP flow that coalesces into one segment across
        // several of the fuzzed chains.
        let mut b = crate::port::Batch::default();
        for len in [14usize, 60, 1514] {
            b.push(&vec![0xab; len]);
        }
        for f in wire(data.get(3).is_some_and(|b| b & 1 == 1), 4 * 1448 + 7, 1448, 4000, 1) {
            b.push(&f);
        }
        let _ = port.send(&b);
        net::rx_queue(&mut q, &mem, &mut port, &mut RxState::default(), mode, &stats, 64);
    }
    if let Some(mut q) = new_queue() {
        net::ctrl_queue(
            &mut q,
            &mem,
            4,
            net::CtrlFeatures { rss: true, hash_report: true, guest_offloads: net::GUEST_OFFLOAD_BITS },
            &stats,
            64,
        );
    }
    stats.snapshot()
}

/// Write `data` to a new connection on a vhost-user socket, close our side for writing and wait
/// (bounded) until the backend closes. Returns false if the backend neither answered nor closed
/// within `timeout`.
pub fn send_raw(path: &Path, data: &[u8], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return false,
        }
    };
    let _ = s.set_write_timeout(Some(timeout));
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A loopback backend serving forever on a private socket, for message fuzzing.
pub struct MessageTarget {
    /// Socket path.
    pub path: PathBuf,
    /// The backend.
    pub backend: Arc<NetBackend>,
}

impl MessageTarget {
    /// Start a one-queue-pair loopback backend on a socket under the temp dir.
    pub fn start(tag: &str) -> std::io::Result<MessageTarget> {
        let path = std::env::temp_dir().join(format!("lk-vhost-fuzz-{}-{tag}.sock", std::process::id()));
        let port: Box<dyn Port> = Box::new(LoopPort::new(0)?);
        let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 9], queue_pairs: 1, mtu: 1500 };
        let backend = Arc::new(NetBackend::new(cfg, vec![port]).map_err(std::io::Error::other)?);
        let (b, p) = (backend.clone(), path.clone());
        std::thread::spawn(move || {
            if let Err(e) = serve(b, &p, None) {
                log::error!("fuzz target backend stopped: {e}");
            }
        });
        Ok(MessageTarget { path, backend })
    }
}

/// A memfd of `size` bytes, sealed against shrinking and growing (as QEMU's vhost-log) or not.
fn log_memfd(size: u64, sealed: bool) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a valid NUL-terminated name; the result is checked before use.
    let raw = unsafe { libc::memfd_create(c"lk-fuzz-log".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: raw is a new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone()?).set_len(size)?;
    if sealed {
        // SAFETY: fcntl on an fd we own, with integer arguments.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Bytes consumed front to back, zeros once exhausted.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
}

/// An fd of the kind `k` picks (memfd sealed or not of `size` bytes, eventfd, pipe, none, two).
fn fds_of_kind(k: u8, size: u64) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let pipe = || {
        let mut p = [0; 2];
        // SAFETY: p is a valid array of two ints.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Vec::new();
        }
        // SAFETY: both fds are new and owned here.
        unsafe { vec![OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])] }
    };
    match k % 6 {
        0 => log_memfd(size, true).into_iter().collect(),
        1 => log_memfd(size, false).into_iter().collect(),
        2 => vmm_sys_util::eventfd::EventFd::new(0)
            .map(|e| {
                use std::os::fd::IntoRawFd;
                // SAFETY: a new eventfd handed over to OwnedFd.
                unsafe { OwnedFd::from_raw_fd(e.into_raw_fd()) }
            })
            .into_iter()
            .collect(),
        3 => pipe().into_iter().take(1).collect(),
        4 => Vec::new(),
        _ => log_memfd(size, true).into_iter().chain(log_memfd(size, true)).collect(),
    }
}

/// Drive the live-migration messages from `data` on a new connection to a vhost-user socket:
/// a handshake (`SET_OWNER`, `GET_FEATURES`, features with or without `VHOST_F_LOG_ALL`, protocol features with
/// or without `LOG_SHMFD`, a memory table of a memfd), then up to 16 of `SET_LOG_BASE`,
/// `SET_LOG_FD` (payloads and fds of every kind: sealed and unsealed memfds of any size, eventfds,
/// pipes, none, two), `SET_FEATURES`, `SET_MEM_TABLE` and raw messages. Closes our side and
/// waits (bounded) until the backend closes. False if the backend neither answered nor closed
/// within `timeout`.
pub fn log_messages(path: &Path, data: &[u8], timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    let s = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return false,
        }
    };
    let _ = s.set_write_timeout(Some(timeout));
    let send = |req: u32, payload: &[u8], fds: &[std::os::fd::OwnedFd]| -> bool {
        let mut m = Vec::with_capacity(12 + payload.len());
        m.extend(req.to_le_bytes());
        m.extend(1u32.to_le_bytes());
        m.extend((payload.len() as u32).to_le_bytes());
        m.extend(payload);
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        match crate::handover::sendmsg_fds(s.as_raw_fd(), &m, &raw) {
            Ok(n) => (&s).write_all(&m[n..]).is_ok(),
            Err(_) => false,
        }
    };
    let mut d = Input(data);
    let flags = d.u8();
    let base_features = crate::backend::VIRTIO_FEATURES | 1 << 30;
    let log_all = |on: bool| if on { 1u64 << crate::dirty::VHOST_F_LOG_ALL } else { 0 };
    let protocol: u64 = 0b1 | 1 << 3 | 1 << 9 | if flags & 1 != 0 { 1 << 1 } else { 0 };
    let mem_table = |pages: u16, gpa: u64| -> (Vec<u8>, Vec<std::os::fd::OwnedFd>) {
        let size = u64::from(pages.max(1)) * 4096;
        let fds: Vec<_> = crate::xsk::memfd("lk-fuzz-guest", size).map(Into::into).into_iter().collect();
        let mut p = 1u64.to_le_bytes().to_vec();
        for x in [gpa, size, 0x7f00_0000_0000u64, 0] {
            p.extend(x.to_le_bytes());
        }
        (p, fds)
    };
    // The GET_* replies are drained at the end.
    let mut ok = send(3, &[], &[])
        && send(1, &[], &[])
        && send(2, &(base_features | log_all(flags & 2 != 0)).to_le_bytes(), &[])
        && send(15, &[], &[])
        && send(16, &protocol.to_le_bytes(), &[]);
    let (p, fds) = mem_table(d.u16(), u64::from(d.u8()) << 20);
    ok = ok && send(5, &p, &fds);
    for _ in 0..16 {
        if !ok || d.0.is_empty() {
            break;
        }
        ok = match d.u8() % 5 {
            0 => {
                // Sizes and offsets near the valid ones (a log covers 128 MiB per 4 KiB), so that
                // some logs are accepted and mapped.
                let size = u64::from(d.u16());
                let offset: u64 = match d.u8() % 8 {
                    0 => 2048,
                    1 => 4096,
                    _ => 0,
                };
                let kind = d.u8();
                let mut p = [size.to_le_bytes(), offset.to_le_bytes()].concat();
                if kind & 0xc0 == 0xc0 {
                    p.truncate(usize::from(kind & 0xf));
                }
                let file = u64::from(d.u16()) * 16;
                // Half of them a sealed memfd, as QEMU sends.
                send(6, &p, &fds_of_kind(if kind & 0x20 == 0 { 0 } else { kind }, file))
            }
            1 => {
                let kind = d.u8();
                send(7, &[], &fds_of_kind(kind, 4096))
            }
            2 => {
                let on = d.u8() & 1 != 0;
                send(2, &(base_features | log_all(on)).to_le_bytes(), &[])
            }
            3 => {
                let (p, fds) = mem_table(d.u16(), u64::from(d.u8()) << 20);
                send(5, &p, &fds)
            }
            _ => {
                let req = u32::from(d.u8() % 50);
                let n = usize::from(d.u8() % 24);
                let p: Vec<u8> = (0..n).map(|_| d.u8()).collect();
                send(req, &p, &[])
            }
        };
    }
    let _ = s.shutdown(Shutdown::Write);
    let mut s = s;
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

// Offload test packets, shared by the unit tests, `tests/fuzz_random.rs` and the hostile-frontend test.

/// A reference ones' complement checksum, written independently of `csum_add` / `csum_fold`:
/// 32-bit accumulation of 16-bit words, end-around carry, complement.
pub fn reference_csum(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.concat();
    let mut sum: u32 = 0;
    for i in (0..bytes.len()).step_by(2) {
        let hi = u32::from(bytes[i]) << 8;
        let lo = bytes.get(i + 1).map_or(0, |b| u32::from(*b));
        sum += hi | lo;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The L4 checksum a receiver verifies: 0 when `frame`'s L4 checksum is right.
pub fn l4_check(frame: &[u8], v4: bool) -> u16 {
    let (l3, proto, l4) =
        if v4 { (14, frame[14 + 9], 14 + usize::from(frame[14] & 0xf) * 4) } else { (14, frame[14 + 6], 54) };
    let addrs = if v4 { &frame[l3 + 12..l3 + 20] } else { &frame[l3 + 8..l3 + 40] };
    let len = (frame.len() - l4) as u32;
    let pseudo = [&[0u8, proto][..], &len.to_be_bytes()[..]].concat();
    reference_csum(&[addrs, &pseudo, &frame[l4..]])
}

/// An Ethernet + IPv4/IPv6 + TCP (or UDP) frame with `payload` bytes, as a guest hands it over
/// with NEEDS_CSUM: the L4 checksum field holds the pseudo-header sum (lengths as sent).
pub fn packet(v4: bool, tcp: bool, payload: usize, tcp_flags: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    f.extend_from_slice(&(if v4 { 0x0800u16 } else { 0x86ddu16 }).to_be_bytes());
    let proto = if tcp { 6u8 } else { 17u8 };
    let l4len = if tcp { 32 } else { 8 } + payload;
    if v4 {
        let tot = (20 + l4len) as u16;
        f.extend_from_slice(&[0x45, 0, (tot >> 8) as u8, tot as u8, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let c = reference_csum(&[&f[14..34]]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    } else {
        f.extend_from_slice(&[0x60, 0, 0, 0, (l4len >> 8) as u8, l4len as u8, proto, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    }
    let l4 = f.len();
    if tcp {
        // Ports, seq 0xfffff000 (wraps while cut), ack, doff 8 (12 bytes of options), flags.
        f.extend_from_slice(&[0x30, 0x39, 0x00, 0x50, 0xff, 0xff, 0xf0, 0x00, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x80, tcp_flags, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    } else {
        f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35, (l4len >> 8) as u8, l4len as u8, 0, 0]);
    }
    f.extend((0..payload).map(|i| (i * 7 + 3) as u8));
    // The guest's partial checksum: the folded pseudo-header sum, not complemented.
    let addrs = if v4 { f[26..34].to_vec() } else { f[22..54].to_vec() };
    let partial = offload::csum_fold(offload::csum_add(0, &addrs) + l4len as u64 + u64::from(proto));
    let at = l4 + if tcp { 16 } else { 6 };
    f[at..at + 2].copy_from_slice(&partial.to_be_bytes());
    f
}

/// `payload` bytes of one TCP flow as the wire carries them: cut at `mss` into frames with
/// correct checksums (PSH on the last), from port `port` and sequence number `seq` on.
pub fn wire(v4: bool, payload: usize, mss: usize, port: u16, seq: u32) -> Vec<Vec<u8>> {
    let mut f = packet(v4, true, payload, 0x18);
    let l4 = if v4 { 34 } else { 54 };
    f[l4..l4 + 2].copy_from_slice(&port.to_be_bytes());
    f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
    let h = gso_hdr(&f, if v4 { 1 } else { 4 }, mss as u16);
    let Ok(offload::Plan::Gso(g)) = offload::plan(&h, &f, offload::Offloads::ALL, offload::MAX_GSO_FRAME) else {
        return Vec::new();
    };
    let mut o = vec![0u8; offload::MAX_GSO_FRAME];
    (0..g.segs).filter_map(|i| offload::write_segment(&f, &g, i, &mut o).map(|n| o[..n].to_vec())).collect()
}

/// The header a guest sends for `frame`: NEEDS_CSUM at the L4 checksum, GSO `gso_type` of `mss`.
pub fn gso_hdr(frame: &[u8], gso_type: u8, mss: u16) -> offload::TxHdr {
    let v4 = frame[12..14] == 0x0800u16.to_be_bytes();
    let l4 = if v4 { 34 } else { 54 };
    let tcp = frame[if v4 { 23 } else { 20 }] == 6u8;
    offload::TxHdr {
        flags: offload::F_NEEDS_CSUM,
        gso_type,
        hdr_len: (l4 + if tcp { 32 } else { 8 }) as u16,
        gso_size: mss,
        csum_start: l4 as u16,
        csum_offset: if tcp { 16 } else { 6 },
    }
}
