//! Seeded randomized robustness tests (the stable counterpart of the cargo-fuzz targets in
//! `fuzz/`): thousands of malformed descriptor chains and vhost-user messages. Each must be
//! dropped and counted, never panic, and leave the backend working.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{frame, socket_path, Guest, GUEST_FEATURES};
use lanekit_vhost::fuzzing::{log_messages, queues_from_bytes, send_raw};
use lanekit_vhost::net::{self, NetMode, RxState, Stats, TxState};
use lanekit_vhost::port::{channel_port, finish_csum, Batch, LoopPort, Port, TxFrame};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// xorshift64*: deterministic, seeded, good enough to pick test cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_bytes_as_rings_never_panic() {
    let mut rng = Rng(0x1a2e_c0de_5eed_0001);
    let mut errors = 0;
    for _ in 0..3000 {
        let len = rng.below(2048) as usize;
        let mut data = rng.bytes(len);
        // Keep the avail index small half of the time so chains are actually walked.
        if data.len() >= 2 && rng.below(2) == 0 {
            data[0] = rng.below(17) as u8;
            data[1] = 0;
        }
        errors += queues_from_bytes(&data).errors;
    }
    assert!(errors > 0, "random rings must produce counted errors");
}

const QSIZE: u16 = 64;
const MEM_SIZE: u64 = 0x20_0000;
const MODE: NetMode = NetMode {
    hdr_len: 12,
    mergeable: true,
    max_frame: 1518,
    hash_report: false,
    offloads: lanekit_vhost::offload::Offloads::NONE,
    rx_hash: None,
};

/// A guest ring in fresh memory where the test writes chains of its choosing.
struct Ring {
    mem: GuestMemoryMmap,
    next_desc: u16,
    avail: u16,
}

impl Ring {
    fn new() -> Ring {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
        Ring { mem, next_desc: 0, avail: 0 }
    }
    fn queue(&self) -> Queue {
        let mut q = Queue::new(QSIZE).unwrap();
        q.set_size(QSIZE);
        q.set_desc_table_address(Some(0), Some(0));
        q.set_avail_ring_address(Some(0x1000), Some(0));
        q.set_used_ring_address(Some(0x2000), Some(0));
        q.set_ready(true);
        q
    }
    /// Add a chain of (addr, len, flags); `head` overrides the avail entry.
    fn add(&mut self, descs: &[(u64, u32, u16)], head: Option<u16>) {
        let first = self.next_desc;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = self.next_desc;
            self.next_desc += 1;
            let flags = if i + 1 < descs.len() { flags | 1 } else { flags & !1 };
            let at = GuestAddress(16 * u64::from(idx));
            self.mem.write_obj(addr, at).unwrap();
            self.mem.write_obj(len, at.unchecked_add(8)).unwrap();
            self.mem.write_obj(flags, at.unchecked_add(12)).unwrap();
            self.mem.write_obj(self.next_desc, at.unchecked_add(14)).unwrap();
        }
        let slot = GuestAddress(0x1004 + 2 * u64::from(self.avail));
        self.mem.write_obj(head.unwrap_or(first), slot).unwrap();
        self.avail += 1;
        self.mem.write_obj(self.avail, GuestAddress(0x1002)).unwrap();
    }
}

use vm_memory::Address;

/// Descriptors for header + frame at `base`, split in up to 4 pieces, all with `flags`.
fn pieces(
    rng: &mut Rng,
    mem: &GuestMemoryMmap,
    base: u64,
    hdr: [u8; 12],
    len: usize,
    flags: u16,
) -> Vec<(u64, u32, u16)> {
    let mut bytes = hdr.to_vec();
    bytes.extend(rng.bytes(len));
    mem.write_slice(&bytes, GuestAddress(base)).unwrap();
    let n = 1 + rng.below(4) as usize;
    let step = bytes.len().div_ceil(n);
    bytes.chunks(step.max(1)).enumerate().map(|(i, c)| (base + (i * step) as u64, c.len() as u32, flags)).collect()
}

