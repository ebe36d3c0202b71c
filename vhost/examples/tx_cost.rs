//! tx_cost: the backend's CPU cost per transmitted frame (guest -> port).
//!
//! Runs the real TX code (`net::tx_queue`: batched pops, chain validation, header check, one
//! copy per descriptor into buffers the port lends, batched used ring) on a 256-entry split
//! queue in guest memory. Each chain is one descriptor holding the 12-byte virtio header and the
//! frame (what Linux and DPDK's virtio PMD post when the header fits in front of the frame).
//!
//! `cargo run --release --example tx_cost [SECS]`: thread CPU time per frame, median of runs.
//! `tx_cost --rounds N SIZE`: exactly N rounds of 256 frames of SIZE bytes, nothing else; for
//! instruction counts (`valgrind --tool=callgrind --toggle-collect='*backend_tx*'`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use lanekit_vhost::backend::GuestMem;
use lanekit_vhost::net::{tx_queue, NetMode, Stats, TxState, HDR_LEN};
use lanekit_vhost::port::{Batch, Port, TxFrame};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};

const QLEN: u16 = 256;
const BUF: u64 = 2048;
const BUF_BASE: u64 = 0x10_0000;
/// Used ring address, past the mock's descriptor table (0) and avail ring (0x1000).
const USED_RING: u64 = 0x8000;

/// A port that lends its frame buffers, like `XskPort` (AF_XDP UMEM frames).
struct UmemPort {
    umem: Vec<u8>,
    lent: usize,
}

impl Port for UmemPort {
    fn recv(&mut self, _batch: &mut Batch, _max: usize) -> io::Result<usize> {
        Ok(0)
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        Ok(batch.len())
    }
    fn tx_reserve(&mut self, n: usize) -> usize {
        self.lent = n.min(64);
        self.lent
    }
    fn tx_buf(&mut self, i: usize) -> &mut [u8] {
        if i >= self.lent {
            return &mut [];
        }
        let at = i * BUF as usize;
        &mut self.umem[at..at + BUF as usize]
    }
    fn tx_commit(&mut self, frames: &[TxFrame]) -> io::Result<usize> {
        self.lent = 0;
        Ok(frames.len())
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

/// The measured part: one call of the backend's TX code (not inlined, for callgrind).
#[inline(never)]
fn backend_tx(q: &mut Queue, mem: &GuestMem, port: &mut UmemPort, st: &mut TxState, stats: &Stats) -> usize {
    let mode = NetMode {
        hdr_len: HDR_LEN,
        mergeable: true,
        max_frame: 1518,
        hash_report: false,
        offloads: lanekit_vhost::offload::Offloads::NONE,
        rx_hash: None,
    };
    tx_queue(q, mem, port, st, mode, stats, usize::from(QLEN)).handled
}

/// Run `rounds` of: the guest makes 256 frames available, the backend sends them. Returns CPU
/// ns per frame.
fn run(size: usize, rounds: usize) -> f64 {
    let mem = GuestMem::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let vq = MockSplitQueue::new(&mem, QLEN);
    let descs: Vec<_> = (0..QLEN)
        .map(|i| {
            virtio_queue::desc::RawDescriptor::from(virtio_queue::desc::split::Descriptor::new(
                BUF_BASE + u64::from(i) * BUF,
                (HDR_LEN + size) as u32,
                0,
                0,
            ))
        })
        .collect();
    for i in 0..u64::from(QLEN) {
        let mut buf = vec![0x5au8; HDR_LEN + size];
        buf[..HDR_LEN].fill(0);
        mem.write_slice(&buf, GuestAddress(BUF_BASE + i * BUF)).unwrap();
    }
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    // MockSplitQueue puts the used ring 260 bytes after the avail ring, over its second half
    // (`AvailRing::end` counts the 256 u16 entries as bytes): move it out of the way.
    q.set_used_ring_address(Some(USED_RING as u32), Some(0));
    let avail = vq.avail_addr();
    let mut port = UmemPort { umem: vec![0; 64 * BUF as usize], lent: 0 };
    let (mut st, stats) = (TxState::default(), Stats::default());
    let mut idx: u16 = QLEN;
    let start = thread_cpu();
    let mut frames = 0u64;
    for _ in 0..rounds {
        frames += backend_tx(&mut q, &mem, &mut port, &mut st, &stats) as u64;
        // The guest reuses the buffers for new frames.
        for i in 0..QLEN {
            let slot = avail.unchecked_add(4 + 2 * u64::from(idx.wrapping_add(i) % QLEN));
            mem.write_obj(i, slot).unwrap();
        }
        idx = idx.wrapping_add(QLEN);
        mem.write_obj(idx, avail.unchecked_add(2)).unwrap();
    }
    let cpu = thread_cpu() - start;
    let snap = stats.snapshot();
    assert_eq!((snap.tx_frames, snap.errors), (frames, 0), "{snap:?}");
    cpu.as_nanos() as f64 / frames as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rounds") {
        let rounds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
        let size = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
        let ns = run(size, rounds);
        println!("{size} B: {rounds} rounds of {QLEN} frames, {ns:.1} ns/frame");
        return;
    }
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    for size in [64usize, 1500] {
        let mut v = Vec::new();
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            v.push(run(size, 200));
        }
        v.sort_by(|a, b| a.total_cmp(b));
        println!("{size:>5} B: {:7.1} ns/frame ({} runs, thread CPU time)", v[v.len() / 2], v.len());
    }
}
