//! Unit tests of the per-queue datapath with `MockSplitQueue`.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::port::{finish_csum, Batch, Port, TxFrame};

const MEM_SIZE: usize = 0x40_0000;
const BUF_BASE: u64 = 0x10_0000;
const MODE: NetMode = NetMode {
    hdr_len: HDR_LEN,
    mergeable: true,
    max_frame: 1518,
    hash_report: false,
    offloads: Offloads::NONE,
    rx_hash: None,
};

/// A port fed and drained directly by the test; `room` bounds what `send` accepts.
/// With `lend` set it also lends buffers of that size (direct TX).
struct TestPort {
    incoming: VecDeque<Vec<u8>>,
    sent: Vec<Vec<u8>>,
    room: usize,
    lend: Option<usize>,
    lent: Vec<Vec<u8>>,
    /// The checksum request of each frame sent through `tx_commit`.
    csum_reqs: Vec<Option<(u16, u16)>>,
}

impl TestPort {
    fn new() -> Self {
        TestPort {
            incoming: VecDeque::new(),
            sent: Vec::new(),
            room: usize::MAX,
            lend: None,
            lent: Vec::new(),
            csum_reqs: Vec::new(),
        }
    }
}

impl Port for TestPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(f) = self.incoming.pop_front() else { break };
            batch.push(&f);
            n += 1;
        }
        Ok(n)
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        let n = batch.len().min(self.room);
        self.room -= n;
        self.sent.extend(batch.iter().take(n).map(<[u8]>::to_vec));
        Ok(n)
    }
    fn tx_reserve(&mut self, n: usize) -> usize {
        let Some(size) = self.lend else { return 0 };
        self.lent = vec![vec![0xee; size]; n.min(self.room)];
        self.lent.len()
    }
    fn tx_buf(&mut self, i: usize) -> &mut [u8] {
        self.lent.get_mut(i).map_or(&mut [], |b| &mut b[..])
    }
    fn tx_commit(&mut self, frames: &[TxFrame]) -> io::Result<usize> {
        assert!(frames.len() <= self.lent.len(), "more frames than lent buffers");
        for (b, f) in self.lent.iter().zip(frames) {
            let mut frame = b[f.off..f.off + f.len].to_vec();
            // What a port without TX metadata does; the request is kept for the tests.
            self.csum_reqs.push(f.csum);
            finish_csum(&mut frame, f.csum);
            self.sent.push(frame);
        }
        self.room -= frames.len();
        self.lent.clear();
        Ok(frames.len())
    }
    fn fd(&self) -> RawFd {
        -1
    }
    fn describe(&self) -> String {
        "test port".into()
    }
}

fn mem() -> GuestMemoryMmap {
    // The mock puts indirect descriptor tables at 0x3000_0000.
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE), (GuestAddress(0x3000_0000), 0x1_0000)]).unwrap()
}

/// Put chains (lists of (addr, len, writable)) in the queue, descriptors numbered from `first`.
fn add_chains(vq: &MockSplitQueue<GuestMemoryMmap>, first: u16, chains: &[Vec<(u64, u32, bool)>]) {
    let mut descs = Vec::new();
    let mut idx = first;
    for chain in chains {
        for (i, &(addr, len, w)) in chain.iter().enumerate() {
            let mut flags = if w { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < chain.len() {
                flags |= VRING_DESC_F_NEXT;
            }
            descs.push(RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, idx + 1)));
            idx += 1;
        }
    }
    vq.add_desc_chains(&descs, first).unwrap();
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

fn used(vq: &MockSplitQueue<GuestMemoryMmap>, i: usize) -> (u32, u32) {
    let e = vq.used().ring().ref_at(i).unwrap().load();
    (e.id(), e.len())
}

fn used_idx(vq: &MockSplitQueue<GuestMemoryMmap>) -> u16 {
    vq.used().idx().load()
}

/// Write header + frame into guest memory at `addr`, split into pieces of `piece` bytes.
fn tx_descs(m: &GuestMemoryMmap, addr: u64, hdr: [u8; 12], f: &[u8], piece: usize) -> Vec<(u64, u32, bool)> {
    let mut bytes = hdr.to_vec();
    bytes.extend_from_slice(f);
    m.write_slice(&bytes, GuestAddress(addr)).unwrap();
    bytes.chunks(piece).enumerate().map(|(i, c)| (addr + (i * piece) as u64, c.len() as u32, false)).collect()
}