#[test]
fn malformed_tx_chains_are_dropped_and_counted() {
    let mut rng = Rng(0x5eed_0000_0000_00f1);
    for iter in 0..2000 {
        let mut ring = Ring::new();
        let (mut want_errors, mut want_frames) = (0u64, 0u64);
        let chains = 1 + rng.below(8);
        for c in 0..chains {
            let base = 0x1_0000 + 0x4000 * c;
            let kind = rng.below(10);
            let ok_len = 14 + rng.below(1505) as usize;
            let mut descs = pieces(&mut rng, &ring.mem, base, [0; 12], ok_len, 0);
            let mut head = None;
            match kind {
                0 | 1 => want_frames += 1,
                2 => {
                    let i = rng.below(descs.len() as u64) as usize;
                    descs[i].2 |= 2; // device-writable in a TX chain
                }
                3 => {
                    let i = rng.below(descs.len() as u64) as usize;
                    descs[i].0 = [MEM_SIZE - 4, u64::MAX - 8, 1 << 40][rng.below(3) as usize];
                }
                4 => descs = vec![(base, 1 + rng.below(25) as u32, 0)],
                5 => {
                    let len = 1519 + rng.below(5000) as usize;
                    descs = pieces(&mut rng, &ring.mem, base, [0; 12], len, 0);
                }
                6 => {
                    let mut hdr = [0u8; 12];
                    if rng.below(2) == 0 {
                        hdr[0] = 1
                    } else {
                        hdr[1] = 1 + rng.below(255) as u8
                    }
                    descs = pieces(&mut rng, &ring.mem, base, hdr, ok_len, 0);
                }
                7 => head = Some(QSIZE + rng.below(1000) as u16),
                8 => descs = vec![(base, 17 + 16 * rng.below(4) as u32, 4)], // indirect, bad table length
                _ => descs = vec![(base, 0, 0); 1 + rng.below(3) as usize],
            }
            if kind >= 2 {
                want_errors += 1;
            }
            ring.add(&descs, head);
        }
        let mut q = ring.queue();
        let (stats, mut port) = (Stats::default(), LoopPort::new(0).unwrap());
        let run = net::tx_queue(&mut q, &ring.mem, &mut port, &mut TxState::default(), MODE, &stats, 64);
        let s = stats.snapshot();
        assert_eq!(run.handled as u64, chains, "iteration {iter}");
        assert_eq!((s.errors, s.tx_frames), (want_errors, want_frames), "iteration {iter}: {s:?}");
        let mut got = Batch::default();
        assert_eq!(port.recv(&mut got, 64).unwrap() as u64, want_frames);
    }
}

#[test]
fn malformed_rx_chains_are_skipped_and_counted() {
    let mut rng = Rng(0x5eed_0000_0000_00f2);
    for iter in 0..2000 {
        let mut ring = Ring::new();
        let (mut want_errors, mut valid) = (0u64, 0u64);
        let chains = 1 + rng.below(8);
        for c in 0..chains {
            let base = 0x1_0000 + 0x4000 * c;
            let mut head = None;
            let descs = match rng.below(5) {
                0 | 1 => {
                    valid += 1;
                    vec![(base, 1024, 2), (base + 1024, 1024, 2)]
                }
                2 => vec![(base, 1024, 2), (base + 1024, 1024, 0)], // device-readable in RX
                3 => vec![(MEM_SIZE - 100, 2048, 2)],
                _ => {
                    head = Some(QSIZE + rng.below(100) as u16);
                    vec![(base, 2048, 2)]
                }
            };
            if descs.len() == 1 || descs[1].2 == 0 {
                want_errors += 1;
            }
            ring.add(&descs, head);
        }
        let mut q = ring.queue();
        let (stats, mut port) = (Stats::default(), LoopPort::new(0).unwrap());
        let mut b = Batch::default();
        for i in 0..chains {
            b.push(&frame(60 + 180 * i as usize, i as u8));
        }
        port.send(&b).unwrap();
        net::rx_queue(&mut q, &ring.mem, &mut port, &mut RxState::default(), MODE, &stats, 64);
        let s = stats.snapshot();
        assert_eq!((s.errors, s.rx_frames, s.rx_dropped), (want_errors, valid, 0), "iteration {iter}: {s:?}");
    }
}

/// A vhost-user message: header (request, flags, size) and payload, sometimes lying about size.
fn message(rng: &mut Rng) -> Vec<u8> {
    let request = rng.below(50) as u32;
    let flags = if rng.below(8) == 0 { rng.next() as u32 } else { 1 };
    let len = rng.below(72) as usize;
    let payload = rng.bytes(len);
    let size = if rng.below(6) == 0 { rng.below(300) as u32 } else { payload.len() as u32 };
    let mut m = Vec::new();
    m.extend(request.to_le_bytes());
    m.extend(flags.to_le_bytes());
    m.extend(size.to_le_bytes());
    m.extend(payload);
    m
}

