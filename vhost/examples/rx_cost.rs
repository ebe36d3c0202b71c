//! rx_cost: the backend's CPU cost per received frame, with and without the intermediate copy.
//!
//! Both runs use the real RX code (`net::rx_queue`, the validated descriptor walk and header
//! write) on a 256-entry split queue in guest memory, fed from one "UMEM" buffer of frames:
//! - `direct`: the port lends its frames (`Port::rx_each`, as `XskPort` does): UMEM → guest.
//! - `copy`: the port copies each frame into the batch buffer first (`Port::recv`, the RX path
//!   before direct RX): UMEM → batch → guest.
//!
//! Thread CPU time per frame, runs interleaved: `cargo run --release --example rx_cost [SECS]`.
//! `rx_cost --rounds N SIZE`: exactly N rounds of 256 direct frames of SIZE bytes, nothing else;
//! for instruction counts (`valgrind --tool=callgrind --toggle-collect='*backend_rx*'`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use lanekit_vhost::backend::GuestMem;
use lanekit_vhost::net::{rx_queue, NetMode, RxState, Stats, HDR_LEN};
use lanekit_vhost::port::{Batch, Port};
use lanekit_vhost::rss::XskMeta;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};

const QLEN: u16 = 256;
const BUF: u64 = 2048;
const BUF_BASE: u64 = 0x10_0000;
/// Used ring address, past the mock's descriptor table (0) and avail ring (0x1000).
const USED_RING: u64 = 0x8000;

/// Frames served from one buffer, like an AF_XDP UMEM.
struct UmemPort {
    umem: Vec<u8>,
    len: usize,
    next: usize,
    direct: bool,
}

impl UmemPort {
    fn frame(&self, i: usize) -> &[u8] {
        let at = (i % 1024) * BUF as usize;
        &self.umem[at..at + self.len]
    }
}

impl Port for UmemPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        for k in 0..max {
            let (i, len) = (self.next + k, self.len);
            let at = (i % 1024) * BUF as usize;
            batch.push(&self.umem[at..at + len]);
        }
        self.next += max;
        Ok(max)
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        Ok(batch.len())
    }
    fn rx_each(&mut self, max: usize, f: &mut dyn FnMut(&[u8], Option<XskMeta>) -> bool) -> Option<io::Result<usize>> {
        if !self.direct {
            return None;
        }
        let mut n = 0;
        while n < max {
            if !f(self.frame(self.next), Some(XskMeta { hash: 0x1234_5678, report: 3 })) {
                break;
            }
            self.next += 1;
            n += 1;
        }
        Some(Ok(n))
    }
    fn fd(&self) -> RawFd {
        -1
    }
    fn describe(&self) -> String {
        "umem".into()
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec the call fills.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The measured part: one call of the backend's RX code (not inlined, for callgrind).
#[inline(never)]
fn backend_rx(
    q: &mut Queue,
    mem: &GuestMem,
    port: &mut UmemPort,
    st: &mut RxState,
    mode: NetMode,
    stats: &Stats,
) -> usize {
    rx_queue(q, mem, port, st, mode, stats, usize::from(QLEN)).handled
}

/// Run `rounds` of: make 256 buffers available, receive 256 frames. Returns CPU ns per frame.
fn run(direct: bool, size: usize, rounds: usize) -> f64 {
    let mem = GuestMem::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let vq = MockSplitQueue::new(&mem, QLEN);
    let descs: Vec<_> = (0..QLEN)
        .map(|i| {
            virtio_queue::desc::RawDescriptor::from(virtio_queue::desc::split::Descriptor::new(
                BUF_BASE + u64::from(i) * BUF,
                BUF as u32,
                2, // WRITE
                0,
            ))
        })
        .collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    // MockSplitQueue puts the used ring 260 bytes after the avail ring, over its second half
    // (`AvailRing::end` counts the 256 u16 entries as bytes): move it out of the way.
    q.set_used_ring_address(Some(USED_RING as u32), Some(0));
    let avail = vq.avail_addr();
    let mut port = UmemPort { umem: vec![0x5a; 1024 * BUF as usize], len: size, next: 0, direct };
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mode = NetMode {
        hdr_len: HDR_LEN,
        mergeable: true,
        max_frame: 1518,
        hash_report: false,
        offloads: lanekit_vhost::offload::Offloads::NONE,
        rx_hash: None,
    }
    .with_hash_report(true);
    let mut idx: u16 = QLEN;
    let start = thread_cpu();
    let mut frames = 0u64;
    for _ in 0..rounds {
        frames += backend_rx(&mut q, &mem, &mut port, &mut st, mode, &stats) as u64;
        // The guest takes the frames and makes the buffers available again.
        for i in 0..QLEN {
            let slot = avail.unchecked_add(4 + 2 * u64::from(idx.wrapping_add(i) % QLEN));
            mem.write_obj(i, slot).unwrap();
        }
        idx = idx.wrapping_add(QLEN);
        mem.write_obj(idx, avail.unchecked_add(2)).unwrap();
    }
    let cpu = thread_cpu() - start;
    let snap = stats.snapshot();
    assert_eq!((snap.rx_frames, snap.errors), (frames, 0), "{snap:?}");
    cpu.as_nanos() as f64 / frames as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rounds") {
        let rounds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
        let size = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
        let ns = run(true, size, rounds);
        println!("{size} B: {rounds} rounds of {QLEN} frames, {ns:.1} ns/frame");
        return;
    }
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    for size in [64usize, 1500] {
        let (mut d, mut c) = (Vec::new(), Vec::new());
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            d.push(run(true, size, 200));
            c.push(run(false, size, 200));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let (dm, cm) = (med(&mut d), med(&mut c));
        println!(
            "{size:>5} B: direct {dm:7.1} ns/frame, copy {cm:7.1} ns/frame ({:.2}x, {} runs each, thread CPU time)",
            cm / dm,
            d.len()
        );
    }
}
