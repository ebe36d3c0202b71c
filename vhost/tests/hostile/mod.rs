//! A hand-written vhost-user frontend for `hostile_frontend.rs`: raw messages over the unix
//! socket (fds in SCM_RIGHTS), memfd guest memory and split rings laid out in it, and the
//! `lanekit-vhost` binary (loopback mode) as a child process so that its fds, threads, RSS and
//! mappings can be counted and a crash shows up as an exit status instead of killing the test.
//! Every socket read has a timeout: a wedged backend is a test failure, never a hung test.
#![allow(dead_code)]

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::zeroed;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Bound on every wait for the backend.
pub const T: Duration = Duration::from_secs(5);

// Requests (vhost-user spec numbering).
pub const GET_FEATURES: u32 = 1;
pub const SET_FEATURES: u32 = 2;
pub const SET_OWNER: u32 = 3;
pub const SET_MEM_TABLE: u32 = 5;
pub const SET_VRING_NUM: u32 = 8;
pub const SET_VRING_ADDR: u32 = 9;
pub const SET_VRING_BASE: u32 = 10;
pub const GET_VRING_BASE: u32 = 11;
pub const SET_VRING_KICK: u32 = 12;
pub const SET_VRING_CALL: u32 = 13;
pub const SET_VRING_ERR: u32 = 14;
pub const GET_PROTOCOL_FEATURES: u32 = 15;
pub const SET_PROTOCOL_FEATURES: u32 = 16;
pub const SET_VRING_ENABLE: u32 = 18;
pub const ADD_MEM_REG: u32 = 37;

const VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;
const F_VERSION_1: u64 = 1 << 32;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const PF_REPLY_ACK: u64 = 1 << 3;
pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;

/// Queue size of every ring; ring `q` lives at `q * 0x1_0000`, its buffers at `BUFS + q * 0x8_0000`.
pub const QSIZE: u16 = 64;
pub const MEM_SIZE: u64 = 4 << 20;
pub const BUFS: u64 = 0x10_0000;
/// The frontend's (made-up) virtual address of guest physical address 0.
pub const UADDR: u64 = 0x7f00_0000_0000;
/// Name of every guest memfd: the backend's mappings of it show up under this in /proc/PID/maps.
pub const MEMFD_NAME: &str = "lk-hostile-guest";

/// The `lanekit-vhost` binary in loopback mode, killed on drop.
pub struct Backend {
    child: Child,
    pub path: PathBuf,
    log: PathBuf,
}

impl Backend {
    pub fn start(tag: &str) -> Backend {
        Self::start_with(tag, &[])
    }