#[test]
fn random_vhost_user_messages_never_break_the_backend() {
    const SESSIONS: usize = 300;
    let path = socket_path("fuzz-msg");
    let (port, peer) = channel_port(0).unwrap();
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 3], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, vec![Box::new(port) as Box<dyn Port>]).unwrap());
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(SESSIONS + 1)).unwrap());
    let mut rng = Rng(0x5eed_0000_0000_00f3);
    for i in 0..SESSIONS {
        let mut data = Vec::new();
        // Often start with SET_OWNER (3) so later messages reach deeper handlers.
        if rng.below(2) == 0 {
            data.extend([3u32, 1, 0].iter().flat_map(|v| v.to_le_bytes()));
        }
        for _ in 0..1 + rng.below(4) {
            data.extend(message(&mut rng));
        }
        if rng.below(5) == 0 {
            data.truncate(rng.below(data.len() as u64) as usize);
        }
        assert!(send_raw(&path, &data, Duration::from_secs(5)), "session {i}: backend hung");
    }
    assert!(backend.connection_errors() > 0, "malformed messages must be counted");
    // The backend still serves a well-behaved frontend.
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    let f = frame(200, 7);
    g.send(1, std::slice::from_ref(&f));
    assert_eq!(peer.wait_sent(1, Duration::from_secs(5)), vec![f]);
    drop(g);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// The live-migration messages with fds of every kind (`fuzzing::log_messages`, the
/// `log_messages` cargo-fuzz target's harness): random, and the backend stays up and serves.
#[test]
fn random_migration_messages_never_break_the_backend() {
    const SESSIONS: usize = 300;
    let path = socket_path("fuzz-log");
    let (port, peer) = channel_port(0).unwrap();
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 4], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, vec![Box::new(port) as Box<dyn Port>]).unwrap());
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(SESSIONS + 1)).unwrap());
    let mut rng = Rng(0x5eed_0000_0000_0106);
    for i in 0..SESSIONS {
        let len = rng.below(96) as usize;
        let mut data = rng.bytes(len);
        // Mostly with LOG_SHMFD negotiated, so SET_LOG_BASE gets past the first check.
        if let Some(f) = data.first_mut() {
            *f |= u8::from(rng.below(4) != 0);
        }
        assert!(log_messages(&path, &data, Duration::from_secs(5)), "session {i}: backend hung");
    }
    assert!(backend.refusals() > 0, "malformed log messages must be refused");
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    let f = frame(200, 8);
    g.send(1, std::slice::from_ref(&f));
    assert_eq!(peer.wait_sent(1, Duration::from_secs(5)), vec![f]);
    drop(g);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// A port that lends buffers and has a GSO socket, in memory: what leaves through it as
/// AF_XDP frames (checksum requests finished) and as GSO packets (header, frame).
#[derive(Default)]
struct GsoLoop {
    lent: Vec<Vec<u8>>,
    frames: Vec<Vec<u8>>,
    gso: Vec<([u8; 10], Vec<u8>)>,
}

impl Port for GsoLoop {
    fn recv(&mut self, _: &mut Batch, _: usize) -> std::io::Result<usize> {
        Ok(0)
    }
    fn send(&mut self, b: &Batch) -> std::io::Result<usize> {
        self.frames.extend(b.iter().map(<[u8]>::to_vec));
        Ok(b.len())
    }
    fn tx_reserve(&mut self, n: usize) -> usize {
        self.lent = vec![vec![0; 2048]; n];
        n
    }
    fn tx_buf(&mut self, i: usize) -> &mut [u8] {
        self.lent.get_mut(i).map_or(&mut [], |b| &mut b[..])
    }
    fn tx_commit(&mut self, fs: &[TxFrame]) -> std::io::Result<usize> {
        for (b, f) in self.lent.iter().zip(fs) {
            let mut fr = b[f.off..f.off + f.len].to_vec();
            finish_csum(&mut fr, f.csum);
            self.frames.push(fr);
        }
        self.lent.clear();
        Ok(fs.len())
    }
    fn gso_capable(&self) -> bool {
        true
    }
    fn send_gso(&mut self, h: &[u8; 10], f: &[u8]) -> std::io::Result<()> {
        self.gso.push((*h, f.to_vec()));
        Ok(())
    }
    fn fd(&self) -> std::os::fd::RawFd {
        -1
    }
    fn describe(&self) -> String {
        "gso loop".into()
    }
}