/// `n` TX chains of a 64-byte frame each (header + frame in two descriptors of up to 64 bytes),
/// from slot 0.
fn add_small_tx_chains(m: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>, n: u64) {
    let chains: Vec<_> = (0..n).map(|i| tx_descs(m, BUF_BASE + 0x1000 * i, [0; 12], &frame(64, i as u8), 64)).collect();
    add_chains(vq, 0, &chains);
}

#[test]
fn tx_strips_header_and_sends_frames_split_over_descriptors() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let f1 = frame(100, 1);
    let f2 = frame(1514, 2);
    let c1 = tx_descs(&m, BUF_BASE, [0; 12], &f1, 10);
    let c2 = tx_descs(&m, BUF_BASE + 0x1000, [0; 12], &f2, 1000);
    add_chains(&vq, 0, &[c1.clone(), c2]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(run.handled, 2);
    assert!(run.used && !run.more);
    assert_eq!(port.sent, vec![f1, f2]);
    assert_eq!(used_idx(&vq), 2);
    assert_eq!(used(&vq, 0), (0, 0));
    assert_eq!(used(&vq, 1), (c1.len() as u32, 0));
    let s = stats.snapshot();
    assert_eq!((s.tx_frames, s.tx_bytes, s.errors), (2, 1614, 0));
}

#[test]
fn tx_drops_malformed_chains_and_keeps_going() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let good = frame(60, 3);
    let mut csum_hdr = [0u8; 12];
    csum_hdr[0] = 1; // NEEDS_CSUM: not offered
    let chains = vec![
        // Device-writable descriptor in a TX chain.
        vec![(BUF_BASE, 80, true)],
        // Shorter than header + Ethernet header.
        tx_descs(&m, BUF_BASE + 0x1000, [0; 12], &[0u8; 13], 64),
        // Larger than the maximum frame.
        tx_descs(&m, BUF_BASE + 0x2000, [0; 12], &frame(1519, 0), 2048),
        // Outside guest memory.
        vec![(MEM_SIZE as u64 - 8, 80, false)],
        // Offload requested.
        tx_descs(&m, BUF_BASE + 0x3000, csum_hdr, &good, 64),
        // Only zero-length descriptors.
        vec![(BUF_BASE, 0, false)],
        tx_descs(&m, BUF_BASE + 0x4000, [0; 12], &good, 64),
    ];
    add_chains(&vq, 0, &chains);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(run.handled, 7);
    assert_eq!(port.sent, vec![good]);
    assert_eq!(used_idx(&vq), 7, "every chain is returned to the guest");
    let s = stats.snapshot();
    assert_eq!((s.errors, s.tx_frames), (6, 1));
}

/// One descriptor with NEXT set, pointing at `next`, at index `at` (its own chain).
fn dangling(vq: &MockSplitQueue<GuestMemoryMmap>, at: u16, addr: u64, len: u32, write: bool, next: u16) {
    let flags = VRING_DESC_F_NEXT | if write { VRING_DESC_F_WRITE } else { 0 };
    vq.add_desc_chains(&[RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))], at).unwrap();
}

