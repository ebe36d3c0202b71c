//! A minimal virtio-net "guest driver" for integration tests: memfd guest memory, split rings
//! laid out in it, and a vhost-user frontend that hands both to the backend.
#![allow(dead_code)]

pub mod drivers;
pub mod netns;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lanekit_vhost::xsk::memfd;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub const QSIZE: u16 = 256;
pub const MEM_SIZE: usize = 16 << 20;
pub const BUF: u64 = 2048;
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;

/// Features a Linux guest would ack, offloads included (a Linux 6.1 guest behind QEMU 7.2 acks
/// these; see `tests/qemu_guest.rs`).
pub const GUEST_FEATURES: u64 = 1 << 32 // VERSION_1
    | 1 // CSUM
    | 1 << 1 // GUEST_CSUM
    | 1 << 11 // HOST_TSO4
    | 1 << 12 // HOST_TSO6
    | 1 << 13 // HOST_ECN
    | 1 << 15 // MRG_RXBUF
    | 1 << 29 // EVENT_IDX
    | 1 << 22 // MQ
    | 1 << 17 // CTRL_VQ
    | 1 << 5 // MAC
    | 1 << 16 // STATUS
    | 1 << 30; // VHOST_USER_F_PROTOCOL_FEATURES

/// Protocol features the tests ack by default.
pub const BASE_PROTOCOL: VhostUserProtocolFeatures =
    VhostUserProtocolFeatures::MQ.union(VhostUserProtocolFeatures::CONFIG).union(VhostUserProtocolFeatures::REPLY_ACK);

/// A unique socket path under the temp dir.
pub fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lk-vhost-{}-{name}.sock", std::process::id()))
}

/// One split virtqueue driven from the guest side.
pub struct GuestQueue {
    pub base: u64,
    pub bufs: u64,
    pub kick: EventFd,
    pub call: EventFd,
    next_desc: u16,
    avail_idx: u16,
    pub seen_used: u16,
}

impl GuestQueue {
    /// The descriptor the next chain starts at.
    pub fn next_desc(&self) -> u16 {
        self.next_desc
    }
    fn desc(&self) -> u64 {
        self.base
    }
    fn avail(&self) -> u64 {
        self.base + 16 * u64::from(QSIZE)
    }
    fn used(&self) -> u64 {
        (self.avail() + 6 + 2 * u64::from(QSIZE) + 3) & !3
    }
    /// The ring's addresses for `SET_VRING_ADDR`, guest memory mapped at `hva`.
    fn vring_config(&self, hva: u64) -> VringConfigData {
        VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: hva + self.desc(),
            used_ring_addr: hva + self.used(),
            avail_ring_addr: hva + self.avail(),
            log_addr: None,
        }
    }
}

/// `nq` rings laid out one after another in guest memory, each with its buffers.
fn new_queues(nq: usize) -> Vec<GuestQueue> {
    (0..nq)
        .map(|q| GuestQueue {
            base: 0x1_0000 * q as u64,
            bufs: 0x10_0000 + 0x8_0000 * q as u64,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
            next_desc: 0,
            avail_idx: 0,
            seen_used: 0,
        })
        .collect()
}

/// Map the guest memory `file` here: the mapping, its region for `SET_MEM_TABLE` and its
/// address in this process (what a frontend gives the backend as ring addresses).
fn map_guest_memory(file: &File) -> (GuestMemoryMmap, VhostUserMemoryRegionInfo, u64) {
    let mem = GuestMemoryMmap::from_ranges_with_files(&[(
        GuestAddress(0),
        MEM_SIZE,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )])
    .unwrap();
    let region = mem.iter().next().unwrap();
    let info = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
    let hva = region.as_ptr() as u64;
    (mem, info, hva)
}

/// Connect a frontend with `nq` queues to the backend's socket at `path`, waiting up to 5 s
/// for the socket to appear.
fn dial(path: &Path, nq: usize) -> Frontend {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    Frontend::connect(path, nq as u64).unwrap()
}

pub struct Guest {
    pub mem: GuestMemoryMmap,
    _file: File,
    hva: u64,
    pub fe: Frontend,
    pub queues: Vec<GuestQueue>,
    pub features: u64,
}