/// A GSO packet handed to the kernel is one the kernel segments into good frames: its header
/// is a valid request for its frame (segments at most the largest frame, at most `MAX_SEGS`),
/// its IP length fields and IPv4 header checksum are right, and its checksum field holds the
/// pseudo-header sum of the whole packet (so the kernel's per-segment checksums verify).
fn check_gso_packet(iter: usize, hdr: &[u8; 10], f: &[u8]) {
    use lanekit_vhost::fuzzing::l4_check;
    use lanekit_vhost::offload::{fill_csum, plan, Offloads, Plan, TxHdr, MAX_SEGS};
    let h = TxHdr::parse(hdr);
    let Ok(Plan::Gso(g)) = plan(&h, f, Offloads::ALL, 1518) else {
        panic!("iteration {iter}: the kernel got a header its own frame does not pass: {h:?}")
    };
    assert!(g.segs > 1 && g.segs <= MAX_SEGS, "iteration {iter}: {} segments", g.segs);
    let v4 = f[12..14] == [0x08, 0x00];
    let be = |at: usize| usize::from(u16::from_be_bytes([f[at], f[at + 1]]));
    if v4 {
        assert_eq!(be(16), f.len() - 14, "iteration {iter}: IPv4 total length");
        assert_eq!(
            lanekit_vhost::fuzzing::reference_csum(&[&f[14..usize::from(h.csum_start)]]),
            0,
            "iteration {iter}: IPv4 header checksum"
        );
    } else {
        assert_eq!(be(18), f.len() - 54, "iteration {iter}: IPv6 payload length");
    }
    let mut whole = f.to_vec();
    fill_csum(&mut whole, usize::from(h.csum_start), usize::from(h.csum_offset));
    assert_eq!(l4_check(&whole, v4), 0, "iteration {iter}: the checksum field is not the pseudo-header sum");
}

/// Honest offload requests and random lies (header fields, header bytes, frame header bytes)
/// through the TX queue with every offload negotiated, the backend cutting GSO chains itself
/// (`LoopPort`) and handing them to the kernel (`GsoLoop`): whatever the backend sends is at
/// most the largest frame, at most `MAX_SEGS` frames per chain, every TCP/UDP frame it cut or
/// checksummed verifies, every GSO packet passes [`check_gso_packet`]; an unmutated request
/// always goes out, cut as asked (or as one GSO packet).
#[test]
fn lying_offload_headers_never_yield_bad_frames() {
    let (software, kernel) = (lying_offload_headers(false), lying_offload_headers(true));
    assert_eq!(software, kernel, "the same chains are refused whoever segments (refused, sent)");
}