#[test]
fn chains_that_loop_or_run_off_the_table_are_refused_not_truncated() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let good = frame(60, 5);
    m.write_slice(&[0u8; 80], GuestAddress(BUF_BASE)).unwrap();
    // A 20-byte descriptor whose next is itself: the walk gives up after 16, which would make
    // a 308-byte frame of repeats; and an 80-byte one whose next index is past the table.
    dangling(&vq, 0, BUF_BASE, 20, false, 0);
    dangling(&vq, 1, BUF_BASE, 80, false, 200);
    add_chains(&vq, 2, &[tx_descs(&m, BUF_BASE + 0x1000, [0; 12], &good, 64)]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(port.sent, vec![good], "only the well-formed chain is sent");
    assert_eq!((used_idx(&vq), stats.snapshot().errors), (3, 2));

    // RX: a looping writable descriptor is skipped, the frame goes to the next chain.
    let vq = MockSplitQueue::new(&m, 16);
    dangling(&vq, 0, BUF_BASE, 2048, true, 0);
    add_chains(&vq, 1, &[vec![(BUF_BASE + 0x2000, 2048, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let f = frame(64, 9);
    assert_eq!(rx_frame(&mut q, &m, &f, None, MODE, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!((used(&vq, 0), used(&vq, 1)), ((0, 0), (1, 76)));
    assert_eq!(read_guest(&m, BUF_BASE + 0x2000 + 12, 64), f);

    // Control: a command whose chain loops is not executed.
    let vq = MockSplitQueue::new(&m, 16);
    m.write_slice(&[CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, 2, 0], GuestAddress(BUF_BASE + 0x3000)).unwrap();
    let (next, write) = (VRING_DESC_F_NEXT as u16, VRING_DESC_F_WRITE as u16);
    let cmd = SplitDescriptor::new(BUF_BASE + 0x3000, 4, next, 1);
    let ack = SplitDescriptor::new(BUF_BASE + 0x3010, 1, next | write, 1); // loops on itself
    vq.add_desc_chains(&[RawDescriptor::from(cmd), RawDescriptor::from(ack)], 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let stats = Stats::default();
    let (run, ch) = ctrl_queue(&mut q, &m, 4, CtrlFeatures::default(), &stats, 64);
    assert_eq!((run.handled, ch.pairs, stats.snapshot().errors), (1, None, 1));
}

#[test]
fn tx_counts_frames_the_port_refuses_and_stops_on_budget() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_small_tx_chains(&m, &vq, 4);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    port.room = 1;
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 3);
    assert!(run.more);
    assert_eq!(run.handled, 3);
    let s = stats.snapshot();
    assert_eq!((s.tx_frames, s.tx_dropped), (1, 2));
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 3);
    assert_eq!((run.handled, run.more), (1, false));
}

#[test]
fn tx_accepts_indirect_chains() {
    let m = mem();
    let mut vq = MockSplitQueue::new(&m, 16);
    // The mock builds an indirect table of 3 descriptors whose buffers we then fill.
    vq.add_indirect_chain(3).unwrap();
    let table = vq.desc_table().load(0).unwrap();
    let table = SplitDescriptor::from(table);
    assert_eq!(table.flags() as u32 & VRING_DESC_F_INDIRECT, VRING_DESC_F_INDIRECT);
    let f = frame(40, 9);
    let mut bytes = [0u8; 12].to_vec();
    bytes.extend_from_slice(&f);
    let pieces = [12usize, 20, 20];
    let mut off = 0;
    for (i, n) in pieces.iter().enumerate() {
        let addr = BUF_BASE + 0x100 * i as u64;
        m.write_slice(&bytes[off..off + n], GuestAddress(addr)).unwrap();
        let next = if i + 1 < pieces.len() { VRING_DESC_F_NEXT } else { 0 };
        let d = SplitDescriptor::new(addr, *n as u32, next as u16, i as u16 + 1);
        m.write_obj(d, table.addr().unchecked_add(16 * i as u64)).unwrap();
        off += n;
    }
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(port.sent, vec![f]);
    assert_eq!(stats.snapshot().errors, 0);
}

fn read_guest(m: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

#[test]
fn rx_mergeable_frame_spans_chains_of_several_descriptors() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    // Two chains of three 64-byte buffers each: 192 bytes per chain.
    let chain = |base: u64| (0..3).map(|i| (base + 0x100 * i, 64, true)).collect::<Vec<_>>();
    add_chains(&vq, 0, &[chain(BUF_BASE), chain(BUF_BASE + 0x1000), chain(BUF_BASE + 0x2000)]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let f = frame(300, 5);
    assert_eq!(rx_frame(&mut q, &m, &f, None, MODE, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(used_idx(&vq), 2);
    assert_eq!(used(&vq, 0), (0, 192));
    assert_eq!(used(&vq, 1), (3, 312 - 192));
    let mut got = Vec::new();
    for base in [BUF_BASE, BUF_BASE + 0x1000] {
        for i in 0..3 {
            got.extend(read_guest(&m, base + 0x100 * i, 64));
        }
    }
    let mut hdr = [0u8; 12];
    hdr[10] = 2; // num_buffers
    assert_eq!(&got[..12], &hdr);
    assert_eq!(&got[12..312], &f[..]);
    // The third chain was not touched.
    assert_eq!(q.next_avail(), 2);
    assert_eq!(stats.snapshot().rx_frames, 1);
}

#[test]
fn rx_without_enough_buffers_consumes_nothing() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 100, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    assert_eq!(rx_frame(&mut q, &m, &frame(200, 0), None, MODE, &mut s, &stats), RxOutcome::NoBuffers);
    assert_eq!((q.next_avail(), used_idx(&vq)), (0, 0));
    // Once the guest adds a buffer the frame fits in two chains.
    add_chains(&vq, 1, &[vec![(BUF_BASE + 0x1000, 200, true)]]);
    assert_eq!(rx_frame(&mut q, &m, &frame(200, 0), None, MODE, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(used(&vq, 0), (0, 100));
    assert_eq!(used(&vq, 1), (1, 112));
}

#[test]
fn rx_non_mergeable_drops_frames_larger_than_a_chain_and_keeps_the_chain() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 100, true), (BUF_BASE + 0x100, 20, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let mode = NetMode { mergeable: false, ..MODE };
    assert_eq!(rx_frame(&mut q, &m, &frame(200, 0), None, mode, &mut s, &stats), RxOutcome::Dropped);
    assert_eq!((q.next_avail(), used_idx(&vq)), (0, 0));
    let f = frame(108, 4);
    assert_eq!(rx_frame(&mut q, &m, &f, None, mode, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(used(&vq, 0), (0, 120));
    let mut got = read_guest(&m, BUF_BASE, 100);
    got.extend(read_guest(&m, BUF_BASE + 0x100, 20));
    assert_eq!(&got[10..12], &[1, 0], "num_buffers is 1 without MRG_RXBUF");
    assert_eq!(&got[12..], &f[..]);
    let legacy = NetMode { hdr_len: LEGACY_HDR_LEN, mergeable: false, ..MODE };
    add_chains(&vq, 2, &[vec![(BUF_BASE + 0x2000, 200, true)]]);
    assert_eq!(rx_frame(&mut q, &m, &f, None, legacy, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(used(&vq, 1), (2, 118));
    assert_eq!(read_guest(&m, BUF_BASE + 0x2000 + 10, 108), f);
    let st = stats.snapshot();
    assert_eq!((st.rx_dropped, st.rx_frames, st.errors), (1, 2, 0));
}

#[test]
fn rx_skips_malformed_chains() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(
        &vq,
        0,
        &[
            vec![(BUF_BASE, 100, false)],            // device-readable
            vec![(MEM_SIZE as u64 - 10, 100, true)], // outside memory
            vec![(BUF_BASE + 0x1000, 0, true)],      // empty
            vec![(BUF_BASE + 0x2000, 2048, true)],
        ],
    );
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let f = frame(64, 1);
    assert_eq!(rx_frame(&mut q, &m, &f, None, MODE, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(used_idx(&vq), 4);
    assert_eq!(used(&vq, 0), (0, 0));
    assert_eq!(used(&vq, 1), (1, 0));
    assert_eq!(used(&vq, 2), (2, 0));
    assert_eq!(used(&vq, 3), (3, 76));
    assert_eq!(read_guest(&m, BUF_BASE + 0x2000 + 12, 64), f);
    assert_eq!(stats.snapshot().errors, 3);
}

#[test]
fn rx_bad_chain_in_the_middle_of_a_mergeable_frame_drops_the_frame() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 50, true)], vec![(BUF_BASE + 0x100, 50, false)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    assert_eq!(rx_frame(&mut q, &m, &frame(80, 0), None, MODE, &mut s, &stats), RxOutcome::Dropped);
    assert_eq!(used_idx(&vq), 2);
    assert_eq!(used(&vq, 0), (1, 0));
    assert_eq!(used(&vq, 1), (0, 0));
    let st = stats.snapshot();
    assert_eq!((st.errors, st.rx_dropped), (1, 1));
}

#[test]
fn rx_queue_keeps_frames_until_the_guest_adds_buffers() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 2048, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    q.set_event_idx(true);
    let (mut port, mut st, stats) = (TestPort::new(), RxState::default(), Stats::default());
    port.incoming.extend([frame(60, 1), frame(70, 2), frame(80, 3)]);
    let run = rx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert!(run.used);
    assert_eq!((run.handled, st.backlog()), (1, 2));
    // With EVENT_IDX the device asked to be kicked at the next buffer.
    let avail_event: u16 = m.read_obj(vq.used_addr().unchecked_add(4 + 8 * 16)).unwrap();
    assert_eq!(avail_event, 1);
    add_chains(&vq, 1, &[vec![(BUF_BASE + 0x1000, 2048, true)], vec![(BUF_BASE + 0x2000, 2048, true)]]);
    let run = rx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!((run.handled, st.backlog()), (2, 0));
    assert_eq!(read_guest(&m, BUF_BASE + 0x2000 + 12, 80), frame(80, 3));
    assert_eq!(stats.snapshot().rx_frames, 3);
}

fn ctrl_cmd(m: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>, first: u16, at: u64, cmd: &[u8]) {
    m.write_slice(cmd, GuestAddress(at)).unwrap();
    m.write_obj(0xffu8, GuestAddress(at + 0x80)).unwrap();
    add_chains(vq, first, &[vec![(at, 2, false), (at + 2, cmd.len() as u32 - 2, false), (at + 0x80, 1, true)]]);
}

#[test]
fn ctrl_sets_queue_pairs_and_refuses_everything_else() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 32);
    ctrl_cmd(&m, &vq, 0, BUF_BASE, &[CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, 2, 0]);
    ctrl_cmd(&m, &vq, 3, BUF_BASE + 0x100, &[CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, 9, 0]); // > max
    ctrl_cmd(&m, &vq, 6, BUF_BASE + 0x200, &[CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, 0, 0]); // zero
    ctrl_cmd(&m, &vq, 9, BUF_BASE + 0x300, &[0, 0, 1]); // RX class, PROMISC on: not offered
                                                        // No ack byte at all.
    add_chains(&vq, 12, &[vec![(BUF_BASE + 0x400, 4, false)]]);
    // GUEST_ANNOUNCE's ack: class and command, no data.
    m.write_slice(&[CTRL_ANNOUNCE, CTRL_ANNOUNCE_ACK], GuestAddress(BUF_BASE + 0x500)).unwrap();
    m.write_obj(0xffu8, GuestAddress(BUF_BASE + 0x580)).unwrap();
    add_chains(&vq, 13, &[vec![(BUF_BASE + 0x500, 2, false), (BUF_BASE + 0x580, 1, true)]]);
    ctrl_cmd(&m, &vq, 16, BUF_BASE + 0x600, &[CTRL_ANNOUNCE, CTRL_ANNOUNCE_ACK, 0]); // with data: refused
    let mut q: Queue = vq.create_queue().unwrap();
    let stats = Stats::default();
    let (run, ch) = ctrl_queue(&mut q, &m, 4, CtrlFeatures::default(), &stats, 64);
    assert_eq!((run.handled, ch.pairs), (7, Some(2)));
    assert_eq!(m.read_obj::<u8>(GuestAddress(BUF_BASE + 0x500 + 0x80)).unwrap(), VIRTIO_NET_OK);
    assert_eq!(m.read_obj::<u8>(GuestAddress(BUF_BASE + 0x600 + 0x80)).unwrap(), VIRTIO_NET_ERR);
    let ack = |at: u64| m.read_obj::<u8>(GuestAddress(at + 0x80)).unwrap();
    assert_eq!(ack(BUF_BASE), VIRTIO_NET_OK);
    assert_eq!(ack(BUF_BASE + 0x100), VIRTIO_NET_ERR);
    assert_eq!(ack(BUF_BASE + 0x200), VIRTIO_NET_ERR);
    assert_eq!(ack(BUF_BASE + 0x300), VIRTIO_NET_ERR);
    assert_eq!(used(&vq, 0), (0, 1));
    assert_eq!(used(&vq, 4), (12, 0));
    assert_eq!(stats.snapshot().errors, 1);
}

#[test]
fn corrupt_avail_index_is_an_error_not_a_panic() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.avail().idx().store(1000);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(run.handled, 0);
    assert!(stats.snapshot().errors >= 1);
}

#[test]
fn tx_copies_into_lent_buffers_and_publishes_the_used_index_once() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 64);
    let (f1, f2, f3) = (frame(100, 1), frame(1514, 2), frame(1518, 3));
    let mut csum_hdr = [0u8; 12];
    csum_hdr[0] = 1;
    let chains = vec![
        tx_descs(&m, BUF_BASE, [0; 12], &f1, 10),
        tx_descs(&m, BUF_BASE + 0x1000, csum_hdr, &f1, 64),
        // Header + frame do not fit a 1516-byte buffer, the frame alone does.
        tx_descs(&m, BUF_BASE + 0x2000, [0; 12], &f2, 1000),
        // The frame alone does not fit: the port refuses it.
        tx_descs(&m, BUF_BASE + 0x3000, [0; 12], &f3, 2048),
        tx_descs(&m, BUF_BASE + 0x4000, [0; 12], &f1, 60),
        tx_descs(&m, BUF_BASE + 0x5000, [0; 12], &f1, 112),
    ];
    add_chains(&vq, 0, &chains);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    port.lend = Some(1516);
    port.room = 3;
    let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!((run.handled, run.used, run.more), (6, true, false));
    // Three buffers lent for five valid chains: the last valid one finds no buffer.
    let lens: Vec<_> = port.sent.iter().map(Vec::len).collect();
    assert_eq!(lens, vec![100, 1514, 100]);
    assert!(port.sent == vec![f1.clone(), f2, f1]);
    assert_eq!(used_idx(&vq), 6);
    for i in 0..6 {
        assert_eq!(used(&vq, i).1, 0, "tx chains are returned with length 0");
    }
    let s = stats.snapshot();
    assert_eq!((s.tx_frames, s.tx_bytes, s.tx_dropped, s.errors), (3, 1714, 2, 1));
}

#[test]
fn tx_with_lent_buffers_matches_the_batch_path() {
    for lend in [None, Some(2048)] {
        let m = mem();
        // 256: the mock's used ring overlaps avail entries past size / 2.
        let vq = MockSplitQueue::new(&m, 256);
        let frames: Vec<_> = (0..100).map(|i| frame(60 + i * 13, i as u8)).collect();
        let chains: Vec<_> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| tx_descs(&m, BUF_BASE + 0x1000 * i as u64, [0; 12], f, 2048))
            .collect();
        add_chains(&vq, 0, &chains);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
        port.lend = lend;
        let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 70);
        assert_eq!((run.handled, run.more), (70, true));
        let run = tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 70);
        assert_eq!((run.handled, run.more), (30, false));
        let lens = |v: &[Vec<u8>]| v.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(lens(&port.sent), lens(&frames), "lend {lend:?}");
        assert!(port.sent == frames, "lend {lend:?}: frames differ");
        assert_eq!(used_idx(&vq), 100);
    }
}

/// Control commands for RSS: accepted only with the feature negotiated, a valid one sets the
/// configuration (and RSS_CONFIG's queue pairs), an invalid one is refused and changes nothing.
#[test]
fn ctrl_rss_and_hash_config() {
    use crate::rss::tests::{rss_cmd, MS_KEY};
    use crate::rss::{hash_type, CTRL_MQ_HASH_CONFIG, CTRL_MQ_RSS_CONFIG};
    let types = hash_type::TCPV4 | hash_type::IPV4;
    let table: Vec<u16> = (0..16).map(|i| i % 3).collect();
    let with = |cmd: u8, data: &[u8]| {
        let mut b = vec![CTRL_MQ, cmd];
        b.extend_from_slice(data);
        b
    };
    let good = with(CTRL_MQ_RSS_CONFIG, &rss_cmd(types, &table, 2, 3, &MS_KEY));
    let bad_queue = with(CTRL_MQ_RSS_CONFIG, &rss_cmd(types, &table, 4, 3, &MS_KEY));
    let mut hash = with(CTRL_MQ_HASH_CONFIG, &hash_type::UDPV4.to_le_bytes());
    hash.extend_from_slice(&[0; 8]);
    hash.push(40);
    hash.extend_from_slice(&MS_KEY);
    let mut oversized = good.clone();
    oversized.resize(2 + MAX_CTRL_DATA + 8, 0);

    let run = |cmds: &[&[u8]], f: CtrlFeatures| {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 64);
        for (i, c) in cmds.iter().enumerate() {
            // Split each command over two descriptors: class+cmd, then data.
            let at = BUF_BASE + 0x1000 * i as u64;
            m.write_slice(c, GuestAddress(at)).unwrap();
            let ack = at + 0x800;
            add_chains(
                &vq,
                (3 * i) as u16,
                &[vec![(at, 2, false), (at + 2, c.len() as u32 - 2, false), (ack, 1, true)]],
            );
        }
        let mut q: Queue = vq.create_queue().unwrap();
        let stats = Stats::default();
        let (_, ch) = ctrl_queue(&mut q, &m, 4, f, &stats, 64);
        let acks: Vec<u8> = (0..cmds.len())
            .map(|i| m.read_obj::<u8>(GuestAddress(BUF_BASE + 0x1000 * i as u64 + 0x800)).unwrap())
            .collect();
        (ch, acks)
    };
    let both = CtrlFeatures { rss: true, hash_report: true, guest_offloads: 0 };
    let (ch, acks) = run(&[&good], both);
    assert_eq!(acks, vec![VIRTIO_NET_OK]);
    let c = ch.rss.unwrap();
    assert_eq!(
        (c.hash_types, c.table, c.unclassified_queue, c.key, ch.pairs),
        (types, table.clone(), 2, MS_KEY, Some(3))
    );
    // Not negotiated: refused.
    let (ch, acks) = run(&[&good, &hash], CtrlFeatures::default());
    assert_eq!((ch.rss, acks), (None, vec![VIRTIO_NET_ERR, VIRTIO_NET_ERR]));
    // Hash report only: HASH_CONFIG yes, RSS_CONFIG no.
    let (ch, acks) = run(&[&hash, &good], CtrlFeatures { rss: false, hash_report: true, guest_offloads: 0 });
    assert_eq!(acks, vec![VIRTIO_NET_OK, VIRTIO_NET_ERR]);
    let c = ch.rss.unwrap();
    assert_eq!((c.hash_types, c.steer), (hash_type::UDPV4, false));
    // Invalid and oversized commands change nothing; the last valid one wins.
    let (ch, acks) = run(&[&good, &bad_queue, &oversized], both);
    assert_eq!(acks, vec![VIRTIO_NET_OK, VIRTIO_NET_ERR, VIRTIO_NET_ERR]);
    assert_eq!(ch.rss.unwrap().unclassified_queue, 2);

    // GUEST_OFFLOADS_SET: only with CTRL_GUEST_OFFLOADS negotiated, only negotiated guest
    // offload bits, exactly a le64; the last valid one wins.
    let offloads = |bits: u64| [&[CTRL_GUEST_OFFLOADS, CTRL_GUEST_OFFLOADS_SET][..], &bits.to_le_bytes()].concat();
    let (csum, tso4) = (1u64 << 1, 1u64 << 7);
    let neg = CtrlFeatures { guest_offloads: csum | tso4, ..CtrlFeatures::default() };
    let (ch, acks) = run(&[&offloads(csum)], CtrlFeatures::default());
    assert_eq!((ch.guest_offloads, acks), (None, vec![VIRTIO_NET_ERR]), "not negotiated");
    let short = offloads(csum)[..9].to_vec();
    let cmds: [&[u8]; 6] =
        [&offloads(csum | tso4), &offloads(1 << 8), &offloads(1 << 11), &short, &offloads(0), &offloads(1 << 63)];
    let (ch, acks) = run(&cmds, neg);
    assert_eq!(
        acks,
        vec![VIRTIO_NET_OK, VIRTIO_NET_ERR, VIRTIO_NET_ERR, VIRTIO_NET_ERR, VIRTIO_NET_OK, VIRTIO_NET_ERR]
    );
    assert_eq!(ch.guest_offloads, Some(0));
}