impl Guest {
    /// Connect to `path` and set up `pairs` queue pairs plus the control queue.
    pub fn connect(path: &Path, pairs: u16, features: u64) -> Guest {
        Self::connect_with(path, pairs, features, BASE_PROTOCOL)
    }

    /// [`Guest::connect`] acking the offered protocol features in `protocol`.
    pub fn connect_with(path: &Path, pairs: u16, features: u64, protocol: VhostUserProtocolFeatures) -> Guest {
        let nq = 2 * usize::from(pairs) + 1;
        let file = memfd("guest", MEM_SIZE as u64).unwrap();
        let queues = new_queues(nq);
        Self::start(path, file, queues, &vec![0; nq], features, protocol)
    }

    /// Set up a frontend connection on `path` for guest memory `file` and the queues as they
    /// are, starting each ring at `bases` (`SET_VRING_BASE`).
    fn start(
        path: &Path,
        file: File,
        queues: Vec<GuestQueue>,
        bases: &[u32],
        features: u64,
        protocol: VhostUserProtocolFeatures,
    ) -> Guest {
        let nq = queues.len();
        let (mem, info, hva) = map_guest_memory(&file);
        let mut fe = dial(path, nq);
        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        let features = offered & features;
        fe.set_features(features).unwrap();
        if features & (1 << 30) != 0 {
            let pf = fe.get_protocol_features().unwrap();
            fe.set_protocol_features(pf & protocol).unwrap();
            assert!(fe.get_queue_num().unwrap() >= nq as u64);
        }
        fe.set_mem_table(&[info]).unwrap();
        for (q, gq) in queues.iter().enumerate() {
            fe.set_vring_num(q, QSIZE).unwrap();
            fe.set_vring_addr(q, &gq.vring_config(hva)).unwrap();
            fe.set_vring_base(q, bases[q] as u16).unwrap();
            fe.set_vring_call(q, &gq.call).unwrap();
            fe.set_vring_kick(q, &gq.kick).unwrap();
            if features & (1 << 30) != 0 {
                fe.set_vring_enable(q, true).unwrap();
            }
        }
        Guest { mem, _file: file, hva, fe, queues, features }
    }

    /// Connect the way QEMU sets a device up and starts it: every ring's call eventfd is `stale`
    /// first (QEMU's "masked notifier" from device set-up), the rings are enabled before they
    /// start, and each ring gets its size, base and addresses; [`Guest::start_ring`] then starts
    /// it with the kick, before the caller sets the real call eventfd (QEMU's order on start and
    /// on a migration's destination).
    pub fn connect_stale_call(path: &Path, pairs: u16, protocol: VhostUserProtocolFeatures, stale: &EventFd) -> Guest {
        let nq = 2 * usize::from(pairs) + 1;
        let file = memfd("guest", MEM_SIZE as u64).unwrap();
        let (mem, info, hva) = map_guest_memory(&file);
        let mut fe = dial(path, nq);
        fe.set_owner().unwrap();
        let features = fe.get_features().unwrap() & GUEST_FEATURES;
        fe.set_features(features).unwrap();
        let pf = fe.get_protocol_features().unwrap();
        fe.set_protocol_features(pf & protocol).unwrap();
        let queues = new_queues(nq);
        for q in 0..nq {
            fe.set_vring_call(q, stale).unwrap();
            fe.set_vring_enable(q, true).unwrap();
        }
        fe.set_mem_table(&[info]).unwrap();
        for (q, gq) in queues.iter().enumerate() {
            fe.set_vring_num(q, QSIZE).unwrap();
            fe.set_vring_base(q, 0).unwrap();
            fe.set_vring_addr(q, &gq.vring_config(hva)).unwrap();
        }
        Guest { mem, _file: file, hva, fe, queues, features }
    }

    /// Start ring `q` with its kick eventfd, already signalled (QEMU's host notifiers start
    /// signalled so that the backend looks at the ring once).
    pub fn start_ring(&self, q: usize) {
        self.queues[q].kick.write(1).unwrap();
        self.fe.set_vring_kick(q, &self.queues[q].kick).unwrap();
    }