/// Returns (chains refused, chains sent).
fn lying_offload_headers(kernel: bool) -> (u64, u64) {
    use lanekit_vhost::fuzzing::{gso_hdr, l4_check, packet};
    use lanekit_vhost::offload::{Offloads, MAX_SEGS};
    let mode = NetMode { offloads: Offloads::ALL, ..MODE };
    let mut rng = Rng(0x5eed_0ff1_0ad0_0001);
    let (mut refused, mut cut, mut whole) = (0u64, 0u64, 0u64);
    for iter in 0..3000 {
        let (v4, tcp) = (rng.below(2) == 0, rng.below(3) != 0);
        let payload = rng.below(30_000) as usize;
        let mut f = packet(v4, tcp, payload, 0x18 | (0x80 * rng.below(2) as u8));
        let hdrs = if v4 { 34 } else { 54 } + if tcp { 32 } else { 8 };
        let gso_type = match (tcp, v4) {
            (false, _) => 5,
            (true, true) => 1,
            (true, false) => 4,
        };
        let mss = 1 + rng.below(1518 - hdrs as u64) as u16;
        let segs = payload.div_ceil(usize::from(mss)).max(1);
        let mut h = gso_hdr(&f, if rng.below(4) == 0 { 0 } else { gso_type }, mss);
        let honest = rng.below(3) == 0;
        if !honest {
            match rng.below(6) {
                0 => h.gso_size = rng.next() as u16,
                1 => h.hdr_len = rng.next() as u16,
                2 => h.csum_start = rng.next() as u16 % 200,
                3 => h.csum_offset = rng.next() as u16 % 40,
                4 => h.gso_type = rng.next() as u8,
                _ => {
                    let i = rng.below(hdrs as u64) as usize;
                    f[i] = rng.next() as u8;
                }
            }
        }
        let mut ring = Ring::new();
        let bytes = [&h.bytes()[..], &[0, 0], &f[..]].concat();
        ring.mem.write_slice(&bytes, GuestAddress(0x1_0000)).unwrap();
        ring.add(&[(0x1_0000, bytes.len() as u32, 0)], None);
        let mut q = ring.queue();
        let stats = Stats::default();
        let mut out = Batch::default();
        let gso = if kernel {
            let mut port = GsoLoop::default();
            net::tx_queue(&mut q, &ring.mem, &mut port, &mut TxState::default(), mode, &stats, 64);
            port.frames.iter().for_each(|fr| out.push(fr));
            port.gso
        } else {
            let mut port = LoopPort::new(0).unwrap();
            net::tx_queue(&mut q, &ring.mem, &mut port, &mut TxState::default(), mode, &stats, 64);
            port.recv(&mut out, 4 * MAX_SEGS).unwrap();
            Vec::new()
        };
        let s = stats.snapshot();
        let n = out.len();
        assert!(n <= MAX_SEGS && gso.len() <= 1, "iteration {iter}: {n} frames, {} GSO packets", gso.len());
        assert_eq!(s.tx_frames, (n + gso.len()) as u64);
        for (hdr, fr) in &gso {
            check_gso_packet(iter, hdr, fr);
        }
        if honest {
            let want = match h.gso_type {
                0 if f.len() <= 1518 => 1,
                0 => 0,
                _ if segs <= MAX_SEGS => segs,
                _ => 0,
            };
            let got = if gso.is_empty() { n } else { segs };
            assert_eq!(got, want, "iteration {iter}: honest {h:?}, {} bytes: {s:?}", f.len());
            assert_eq!(
                !gso.is_empty(),
                kernel && h.gso_type != 0 && (2..=MAX_SEGS).contains(&segs),
                "iteration {iter}"
            );
            if let Some(fr) = out.get(0).filter(|_| h.gso_type == 0) {
                assert_eq!(l4_check(fr, v4), 0, "iteration {iter}: checksum not filled in");
            }
        }
        whole += gso.len() as u64;
        if n == 0 {
            refused += u64::from(gso.is_empty());
            continue;
        }
        cut += u64::from(n > 1);
        for fr in out.iter() {
            assert!(fr.len() <= 1518, "iteration {iter}: a {}-byte frame", fr.len());
            if s.tx_gso + s.tx_csum > 0 && fr[12..14] == f[12..14] && fr.len() > hdrs {
                let is_v4 = fr[12..14] == [0x08, 0x00];
                let proto = fr[if is_v4 { 23 } else { 20 }];
                // A frame the backend cut or checksummed as TCP/UDP of the family it claims.
                if s.tx_gso > 0 && (proto == 6 || proto == 17) {
                    assert_eq!(l4_check(fr, is_v4), 0, "iteration {iter}: bad L4 checksum");
                }
            }
        }
    }
    let sent = if kernel { whole } else { cut };
    assert!(refused > 300 && sent > 300, "kernel {kernel}: {refused} refused, {sent} cut or sent whole");
    (refused, 3000 - refused)
}

/// Cut `frame` as the virtio header `h` asks (the wire frames of a sender's TSO, or what a
/// guest's stack gets back from a coalesced segment).
fn cut(h: &lanekit_vhost::offload::TxHdr, frame: &[u8]) -> Option<Vec<Vec<u8>>> {
    use lanekit_vhost::offload::{plan, write_segment, Offloads, Plan};
    let Ok(Plan::Gso(g)) = plan(h, frame, Offloads::ALL, 70_000) else { return None };
    let mut out = Vec::new();
    for i in 0..g.segs {
        let mut o = vec![0u8; 70_000];
        let n = write_segment(frame, &g, i, &mut o)?;
        o.truncate(n);
        out.push(o);
    }
    Some(out)
}