/// With hash report the RX header is virtio_net_hdr_v1_hash: hash_value and hash_report from
/// the frame's metadata, num_buffers as before; without metadata the report is NONE.
#[test]
fn rx_fills_the_hash_header() {
    use crate::rss::XskMeta;
    let mode = MODE.with_hash_report(true);
    assert_eq!(mode.hdr_len, HASH_HDR_LEN);
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 2048, true)], vec![(BUF_BASE + 0x1000, 2048, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let f = frame(100, 7);
    let meta = XskMeta { hash: 0x51ccc178, report: 2 };
    assert_eq!(rx_frame(&mut q, &m, &f, Some(meta), mode, &mut s, &stats), RxOutcome::Delivered);
    let hdr = read_guest(&m, BUF_BASE, HASH_HDR_LEN);
    assert_eq!(&hdr[10..12], &1u16.to_le_bytes(), "num_buffers");
    assert_eq!(&hdr[12..16], &0x51ccc178u32.to_le_bytes(), "hash_value");
    assert_eq!(&hdr[16..18], &2u16.to_le_bytes(), "hash_report");
    assert_eq!(&hdr[18..20], &[0, 0], "padding");
    assert_eq!(read_guest(&m, BUF_BASE + HASH_HDR_LEN as u64, f.len()), f);
    assert_eq!(used(&vq, 0), (0, (HASH_HDR_LEN + f.len()) as u32));
    // No metadata: zero hash, report NONE.
    m.write_slice(&[0xff; 32], GuestAddress(BUF_BASE + 0x1000)).unwrap();
    assert_eq!(rx_frame(&mut q, &m, &f, None, mode, &mut s, &stats), RxOutcome::Delivered);
    assert_eq!(&read_guest(&m, BUF_BASE + 0x1000, HASH_HDR_LEN)[10..], &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
}

/// Direct RX: frames go from the port's own buffers into the guest; a frame without a guest
/// buffer stays in the port (nothing is copied aside), and arrives once the guest adds one.
#[test]
fn rx_direct_leaves_undelivered_frames_in_the_port() {
    use crate::rss::XskMeta;
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_chains(&vq, 0, &[vec![(BUF_BASE, 2048, true)], vec![(BUF_BASE + 0x1000, 2048, true)]]);
    let mut q: Queue = vq.create_queue().unwrap();
    let mut port = LendingPort { frames: (0..3u8).map(|i| (frame(60, i), i as u32)).collect(), offered: 0 };
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mode = MODE.with_hash_report(true);
    let run = rx_queue(&mut q, &m, &mut port, &mut st, mode, &stats, 64);
    assert_eq!((run.handled, port.frames.len()), (2, 1));
    assert_eq!(read_guest(&m, BUF_BASE + 0x1000 + HASH_HDR_LEN as u64, 60), frame(60, 1));
    assert_eq!(&read_guest(&m, BUF_BASE + 0x1000, HASH_HDR_LEN)[12..16], &1u32.to_le_bytes());
    // The guest adds a buffer: the frame left in the port arrives.
    add_chains(&vq, 2, &[vec![(BUF_BASE + 0x2000, 2048, true)]]);
    let run = rx_queue(&mut q, &m, &mut port, &mut st, mode, &stats, 64);
    assert_eq!((run.handled, port.frames.len()), (1, 0));
    assert_eq!(read_guest(&m, BUF_BASE + 0x2000 + HASH_HDR_LEN as u64, 60), frame(60, 2));
    assert!(port.offered >= 4, "the undelivered frame was offered again");
    let _ = XskMeta::default();
}

/// A port that lends its frames (like `XskPort`), each with a hash equal to its index.
struct LendingPort {
    frames: VecDeque<(Vec<u8>, u32)>,
    offered: usize,
}

impl Port for LendingPort {
    fn recv(&mut self, _batch: &mut Batch, _max: usize) -> io::Result<usize> {
        panic!("a lending port is read with rx_each only")
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        Ok(batch.len())
    }
    fn rx_each(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], Option<crate::rss::XskMeta>) -> bool,
    ) -> Option<io::Result<usize>> {
        let mut n = 0;
        while n < max {
            let Some((fr, h)) = self.frames.front() else { break };
            self.offered += 1;
            if !f(fr, Some(crate::rss::XskMeta { hash: *h, report: 2 })) {
                break;
            }
            self.frames.pop_front();
            n += 1;
        }
        Some(Ok(n))
    }
    fn fd(&self) -> RawFd {
        -1
    }
    fn describe(&self) -> String {
        "lending port".into()
    }
}

#[path = "net_offload_tests.rs"]
mod offload_tx;

#[path = "net_gso_tests.rs"]
mod gso_tx;

#[path = "net_gro_tests.rs"]
mod gro_rx;

#[path = "net_notify_tests.rs"]
mod notify;