    /// Stop every ring (`GET_VRING_BASE`, as QEMU does when it stops the device) and return
    /// the bases the backend reports.
    pub fn stop(&mut self) -> Vec<u32> {
        (0..self.queues.len()).map(|q| self.fe.get_vring_base(q).unwrap()).collect()
    }

    /// Start the stopped rings again on the same connection from `bases` (QEMU resuming the VM
    /// on the source after a failed or cancelled migration).
    pub fn restart(&mut self, bases: &[u32]) {
        for (q, gq) in self.queues.iter().enumerate() {
            self.fe.set_vring_num(q, QSIZE).unwrap();
            self.fe.set_vring_base(q, bases[q] as u16).unwrap();
            self.fe
                .set_vring_addr(
                    q,
                    &VringConfigData {
                        queue_max_size: QSIZE,
                        queue_size: QSIZE,
                        flags: 0,
                        desc_table_addr: self.hva + gq.desc(),
                        used_ring_addr: self.hva + gq.used(),
                        avail_ring_addr: self.hva + gq.avail(),
                        log_addr: None,
                    },
                )
                .unwrap();
            self.fe.set_vring_call(q, &gq.call).unwrap();
            self.fe.set_vring_kick(q, &gq.kick).unwrap();
            if self.features & (1 << 30) != 0 {
                self.fe.set_vring_enable(q, true).unwrap();
            }
        }
    }