    /// [`Backend::start`] with extra command line arguments.
    pub fn start_with(tag: &str, extra: &[&str]) -> Backend {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("lk-hostile-{}-{tag}.sock", std::process::id()));
        let log = path.with_extension("log");
        let _ = std::fs::remove_file(&path);
        let child = Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
            .env("LANEKIT_LAB", "1") // --loopback is lab-only
            .args(["--loopback", "--queues", "1", "--socket"])
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", "info")
            .stderr(File::create(&log).expect("backend log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start lanekit-vhost");
        let b = Backend { child, path, log };
        let deadline = Instant::now() + T;
        while !b.path.exists() {
            assert!(Instant::now() < deadline, "backend socket did not appear:\n{}", b.log());
            std::thread::sleep(Duration::from_millis(5));
        }
        b
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait (bounded) until the backend's log contains `pat` at least `n` times.
    pub fn wait_log(&self, pat: &str, n: usize) -> bool {
        let deadline = Instant::now() + T;
        while self.log().matches(pat).count() < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Panics (test failure) when the backend process has exited, e.g. on SIGBUS.
    pub fn assert_alive(&mut self, case: &str) {
        if let Some(st) = self.child.try_wait().expect("wait backend") {
            let how = match st.signal() {
                Some(libc::SIGBUS) => "killed by SIGBUS".to_string(),
                Some(s) => format!("killed by signal {s}"),
                None => format!("exited with {st}"),
            };
            panic!("{case}: the backend {how}\n--- backend log ---\n{}", self.log());
        }
    }

    fn proc(&self, what: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{what}", self.pid())).unwrap_or_default()
    }

    fn status_field(&self, key: &str) -> u64 {
        self.proc("status")
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map(|d| d.count()).unwrap_or(0)
    }

    pub fn threads(&self) -> u64 {
        self.status_field("Threads:")
    }

    pub fn rss_kb(&self) -> u64 {
        self.status_field("VmRSS:")
    }

    /// Mappings of guest memfds still in the backend's address space.
    pub fn guest_mappings(&self) -> usize {
        self.proc("maps").lines().filter(|l| l.contains(MEMFD_NAME)).count()
    }

    /// Resource counts while the backend waits for the next frontend.
    pub fn usage(&self) -> Usage {
        Usage { fds: self.fds(), threads: self.threads(), rss_kb: self.rss_kb(), maps: self.guest_mappings() }
    }

    /// Wait until the backend is back to `base` (fds, threads, guest mappings; RSS within
    /// `rss_slack_kb`) after its frontends went away; panics with the counts otherwise.
    pub fn assert_settles(&mut self, base: Usage, rss_slack_kb: u64, case: &str) -> Usage {
        let deadline = Instant::now() + T;
        loop {
            self.assert_alive(case);
            let now = self.usage();
            let ok = now.fds <= base.fds
                && now.threads <= base.threads
                && now.maps == 0
                && now.rss_kb <= base.rss_kb + rss_slack_kb;
            if ok {
                return now;
            }
            if Instant::now() > deadline {
                let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
                    .map(|d| {
                        d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                panic!("{case}: resources accumulate: before {base:?}, after {now:?}\nfds: {fds}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.log);
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub fds: usize,
    pub threads: u64,
    pub rss_kb: u64,
    pub maps: usize,
}

/// What became of a request that expects an answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The answer's payload.
    Reply(Vec<u8>),
    /// The backend closed the connection (it refused the frontend).
    Closed,
    /// No answer within [`T`]: the backend is wedged.
    Hung,
}

impl Outcome {
    /// A REPLY_ACK status of 0.
    pub fn is_ack(&self) -> bool {
        matches!(self, Outcome::Reply(p) if p.as_slice() == 0u64.to_le_bytes())
    }
    /// The frontend's request was refused: an error status or a closed connection.
    pub fn is_refusal(&self) -> bool {
        match self {
            Outcome::Reply(p) => p.as_slice() != 0u64.to_le_bytes(),
            Outcome::Closed => true,
            Outcome::Hung => false,
        }
    }
}

/// One raw vhost-user connection.
pub struct Conn {
    s: UnixStream,
    reply_ack: bool,
}

pub fn msg(req: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + payload.len());
    m.extend(req.to_le_bytes());
    m.extend((VERSION | flags).to_le_bytes());
    m.extend((payload.len() as u32).to_le_bytes());
    m.extend(payload);
    m
}

pub fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

impl Conn {
    pub fn connect(b: &Backend) -> Conn {
        let deadline = Instant::now() + T;
        let s = loop {
            match UnixStream::connect(&b.path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("connect {}: {e}", b.path.display()),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        s.set_read_timeout(Some(T)).unwrap();
        s.set_write_timeout(Some(T)).unwrap();
        Conn { s, reply_ack: false }
    }

    /// Send raw bytes with `fds` attached to the first byte.
    pub fn send_raw(&self, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        // SAFETY: msghdr is plain data; all zeroes is a valid value.
        let mut mh: libc::msghdr = unsafe { zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        if !fds.is_empty() {
            assert!(fds.len() <= 16, "too many fds for the test's control buffer");
            let data_len = std::mem::size_of_val(fds);
            mh.msg_control = cbuf.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is a pure computation.
            mh.msg_controllen = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
            // SAFETY: cbuf (128 bytes) holds CMSG_SPACE(16 * 4); header and data stay inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&mh);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(data_len as u32) as usize;
                std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
            }
        }
        // SAFETY: mh and the buffers it points to are valid for the call.
        let n = unsafe { libc::sendmsg(self.s.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        (&self.s).write_all(&bytes[n as usize..])
    }

    pub fn send(&self, req: u32, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_raw(&msg(req, 0, payload), fds)
    }

    /// Read one reply; `Closed` on end of stream or reset, `Hung` on timeout.
    pub fn recv(&mut self) -> Outcome {
        let mut hdr = [0u8; 12];
        match self.s.read_exact(&mut hdr) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Outcome::Hung,
            Err(_) => return Outcome::Closed,
        }
        let f = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        assert_ne!(f(4) & FLAG_REPLY, 0, "a message from the backend that is not a reply: {hdr:?}");
        let mut p = vec![0u8; f(8) as usize];
        match self.s.read_exact(&mut p) {
            Ok(()) => Outcome::Reply(p),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Outcome::Hung,
            Err(_) => Outcome::Closed,
        }
    }

    /// A request that always has an answer (GET_*).
    pub fn get(&mut self, req: u32, payload: &[u8]) -> Outcome {
        if self.send(req, payload, &[]).is_err() {
            return Outcome::Closed;
        }
        self.recv()
    }

    /// A request answered with a REPLY_ACK status (REPLY_ACK must be negotiated).
    pub fn ack(&mut self, req: u32, payload: &[u8], fds: &[RawFd]) -> Outcome {
        assert!(self.reply_ack, "REPLY_ACK not negotiated");
        if self.send_raw(&msg(req, NEED_REPLY, payload), fds).is_err() {
            return Outcome::Closed;
        }
        self.recv()
    }

    /// Wait (bounded) until the backend closes the connection; false if it does not.
    pub fn closed_by_backend(&mut self) -> bool {
        matches!(self.recv(), Outcome::Closed)
    }

    /// SET_OWNER, features (VERSION_1 + protocol features) and REPLY_ACK.
    pub fn handshake(&mut self) {
        self.handshake_with(0);
    }

    /// [`Conn::handshake`] acking `extra` feature bits too (each must be offered).
    pub fn handshake_with(&mut self, extra: u64) {
        self.send(SET_OWNER, &[], &[]).unwrap();
        let Outcome::Reply(f) = self.get(GET_FEATURES, &[]) else { panic!("no GET_FEATURES reply") };
        let offered = u64::from_le_bytes(f.try_into().unwrap());
        assert_ne!(offered & F_PROTOCOL_FEATURES, 0);
        assert_eq!(offered & extra, extra, "features {extra:#x} not all offered ({offered:#x})");
        self.send(SET_FEATURES, &u64s(&[F_VERSION_1 | F_PROTOCOL_FEATURES | extra]), &[]).unwrap();
        let Outcome::Reply(pf) = self.get(GET_PROTOCOL_FEATURES, &[]) else { panic!("no protocol features") };
        assert_ne!(u64::from_le_bytes(pf.try_into().unwrap()) & PF_REPLY_ACK, 0);
        self.send(SET_PROTOCOL_FEATURES, &u64s(&[PF_REPLY_ACK]), &[]).unwrap();
        self.reply_ack = true;
    }
}

/// One region of a SET_MEM_TABLE.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub gpa: u64,
    pub size: u64,
    pub uaddr: u64,
    pub offset: u64,
}

impl Region {
    /// The whole of a guest memory of `size` bytes at gpa 0.
    pub fn whole(size: u64) -> Region {
        Region { gpa: 0, size, uaddr: UADDR, offset: 0 }
    }
}

pub fn mem_table(regions: &[Region]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend((regions.len() as u32).to_le_bytes());
    p.extend(0u32.to_le_bytes());
    for r in regions {
        p.extend(u64s(&[r.gpa, r.size, r.uaddr, r.offset]));
    }
    p
}

/// A memfd named [`MEMFD_NAME`]; sealed against shrinking and growing when `seal`.
pub fn memfd(size: u64, seal: bool) -> File {
    let name = CString::new(MEMFD_NAME).unwrap();
    let flags = libc::MFD_CLOEXEC | if seal { libc::MFD_ALLOW_SEALING } else { 0 };
    // SAFETY: name is a valid NUL-terminated string.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: fd is a new descriptor owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    if seal {
        // SAFETY: fcntl on an fd we own, with an integer argument.
        let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
        assert_eq!(r, 0, "seal memfd: {}", io::Error::last_os_error());
    }
    f
}

/// Split ring `q`'s addresses (guest physical).
pub fn desc_table(q: usize) -> u64 {
    0x1_0000 * q as u64
}
pub fn avail_ring(q: usize) -> u64 {
    desc_table(q) + 16 * u64::from(QSIZE)
}
pub fn used_ring(q: usize) -> u64 {
    (avail_ring(q) + 6 + 2 * u64::from(QSIZE) + 3) & !3
}
pub fn buf(q: usize, slot: u64) -> u64 {
    BUFS + 0x8_0000 * q as u64 + 2048 * slot
}

/// The guest side of one connection: memory, rings, kick and call eventfds.
pub struct Guest {
    pub conn: Conn,
    pub file: File,
    pub mem: GuestMemoryMmap,
    pub kicks: Vec<EventFd>,
    pub calls: Vec<EventFd>,
    next_desc: Vec<u16>,
    avail_idx: Vec<u16>,
}

/// The queues of a one-pair device: RX 0, TX 1, control 2.
pub const RX: usize = 0;
pub const TX: usize = 1;
pub const NQ: usize = 3;

impl Guest {
    /// Connect, negotiate, and create (but do not send) memory of [`MEM_SIZE`] bytes.
    pub fn new(b: &Backend, seal: bool) -> Guest {
        let file = memfd(MEM_SIZE, seal);
        Self::with_file(b, file, MEM_SIZE)
    }

    /// Like [`Guest::new`] (sealed memory), acking the `extra` feature bits too.
    pub fn with_features(b: &Backend, extra: u64) -> Guest {
        Self::connect(b, memfd(MEM_SIZE, true), MEM_SIZE, extra)
    }

    /// Like [`Guest::new`] with a file of the caller's; the test maps `mapped` bytes of it.
    pub fn with_file(b: &Backend, file: File, mapped: u64) -> Guest {
        Self::connect(b, file, mapped, 0)
    }

    fn connect(b: &Backend, file: File, mapped: u64, extra: u64) -> Guest {
        let mem = GuestMemoryMmap::from_ranges_with_files(&[(
            GuestAddress(0),
            mapped as usize,
            Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let mut conn = Conn::connect(b);
        conn.handshake_with(extra);
        let ev = || (0..NQ).map(|_| EventFd::new(EFD_NONBLOCK).unwrap()).collect::<Vec<_>>();
        Guest { conn, file, mem, kicks: ev(), calls: ev(), next_desc: vec![0; NQ], avail_idx: vec![0; NQ] }
    }

    pub fn set_mem_table(&mut self, regions: &[Region]) -> Outcome {
        let fds = vec![self.file.as_raw_fd(); regions.len()];
        self.conn.ack(SET_MEM_TABLE, &mem_table(regions), &fds)
    }

    /// Ring addresses as the frontend's virtual addresses.
    pub fn vring_addr(q: usize, desc: u64, used: u64, avail: u64) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend((q as u32).to_le_bytes());
        p.extend(0u32.to_le_bytes());
        p.extend(u64s(&[desc, used, avail, 0]));
        p
    }

    /// SET_VRING_NUM / ADDR / BASE for ring `q` at its standard place; each must be acked.
    pub fn ring(&mut self, q: usize) -> Outcome {
        let c = &mut self.conn;
        for (req, p) in [
            (SET_VRING_NUM, state(q as u32, u32::from(QSIZE))),
            (SET_VRING_ADDR, Self::vring_addr(q, UADDR + desc_table(q), UADDR + used_ring(q), UADDR + avail_ring(q))),
            (SET_VRING_BASE, state(q as u32, 0)),
        ] {
            let o = c.ack(req, &p, &[]);
            if !o.is_ack() {
                return o;
            }
        }
        Outcome::Reply(0u64.to_le_bytes().to_vec())
    }

    /// SET_VRING_CALL / KICK with the given fds, then SET_VRING_ENABLE.
    pub fn ring_fds(&mut self, q: usize, call: RawFd, kick: RawFd) -> Outcome {
        let c = &mut self.conn;
        for (req, fd) in [(SET_VRING_CALL, call), (SET_VRING_KICK, kick)] {
            let o = c.ack(req, &u64s(&[q as u64]), &[fd]);
            if !o.is_ack() {
                return o;
            }
        }
        c.ack(SET_VRING_ENABLE, &state(q as u32, 1), &[])
    }

    /// The whole well-behaved setup: memory table and every ring with its eventfds.
    pub fn setup(&mut self) {
        let o = self.set_mem_table(&[Region::whole(MEM_SIZE)]);
        assert!(o.is_ack(), "SET_MEM_TABLE: {o:?}");
        for q in 0..NQ {
            let o = self.ring(q);
            assert!(o.is_ack(), "ring {q}: {o:?}");
            let (call, kick) = (self.calls[q].as_raw_fd(), self.kicks[q].as_raw_fd());
            let o = self.ring_fds(q, call, kick);
            assert!(o.is_ack(), "ring {q} fds: {o:?}");
        }
    }

    pub fn write_desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = desc_table(q) + 16 * u64::from(i);
        self.mem.write_obj(addr, GuestAddress(at)).unwrap();
        self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    /// Put `head` on the available ring (without kicking).
    pub fn publish(&mut self, q: usize, head: u16) {
        let slot = avail_ring(q) + 4 + 2 * u64::from(self.avail_idx[q] % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx[q] = self.avail_idx[q].wrapping_add(1);
        self.mem.store(self.avail_idx[q], GuestAddress(avail_ring(q) + 2), Ordering::Release).unwrap();
    }

    /// Take `n` fresh descriptor slots of ring `q`.
    pub fn alloc(&mut self, q: usize, n: u16) -> u16 {
        let first = self.next_desc[q];
        self.next_desc[q] = (first + n) % QSIZE;
        first
    }

    /// Make a chain of (gpa, len, writable) descriptors available; returns its head.
    pub fn chain(&mut self, q: usize, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.alloc(q, descs.len() as u16);
        for (k, &(addr, len, w)) in descs.iter().enumerate() {
            let i = (head + k as u16) % QSIZE;
            let more = k + 1 < descs.len();
            let flags = if w { DESC_F_WRITE } else { 0 } | if more { DESC_F_NEXT } else { 0 };
            self.write_desc(q, i, addr, len, flags, (i + 1) % QSIZE);
        }
        self.publish(q, head);
        head
    }

    pub fn kick(&self, q: usize) {
        self.kicks[q].write(1).unwrap();
    }

    pub fn used_idx(&self, q: usize) -> u16 {
        self.mem.load(GuestAddress(used_ring(q) + 2), Ordering::Acquire).unwrap()
    }

    pub fn used_elem(&self, q: usize, i: u16) -> (u32, u32) {
        let at = used_ring(q) + 4 + 8 * u64::from(i % QSIZE);
        (self.mem.read_obj(GuestAddress(at)).unwrap(), self.mem.read_obj(GuestAddress(at + 4)).unwrap())
    }

    /// Wait (bounded) until ring `q`'s used index reaches `n`.
    pub fn wait_used(&self, q: usize, n: u16) -> bool {
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            if self.used_idx(q).wrapping_sub(n) < 0x8000 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Send one frame on TX and expect it back on RX (loopback backend): the device works.
    pub fn round_trip(&mut self, seed: u8) {
        let frame: Vec<u8> = [0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x88, 0xb5]
            .into_iter()
            .chain((0..100u8).map(|i| i.wrapping_mul(7).wrapping_add(seed)))
            .collect();
        let rx_slot = u64::from(self.next_desc[RX]);
        let rx_buf = buf(RX, rx_slot);
        let rx_used = self.used_idx(RX);
        let head = self.chain(RX, &[(rx_buf, 2048, true)]);
        self.kick(RX);
        let tx_buf = buf(TX, u64::from(self.next_desc[TX]));
        self.mem.write_slice(&[0u8; 12], GuestAddress(tx_buf)).unwrap();
        self.mem.write_slice(&frame, GuestAddress(tx_buf + 12)).unwrap();
        let tx_used = self.used_idx(TX);
        self.chain(TX, &[(tx_buf, 12 + frame.len() as u32, false)]);
        self.kick(TX);
        assert!(self.wait_used(TX, tx_used.wrapping_add(1)), "the TX chain was not returned");
        // Bad chains the guest queued before this buffer come back first (length 0).
        let deadline = Instant::now() + T;
        let len = loop {
            let now = self.used_idx(RX);
            let mut i = rx_used;
            let found = loop {
                if i == now {
                    break None;
                }
                let (id, len) = self.used_elem(RX, i);
                if id == u32::from(head) {
                    break Some(len);
                }
                i = i.wrapping_add(1);
            };
            if let Some(len) = found {
                break len;
            }
            assert!(Instant::now() < deadline, "the frame did not come back on RX");
            std::thread::sleep(Duration::from_millis(1));
        };
        let mut got = vec![0u8; len as usize];
        self.mem.read_slice(&mut got, GuestAddress(rx_buf)).unwrap();
        assert_eq!(&got[12..], &frame[..], "looped-back frame");
    }

    /// GET_VRING_BASE on every ring (stops them), as a frontend does before it goes away.
    pub fn stop(&mut self) -> Outcome {
        for q in 0..NQ {
            let o = self.conn.get(GET_VRING_BASE, &state(q as u32, 0));
            if !matches!(o, Outcome::Reply(_)) {
                return o;
            }
        }
        Outcome::Reply(Vec::new())
    }
}

/// A well-behaved frontend: full setup, one round trip, orderly stop. Proves the backend still
/// serves after whatever the previous frontend did.
pub fn serve_check(b: &mut Backend, case: &str) {
    b.assert_alive(case);
    let mut g = Guest::new(b, true);
    g.setup();
    g.round_trip(0x5a);
    let o = g.stop();
    assert!(matches!(o, Outcome::Reply(_)), "{case}: well-behaved frontend: GET_VRING_BASE: {o:?}");
    drop(g);
    b.assert_alive(case);
}