/// Random batches (several flows of both families cut at random MSS, interleaved, with random
/// byte changes, drops and duplicates) through the GUEST_TSO coalescer: every frame comes out
/// exactly once, each flow's frames in order, and every segment cuts back into exactly the
/// frames it merged (bytes equal), never larger than the limit.
#[test]
fn coalesced_segments_cut_back_into_exactly_their_frames() {
    use lanekit_vhost::fuzzing::{gso_hdr, packet};
    use lanekit_vhost::offload::gro::{coalesce, GroStats, Out};
    let mut rng = Rng(0x5eed_06e0_0000_0001);
    let (mut st, mut out) = (GroStats::default(), Vec::new());
    for iter in 0..1500 {
        let mut flows: Vec<Vec<Vec<u8>>> = Vec::new();
        for k in 0..1 + rng.below(4) {
            let v4 = rng.below(2) == 0;
            let mut f = packet(v4, true, 1 + rng.below(20_000) as usize, 0x18);
            let l4 = if v4 { 34 } else { 54 };
            f[l4..l4 + 2].copy_from_slice(&(k as u16 + 1).to_be_bytes());
            let mss = 1 + rng.below(1400) as u16;
            let h = gso_hdr(&f, if v4 { 1 } else { 4 }, mss);
            flows.push(cut(&h, &f).unwrap_or_default());
        }
        // Interleave, keeping each flow's order; then lie a little.
        let mut frames: Vec<(usize, Vec<u8>)> = Vec::new();
        while flows.iter().any(|f| !f.is_empty()) {
            let k = rng.below(flows.len() as u64) as usize;
            if !flows[k].is_empty() {
                let f = flows[k].remove(0);
                match rng.below(40) {
                    0 => continue,
                    1 => frames.push((k, f.clone())),
                    2 => {
                        let mut f = f;
                        let i = rng.below(f.len() as u64) as usize;
                        f[i] = rng.next() as u8;
                        // A changed header may be another flow: not in the order check.
                        frames.push((usize::MAX, f));
                        continue;
                    }
                    _ => {}
                }
                frames.push((k, f));
            }
        }
        frames.truncate(64);
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f.1[..]).collect();
        let limit = [1518, 9000, 18 + 65_535][rng.below(3) as usize];
        coalesce(&refs, limit, lanekit_vhost::offload::Offloads::ALL, &mut out, &mut st);
        let mut order: Vec<usize> = Vec::new();
        for o in &out {
            match o {
                Out::Pass(i) => order.push(*i),
                Out::Segment { idx, hdr, frame } => {
                    assert!(frame.len() <= limit, "iteration {iter}: {} > {limit}", frame.len());
                    let again = cut(hdr, frame).expect("a segment that does not cut");
                    let want: Vec<&[u8]> = idx.iter().map(|&i| refs[i]).collect();
                    assert!(
                        again.iter().map(|f| &f[..]).eq(want),
                        "iteration {iter}: segment {idx:?} cuts into other frames"
                    );
                    order.extend(idx);
                }
            }
        }
        let mut all = order.clone();
        all.sort_unstable();
        assert_eq!(all, (0..refs.len()).collect::<Vec<_>>(), "iteration {iter}: every frame once");
        for k in 0..4 {
            let of_k: Vec<usize> = order.iter().copied().filter(|&i| frames[i].0 == k).collect();
            assert!(of_k.windows(2).all(|w| w[0] < w[1]), "iteration {iter}: flow {k} reordered: {of_k:?}");
        }
    }
    assert!(st.segments > 500 && st.flush_rule > 50 && st.flush_size > 50, "{st:?}");
}