    /// Send ring `q`'s addresses again with the `VHOST_VRING_F_LOG` flag `log` (what QEMU does
    /// on a running ring when a migration starts or ends).
    pub fn set_vring_addr_again(&self, q: usize, log: bool) {
        let gq = &self.queues[q];
        self.fe
            .set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QSIZE,
                    queue_size: QSIZE,
                    flags: u32::from(log),
                    desc_table_addr: self.hva + gq.desc(),
                    used_ring_addr: self.hva + gq.used(),
                    avail_ring_addr: self.hva + gq.avail(),
                    log_addr: log.then_some(gq.used()),
                },
            )
            .unwrap();
    }

    /// The guest physical address of ring `q`'s used ring.
    pub fn used_ring(&self, q: usize) -> u64 {
        self.queues[q].used()
    }

    /// A copy of guest memory.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; MEM_SIZE];
        self.mem.read_slice(&mut v, GuestAddress(0)).unwrap();
        v
    }

    /// Live migration's end for this test guest: stop the rings on the current backend, copy
    /// guest memory into a new memfd (the destination's memory as the migration's last round
    /// leaves it) and continue on the backend at `path` from the bases the old one reported.
    /// Returns them.
    /// Also returns each ring's used index as the stop left it: read before the destination
    /// starts, since a started destination may go on at once with chains the guest had added.
    pub fn migrate(self, path: &Path, protocol: VhostUserProtocolFeatures) -> (Guest, Vec<u32>, Vec<u16>) {
        let mut old = self;
        let bases = old.stop();
        let used_at_stop = (0..old.queues.len()).map(|q| old.used_idx(q)).collect();
        let file = memfd("guest-destination", MEM_SIZE as u64).unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(&old.snapshot(), 0).unwrap();
        let features = old.features;
        let queues = std::mem::take(&mut old.queues);
        drop(old);
        (Self::start(path, file, queues, &bases, features, protocol), bases, used_at_stop)
    }

    /// Config space bytes (needs the CONFIG protocol feature).
    pub fn config(&mut self) -> Vec<u8> {
        self.config_bytes(12)
    }

    /// The first `n` config space bytes.
    pub fn config_bytes(&mut self, n: usize) -> Vec<u8> {
        let (_, payload) = self.fe.get_config(0, n as u32, VhostUserConfigFlags::empty(), &vec![0u8; n]).unwrap();
        payload
    }

    /// Make a chain of (gpa, len, device-writable) descriptors available; returns its head.
    pub fn add_chain(&mut self, q: usize, descs: &[(u64, u32, bool)]) -> u16 {
        let gq = &mut self.queues[q];
        let head = gq.next_desc;
        for (i, &(addr, len, w)) in descs.iter().enumerate() {
            let idx = gq.next_desc;
            gq.next_desc = (gq.next_desc + 1) % QSIZE;
            let mut flags = if w { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT;
            }
            let at = gq.desc() + 16 * u64::from(idx);
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem.write_obj(gq.next_desc, GuestAddress(at + 14)).unwrap();
        }
        let slot = gq.avail() + 4 + 2 * u64::from(gq.avail_idx % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        gq.avail_idx = gq.avail_idx.wrapping_add(1);
        self.mem.store(gq.avail_idx, GuestAddress(gq.avail() + 2), Ordering::Release).unwrap();
        head
    }

    pub fn kick(&self, q: usize) {
        self.queues[q].kick.write(1).unwrap();
    }

    /// Post `n` receive buffers of 2048 bytes on queue `q` and kick.
    pub fn post_rx(&mut self, q: usize, n: u16) {
        for _ in 0..n {
            let slot = u64::from(self.queues[q].next_desc);
            let addr = self.queues[q].bufs + slot * BUF;
            self.add_chain(q, &[(addr, BUF as u32, true)]);
        }
        self.kick(q);
    }

    /// Send frames on TX queue `q` (header and frame in separate descriptors) and kick.
    pub fn send(&mut self, q: usize, frames: &[Vec<u8>]) {
        for f in frames {
            let slot = u64::from(self.queues[q].next_desc);
            let addr = self.queues[q].bufs + slot * BUF;
            self.mem.write_slice(&[0u8; 12], GuestAddress(addr)).unwrap();
            self.mem.write_slice(f, GuestAddress(addr + 16)).unwrap();
            self.add_chain(q, &[(addr, 12, false), (addr + 16, f.len() as u32, false)]);
        }
        self.kick(q);
    }

    pub fn used_idx(&self, q: usize) -> u16 {
        self.mem.load(GuestAddress(self.queues[q].used() + 2), Ordering::Acquire).unwrap()
    }

    /// Wait until the used index of `q` reaches `n`.
    pub fn wait_used(&self, q: usize, n: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.used_idx(q) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Used element `i` of queue `q`: (head, len).
    pub fn used_elem(&self, q: usize, i: u16) -> (u32, u32) {
        let at = self.queues[q].used() + 4 + 8 * u64::from(i % QSIZE);
        (self.mem.read_obj(GuestAddress(at)).unwrap(), self.mem.read_obj(GuestAddress(at + 4)).unwrap())
    }

    /// Received frames (header checked and stripped) for used entries `from..to` of RX queue `q`
    /// whose buffers were posted by `post_rx` (one 2048-byte buffer per chain).
    pub fn rx_frames(&self, q: usize, from: u16, to: u16) -> Vec<Vec<u8>> {
        (from..to)
            .map(|i| {
                let (head, len) = self.used_elem(q, i);
                let addr: u64 = self.mem.read_obj(GuestAddress(self.queues[q].desc() + 16 * u64::from(head))).unwrap();
                let mut buf = vec![0u8; len as usize];
                self.mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
                assert!(buf.len() >= 12, "used length {len} shorter than the header");
                assert_eq!(&buf[..10], &[0u8; 10], "no offload flags expected");
                assert_eq!(u16::from_le_bytes([buf[10], buf[11]]), 1, "num_buffers");
                buf.split_off(12)
            })
            .collect()
    }

    /// Send a control command and wait for its ack.
    pub fn ctrl(&mut self, cmd: &[u8]) -> u8 {
        let q = self.queues.len() - 1;
        let slot = u64::from(self.queues[q].next_desc);
        let addr = self.queues[q].bufs + slot * 64;
        self.mem.write_slice(cmd, GuestAddress(addr)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(addr + 32)).unwrap();
        let want = self.used_idx(q) + 1;
        self.add_chain(q, &[(addr, 2, false), (addr + 2, cmd.len() as u32 - 2, false), (addr + 32, 1, true)]);
        self.kick(q);
        assert!(self.wait_used(q, want, Duration::from_secs(5)), "control command not answered");
        self.mem.read_obj(GuestAddress(addr + 32)).unwrap()
    }

    pub fn hva(&self) -> u64 {
        self.hva
    }
}

/// A test frame: Ethernet header to a locally administered MAC, then a pattern.
pub fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02, 0x88, 0xb5];
    f.extend((0..len.saturating_sub(14)).map(|i| (i as u8).wrapping_add(seed)));
    f
}