/// Random flows through the real RX queue with GUEST_TSO (random chain counts, sizes and
/// descriptor splits, mergeable or not): what the guest reads, each GSO packet cut back,
/// is every flow's frames in order, a prefix of each flow (the rest waits for buffers), with
/// nothing dropped, nothing duplicated and every packet's header consistent.
#[test]
fn coalesced_rx_reaches_the_guest_as_exactly_the_wire_frames() {
    use lanekit_vhost::fuzzing::wire;
    use lanekit_vhost::offload::{Offloads, TxHdr};
    let mut rng = Rng(0x5eed_06e0_0000_0002);
    let (mut segments, mut split) = (0, 0);
    for iter in 0..400 {
        let mut flows: Vec<Vec<Vec<u8>>> = (0..1 + rng.below(3))
            .map(|k| {
                let (v4, len, mss) = (rng.below(2) == 0, 1 + rng.below(30_000), 536 + rng.below(913));
                wire(v4, len as usize, mss as usize, 1000 + k as u16, rng.next() as u32)
            })
            .collect();
        let mut frames: Vec<(usize, Vec<u8>)> = Vec::new();
        while frames.len() < 64 && flows.iter().any(|f| !f.is_empty()) {
            let k = rng.below(flows.len() as u64) as usize;
            if !flows[k].is_empty() {
                frames.push((k, flows[k].remove(0)));
            }
        }
        let mergeable = rng.below(4) != 0;
        let mode = NetMode { offloads: Offloads::ALL, mergeable, ..MODE };
        let mut ring = Ring::new();
        let mut chains = Vec::new();
        for c in 0..1 + rng.below(u64::from(QSIZE) / 2) {
            let base = 0x1_0000 + 0x7800 * c;
            let size = if mergeable { 256 + rng.below(3840) } else { 1600 + rng.below(0x7800 - 1600) } as u32;
            let descs: Vec<(u64, u32, u16)> = if rng.below(2) == 0 {
                vec![(base, size, 2)]
            } else {
                vec![(base, size / 2, 2), (base + u64::from(size / 2), size - size / 2, 2)]
            };
            chains.push((ring.next_desc, descs.clone()));
            ring.add(&descs, None);
        }
        let mut q = ring.queue();
        let (stats, mut port, mut st) = (Stats::default(), LoopPort::new(0).unwrap(), RxState::default());
        let mut b = Batch::default();
        frames.iter().for_each(|f| b.push(&f.1));
        port.send(&b).unwrap();
        net::rx_queue(&mut q, &ring.mem, &mut port, &mut st, mode, &stats, 64);
        // Read the used ring: each packet's buffers, num_buffers of them.
        let used_idx: u16 = ring.mem.read_obj(GuestAddress(0x2002)).unwrap();
        let read = |u: u16| -> Vec<u8> {
            let id: u32 = ring.mem.read_obj(GuestAddress(0x2004 + 8 * u64::from(u))).unwrap();
            let len: u32 = ring.mem.read_obj(GuestAddress(0x2008 + 8 * u64::from(u))).unwrap();
            let (mut out, mut left) = (Vec::new(), len as usize);
            let descs = &chains.iter().find(|c| u32::from(c.0) == id).expect("a used id that was posted").1;
            for &(addr, l, _) in descs {
                let n = left.min(l as usize);
                let mut v = vec![0u8; n];
                ring.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
                out.extend(v);
                left -= n;
            }
            out
        };
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut u = 0;
        while u < used_idx {
            let first = read(u);
            let nb = u16::from_le_bytes([first[10], first[11]]).max(1);
            assert!(mergeable || nb == 1, "iteration {iter}: num_buffers {nb} without MRG_RXBUF");
            let mut pkt = first[12..].to_vec();
            for k in 1..nb {
                pkt.extend(read(u + k));
            }
            let h = TxHdr::parse(&first);
            if h.gso_type != 0 {
                segments += 1;
                got.extend(cut(&h, &pkt).unwrap_or_else(|| panic!("iteration {iter}: a GSO packet that does not cut")));
            } else {
                got.push(pkt);
            }
            u += nb;
        }
        let s = stats.snapshot();
        split += s.rx_gro_split;
        assert_eq!((s.rx_dropped, s.errors), (0, 0), "iteration {iter}");
        assert_eq!(got.len() as u64, s.rx_frames, "iteration {iter}");
        assert_eq!(got.len() + st.backlog(), frames.len(), "iteration {iter}: delivered + waiting");
        // What arrived is, per flow, that flow's first frames in order.
        for k in 0..4 {
            let want: Vec<&Vec<u8>> = frames.iter().filter(|f| f.0 == k).map(|f| &f.1).collect();
            let of_k: Vec<&Vec<u8>> = got.iter().filter(|g| want.contains(g)).collect();
            assert!(want.starts_with(&of_k), "iteration {iter}: flow {k} out of order or not a prefix");
        }
        assert!(got.iter().all(|g| frames.iter().any(|f| &f.1 == g)), "iteration {iter}: a frame that was never sent");
    }
    assert!(segments > 200 && split > 50, "both outcomes exercised: {segments} segments, {split} split frames");
}
