//! The virtio-net datapath on one queue: guest-controlled descriptor chains in, frames out.
//!
//! Everything here works on a plain `virtio_queue::Queue` and any `GuestMemory`, so it is unit
//! tested with `MockSplitQueue`. Every value read from the guest (descriptor addresses, lengths,
//! flags, ring indexes, headers, control commands) is validated; a bad chain is counted in
//! [`Stats::errors`], returned to the guest with length 0 and its frame dropped. Nothing panics.
//!
//! TX offloads (checksum, TSO, USO) are validated and executed in software by `offload.rs` when
//! negotiated ([`NetMode::offloads`]); a TX header asking for anything else is rejected.

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use crate::offload::gro::{self, Out};
use crate::offload::{OffloadError, Offloads, TxHdr, MAX_GSO_FRAME};
use crate::port::{Batch, Port};
pub use crate::rss::hash::RxHash;
use crate::rss::XskMeta;
use ring::{add_used_fast, arm_for_more, publish_used, Next, RegionOf, Regions, Ring};

/// The fast path's view of a queue run (None: everything takes the checked path).
type FastRing<'a, M> = Option<Ring<'a, RegionOf<M>>>;

/// `virtio_net_hdr_v1` / `virtio_net_hdr_mrg_rxbuf`: used with VERSION_1 or MRG_RXBUF.
pub const HDR_LEN: usize = 12;
/// `virtio_net_hdr_v1_hash`: used with VIRTIO_NET_F_HASH_REPORT (`hash_value`, `hash_report`,
/// padding after the v1 header).
pub const HASH_HDR_LEN: usize = 20;
/// The legacy `virtio_net_hdr` without `num_buffers`.
pub const LEGACY_HDR_LEN: usize = 10;
/// Shortest frame accepted from the guest: an Ethernet header.
pub const ETH_HLEN: usize = 14;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the frame's checksum was verified.
const HDR_F_DATA_VALID: u8 = 2;
/// Frames moved per port call.
pub const BATCH: usize = 64;
/// Why a descriptor chain was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// No descriptor with a non-zero length.
    #[error("descriptor chain is empty")]
    Empty,
    /// A device-readable descriptor where a device-writable one was required, or the reverse.
    #[error("descriptor direction mismatch (expected {})", if *.expected_writable { "write-only" } else { "read-only" })]
    Direction {
        /// What the queue requires.
        expected_writable: bool,
    },
    /// The chain is shorter than the header plus an Ethernet header.
    #[error("descriptor chain too short: {0} bytes")]
    TooShort(usize),
    /// The frame is larger than the maximum frame size.
    #[error("frame too large: more than {0} bytes")]
    TooLarge(usize),
    /// A descriptor points outside guest memory.
    #[error("descriptor address {0:#x} (+{1}) is outside guest memory")]
    BadAddress(u64, usize),
    /// The TX header asks for an offload that was not negotiated, or lies about the frame.
    #[error("tx header: {0}")]
    Offload(#[from] OffloadError),
    /// A control command without a writable ack byte.
    #[error("control command has no writable ack byte")]
    NoAck,
    /// The walk stopped at a descriptor that still says NEXT: the chain loops (longer than
    /// the queue), or a next index, a descriptor table read or an indirect table is invalid.
    /// virtio-queue's iterator just ends there; the truncated chain is refused, not used.
    #[error("descriptor chain loops or continues past the table")]
    Unterminated,
}

/// Header layout negotiated with the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetMode {
    /// 12 with VERSION_1 or MRG_RXBUF, else 10.
    pub hdr_len: usize,
    /// MRG_RXBUF negotiated: a frame may span several RX chains.
    pub mergeable: bool,
    /// Largest frame (without virtio header) accepted from the guest.
    pub max_frame: usize,
    /// VIRTIO_NET_F_HASH_REPORT negotiated: the RX header is `virtio_net_hdr_v1_hash`
    /// ([`HASH_HDR_LEN`]) and carries the hash `steer_vm` computed.
    pub hash_report: bool,
    /// TX offloads negotiated (checksum, segmentation): with segmentation a TX chain may carry
    /// up to [`MAX_GSO_FRAME`] bytes of frame.
    pub offloads: Offloads,
    /// With `hash_report`, the guest's hash configuration (enabled types, key), for the path that
    /// computes the hash itself (`--rx-gso kernel`: no `steer_vm` puts it in front of the frame).
    pub rx_hash: Option<RxHash>,
}

impl NetMode {
    /// With `on`, the RX header is `virtio_net_hdr_v1_hash` (needs VERSION_1).
    pub fn with_hash_report(mut self, on: bool) -> Self {
        self.hash_report = on;
        if on {
            self.hdr_len = HASH_HDR_LEN;
        }
        self
    }

    /// With the guest's hash configuration `h` (kept only with `hash_report` and some type on).
    pub fn with_rx_hash(mut self, h: Option<RxHash>) -> Self {
        self.rx_hash = h.filter(|h| self.hash_report && h.types != 0);
        self
    }

    /// With the TX offloads `off` negotiated.
    pub fn with_offloads(mut self, off: Offloads) -> Self {
        self.offloads = off;
        self
    }

    /// Largest frame a TX chain may carry (before segmentation).
    pub fn max_tx_frame(&self) -> usize {
        if self.offloads.gso() {
            MAX_GSO_FRAME.max(self.max_frame)
        } else {
            self.max_frame
        }
    }
}

/// Reusable per-queue buffers.
#[derive(Debug, Default)]
pub struct Scratch {
    segs: Vec<(GuestAddress, usize)>,
    /// A TX frame to segment, copied out of guest memory (the guest cannot change our copy).
    big: Vec<u8>,
    used: Vec<(u16, usize)>,
    /// RX frames and bytes delivered and not yet added to [`Stats`] (one atomic add per run,
    /// not per frame; see [`Scratch::count_rx`]).
    rx_frames: u64,
    rx_bytes: u64,
    rx_csum_valid: u64,
}

impl Scratch {
    /// Add the delivered frames to `stats`.
    fn count_rx(&mut self, stats: &Stats) {
        if self.rx_frames != 0 {
            Stats::add(&stats.rx_frames, std::mem::take(&mut self.rx_frames));
            Stats::add(&stats.rx_bytes, std::mem::take(&mut self.rx_bytes));
        }
        if self.rx_csum_valid != 0 {
            Stats::add(&stats.rx_csum_valid, std::mem::take(&mut self.rx_csum_valid));
        }
    }
}

/// Result of offering one frame to the RX queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written and added to the used ring.
    Delivered,
    /// Dropped (counted); chains consumed, if any, were added to the used ring.
    Dropped,
    /// The guest has no (more) buffers; nothing was consumed.
    NoBuffers,
    /// A coalesced segment the guest's buffers cannot take whole (not enough of them, or a
    /// chain too small without MRG_RXBUF); nothing was consumed: deliver its frames one by one.
    Split,
}

/// What a queue run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueRun {
    /// Entries were added to the used ring: the guest may need a notification.
    pub used: bool,
    /// Stopped on the budget with work left: run again later.
    pub more: bool,
    /// Frames (or commands) handled.
    pub handled: usize,
}

/// Pop the next available chain; a corrupt available ring is counted as an error.
pub fn pop_chain<'a, M: GuestMemory>(q: &mut Queue, mem: &'a M, stats: &Stats) -> Option<DescriptorChain<&'a M>> {
    match q.iter(mem) {
        Ok(mut it) => it.next(),
        Err(e) => {
            stats.error(&e);
            None
        }
    }
}

fn add_used<M: GuestMemory>(q: &mut Queue, mem: &M, head: u16, len: usize, stats: &Stats) {
    if head >= q.size() {
        // A head outside the table yields an empty chain, already counted as an error; there
        // is no descriptor to give back.
        return;
    }
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    if let Err(e) = q.add_used(mem, head, len) {
        stats.error(&e);
    }
}

/// Append the chain's descriptors to `segs` after checking direction, total size (`limit`) and
/// that each lies in guest memory. Returns the chain's byte count.
fn collect<M: GuestMemory>(
    chain: DescriptorChain<&M>,
    mem: &M,
    writable: bool,
    limit: usize,
    segs: &mut Vec<(GuestAddress, usize)>,
) -> Result<usize, ChainError> {
    let start = segs.len();
    let perm = if writable { Permissions::Write } else { Permissions::Read };
    let mut total = 0usize;
    let res = (|| {
        let mut open = false;
        for d in chain {
            open = d.has_next();
            if d.is_write_only() != writable {
                return Err(ChainError::Direction { expected_writable: writable });
            }
            let len = d.len() as usize;
            total = total.saturating_add(len);
            if total > limit {
                return Err(ChainError::TooLarge(limit));
            }
            if len == 0 {
                continue;
            }
            if !mem.check_range(d.addr(), len, perm) {
                return Err(ChainError::BadAddress(d.addr().0, len));
            }
            segs.push((d.addr(), len));
        }
        if open {
            return Err(ChainError::Unterminated);
        }
        if segs.len() == start {
            return Err(ChainError::Empty);
        }
        Ok(total)
    })();
    if res.is_err() {
        segs.truncate(start);
    }
    res
}

/// Write `parts` back to back into `segs` (through the region table when there is one).
fn scatter<M: GuestMemory>(
    mem: &M,
    mut regions: Option<&mut Regions<'_, RegionOf<M>>>,
    segs: &[(GuestAddress, usize)],
    parts: &[&[u8]],
) -> Result<(), ChainError> {
    let (mut i, mut off) = (0usize, 0usize);
    // The current segment's slice, translated once per segment.
    let mut cur = None;
    for part in parts {
        let mut p = *part;
        while !p.is_empty() {
            let &(addr, len) = segs.get(i).ok_or(ChainError::TooShort(off))?;
            if off == 0 {
                cur = regions.as_mut().and_then(|r| r.slice(addr.0, len));
            }
            let n = (len - off).min(p.len());
            let at = addr.checked_add(off as u64).ok_or(ChainError::BadAddress(addr.0, len))?;
            let fast = cur.as_ref().map(|b| b.write_slice(&p[..n], off));
            if !matches!(fast, Some(Ok(()))) {
                mem.write_slice(&p[..n], at).map_err(|_| ChainError::BadAddress(at.0, n))?;
            }
            off += n;
            p = &p[n..];
            if off == len {
                i += 1;
                off = 0;
            }
        }
    }
    Ok(())
}

/// Fill `out` from `segs`, skipping the first `skip` bytes (through the region table when there
/// is one).
fn gather<M: GuestMemory>(
    mem: &M,
    mut regions: Option<&mut Regions<'_, RegionOf<M>>>,
    segs: &[(GuestAddress, usize)],
    mut skip: usize,
    out: &mut [u8],
) -> Result<(), ChainError> {
    let mut done = 0;
    for &(addr, len) in segs {
        if done == out.len() {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(out.len() - done);
        let at = addr.checked_add(skip as u64).ok_or(ChainError::BadAddress(addr.0, len))?;
        let dst = &mut out[done..done + n];
        let fast = regions.as_mut().and_then(|r| r.slice(addr.0, len)).map(|b| b.read_slice(dst, skip));
        if !matches!(fast, Some(Ok(()))) {
            mem.read_slice(&mut out[done..done + n], at).map_err(|_| ChainError::BadAddress(at.0, n))?;
        }
        done += n;
        skip = 0;
    }
    if done < out.len() {
        return Err(ChainError::TooShort(done));
    }
    Ok(())
}

/// Offer one frame to the RX queue: header + frame across one chain, or with MRG_RXBUF across
/// as many chains as needed (`num_buffers` says how many).
pub fn rx_frame<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    frame: &[u8],
    meta: Option<XskMeta>,
    mode: NetMode,
    s: &mut Scratch,
    stats: &Stats,
) -> RxOutcome {
    let out = rx_frame_in(q, mem, &mut None, frame, meta, None, mode, s, stats);
    s.count_rx(stats);
    out
}

/// [`rx_frame`] with the fast path's ring of the current run; with `gso` the frame is a
/// coalesced segment delivered with that header, or [`RxOutcome::Split`].
#[allow(clippy::too_many_arguments)]
fn rx_frame_in<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    frame: &[u8],
    meta: Option<XskMeta>,
    gso: Option<&TxHdr>,
    mode: NetMode,
    s: &mut Scratch,
    stats: &Stats,
) -> RxOutcome {
    let total = mode.hdr_len + frame.len();
    let mut start = q.next_avail();
    s.segs.clear();
    s.used.clear();
    let mut cap = 0usize;
    // The buffer of a frame that fits the first (plain) chain: written without a second lookup.
    let mut one = None;
    while cap < total {
        let fast = ring.as_mut().map_or(Next::Checked, |r| r.next(q, true));
        let (head, res) = match fast {
            Next::Simple { head, addr, buf } => {
                q.set_next_avail(q.next_avail().wrapping_add(1));
                let len = buf.len();
                if s.segs.is_empty() {
                    one = Some(buf);
                }
                s.segs.push((addr, len));
                (head, Ok(len))
            }
            Next::Checked => {
                let Some(chain) = pop_chain(q, mem, stats) else {
                    // Give back the chains taken for this frame; the guest kicks when it adds more.
                    q.set_next_avail(start);
                    s.segs.clear();
                    // A segment the buffers the guest has cannot take: it may never add more
                    // (a full ring of small buffers), so its frames go one by one.
                    let split = gso.is_some() && !s.used.is_empty();
                    s.used.clear();
                    return if split { RxOutcome::Split } else { RxOutcome::NoBuffers };
                };
                (chain.head_index(), collect(chain, mem, true, usize::MAX, &mut s.segs))
            }
        };
        match res {
            Ok(c) if !mode.mergeable && c < total => {
                // Without mergeable buffers a frame must fit one chain: drop the frame (a
                // segment: split it), keep the chain for the next one.
                s.segs.clear();
                q.set_next_avail(start);
                if gso.is_some() {
                    return RxOutcome::Split;
                }
                stats.rx_drop(RxDrop::NoRoom);
                return RxOutcome::Dropped;
            }
            Ok(c) => {
                s.used.push((head, c));
                cap = cap.saturating_add(c);
            }
            Err(e) => {
                stats.error(&e);
                add_used_fast(q, mem, ring, head, 0, stats);
                if s.used.is_empty() {
                    start = q.next_avail();
                    continue;
                }
                // Chains already taken for this frame cannot be handed back past the bad one.
                return drop_taken(q, mem, ring, s, stats);
            }
        }
    }
    let mut hdr = [0u8; HASH_HDR_LEN];
    if mode.hdr_len >= HDR_LEN {
        // num_buffers <= queue size <= 32768, so it fits.
        hdr[10..12].copy_from_slice(&(s.used.len() as u16).to_le_bytes());
    }
    if let Some(h) = gso {
        // flags (NEEDS_CSUM), gso_type, hdr_len, gso_size, csum_start, csum_offset.
        hdr[..10].copy_from_slice(&h.bytes());
    } else if mode.offloads.guest_csum && crate::offload::rx_csum_ok(frame) {
        hdr[0] = HDR_F_DATA_VALID;
        s.rx_csum_valid += 1;
    }
    if mode.hash_report && mode.hdr_len == HASH_HDR_LEN {
        // No metadata: hash_report VIRTIO_NET_HASH_REPORT_NONE (the guest enabled no type
        // that applies, or configured none).
        if let Some(m) = meta.filter(|m| m.report != 0) {
            hdr[12..16].copy_from_slice(&m.hash.to_le_bytes());
            hdr[16..18].copy_from_slice(&m.report.to_le_bytes());
        }
    }
    let hdr = &hdr[..mode.hdr_len];
    let written = match one.filter(|_| s.segs.len() == 1) {
        Some(b) => b.write_slice(hdr, 0).and_then(|()| b.write_slice(frame, hdr.len())).is_ok(),
        None => false,
    };
    let regions = ring.as_mut().map(|r| &mut r.regions);
    if !written {
        if let Err(e) = scatter(mem, regions, &s.segs, &[hdr, frame]) {
            stats.error(&e);
            return drop_taken(q, mem, ring, s, stats);
        }
    }
    let mut remaining = total;
    for i in 0..s.used.len() {
        let (head, c) = s.used[i];
        let n = c.min(remaining);
        remaining -= n;
        add_used_fast(q, mem, ring, head, n, stats);
    }
    s.rx_frames += 1;
    s.rx_bytes += frame.len() as u64;
    RxOutcome::Delivered
}

fn drop_taken<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    s: &mut Scratch,
    stats: &Stats,
) -> RxOutcome {
    for i in 0..s.used.len() {
        add_used_fast(q, mem, ring, s.used[i].0, 0, stats);
    }
    s.used.clear();
    s.segs.clear();
    stats.rx_drop(RxDrop::BadChain);
    RxOutcome::Dropped
}

/// RX state of one queue pair: frames taken from the port but not yet delivered.
#[derive(Debug, Default)]
pub struct RxState {
    pending: Batch,
    /// With GUEST_TSO: the hash metadata of each pending frame, and what the batch became
    /// (`pos` then indexes `outs`).
    metas: Vec<Option<XskMeta>>,
    outs: Vec<Out>,
    grouped: bool,
    pos: usize,
    scratch: Scratch,
    /// Wire -> guest through the kernel (`net_krx.rs`): a segment being cut, and the next of its
    /// segments to deliver (0: none started).
    cut: Vec<u8>,
    kernel_seg: usize,
}

/// One packet for the guest: its bytes, hash metadata, and for a coalesced segment its header
/// and the pending frames it holds.
type Item<'a> = (&'a [u8], Option<XskMeta>, Option<(&'a TxHdr, &'a [usize])>);

impl RxState {
    /// Forget pending frames (device reset or new connection).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.metas.clear();
        self.outs.clear();
        self.grouped = false;
        self.pos = 0;
        self.kernel_seg = 0;
    }

    /// Frames received from the port and waiting for guest buffers.
    pub fn backlog(&self) -> usize {
        if !self.grouped {
            return self.pending.len() - self.pos;
        }
        let n = |o: &Out| if let Out::Segment { idx, .. } = o { idx.len() } else { 1 };
        self.outs.get(self.pos..).unwrap_or_default().iter().map(n).sum()
    }

    /// Packets pending (frames, or with GUEST_TSO what the batch became).
    fn len(&self) -> usize {
        if self.grouped {
            self.outs.len()
        } else {
            self.pending.len()
        }
    }

    /// Take the next batch from the port; with GUEST_TSO coalesce it (`gro.rs`), keeping the
    /// hash metadata of each frame.
    fn fill(&mut self, port: &mut dyn Port, mode: NetMode) -> std::io::Result<usize> {
        if !mode.offloads.guest_tso() {
            return port.recv(&mut self.pending, BATCH);
        }
        let (pending, metas) = (&mut self.pending, &mut self.metas);
        let mut keep = |f: &[u8], m: Option<XskMeta>| {
            pending.push(f);
            metas.push(m);
            true
        };
        let n = match port.rx_each(BATCH, &mut keep) {
            Some(r) => r?,
            None => {
                let n = port.recv(&mut self.pending, BATCH)?;
                self.metas.resize(self.pending.len(), None);
                n
            }
        };
        let frames: Vec<&[u8]> = self.pending.iter().collect();
        gro::coalesce(&frames, MAX_GSO_FRAME, mode.offloads, &mut self.outs, &mut gro::GroStats::default());
        self.grouped = true;
        Ok(n)
    }
}

/// Packet `pos` of the pending batch.
fn item<'a>(
    pending: &'a Batch,
    metas: &[Option<XskMeta>],
    outs: &'a [Out],
    grouped: bool,
    pos: usize,
) -> Option<Item<'a>> {
    if !grouped {
        return Some((pending.get(pos)?, None, None));
    }
    match outs.get(pos)? {
        Out::Pass(i) => Some((pending.get(*i)?, metas.get(*i).copied().flatten(), None)),
        Out::Segment { idx, hdr, frame } => Some((frame, metas.get(idx[0]).copied().flatten(), Some((hdr, idx)))),
    }
}

/// Move frames from `port` into the RX queue until the port is empty, the guest has no buffers
/// (notifications are then enabled so the guest kicks when it adds some) or `budget` frames.
pub fn rx_queue<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    port: &mut dyn Port,
    st: &mut RxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> QueueRun {
    let used_before = q.next_used();
    let mut ring = ring::ring(q, mem);
    let mut run = rx_fill(q, mem, &mut ring, port, st, mode, stats, budget);
    // One used index store for the whole run.
    publish_used(q, &mut ring, used_before, stats);
    st.scratch.count_rx(stats);
    run.used = q.next_used() != used_before;
    run
}

#[allow(clippy::too_many_arguments)]
fn rx_fill<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    port: &mut dyn Port,
    st: &mut RxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> QueueRun {
    // Whole packets from the kernel's packet socket, when the port has one.
    if st.pos >= st.len() {
        if let Some(run) = krx::rx_kernel(q, mem, ring, port, st, mode, stats, budget) {
            return run;
        }
    }
    // With GUEST_TSO a batch is taken whole (and coalesced) before anything is delivered.
    if st.pos >= st.len() && !mode.offloads.guest_tso() {
        if let Some(run) = rx_direct(q, mem, ring, port, &mut st.scratch, mode, stats, budget) {
            return run;
        }
    }
    let mut run = QueueRun::default();
    loop {
        if st.pos >= st.len() {
            st.reset();
            if run.handled >= budget {
                run.more = true;
                return run;
            }
            match st.fill(port, mode) {
                Ok(0) => return run,
                Ok(_) => {}
                Err(e) => {
                    log::warn!("{}: receive failed: {e}", port.describe());
                    return run;
                }
            }
        }
        let mut rearmed = false;
        while let Some((frame, meta, seg)) = item(&st.pending, &st.metas, &st.outs, st.grouped, st.pos) {
            let out = rx_frame_in(q, mem, ring, frame, meta, seg.map(|s| s.0), mode, &mut st.scratch, stats);
            if let Some((_, idx)) = seg {
                if out == RxOutcome::Split {
                    Stats::add(&stats.rx_gro_split, idx.len() as u64);
                    let idx = idx.to_vec();
                    st.outs.splice(st.pos..=st.pos, idx.into_iter().map(Out::Pass));
                    continue;
                }
                count_segment(&st.pending, idx, frame.len(), out, &mut st.scratch, stats);
            }
            match out {
                // Buffers that appeared while notifications were being re-enabled are used at
                // once, but only once: a ring that still yields nothing (corrupt index) waits.
                RxOutcome::NoBuffers if rearmed => return run,
                RxOutcome::NoBuffers => match arm_for_more(q, mem) {
                    Ok(true) => {
                        rearmed = true;
                        continue;
                    }
                    Ok(false) => return run,
                    Err(e) => {
                        stats.error(&e);
                        return run;
                    }
                },
                // Progress: a later shortage must re-arm notifications at the new position.
                RxOutcome::Delivered | RxOutcome::Dropped | RxOutcome::Split => rearmed = false,
            }
            st.pos += 1;
            run.handled += 1;
        }
    }
}

/// Count a coalesced segment of the pending frames `idx` (`len` bytes) as its wire frames: one
/// guest packet in the offload counters, every frame in the delivered (or dropped) ones.
fn count_segment(pending: &Batch, idx: &[usize], len: usize, out: RxOutcome, s: &mut Scratch, stats: &Stats) {
    let n = idx.len() as u64;
    match out {
        RxOutcome::Delivered => {
            Stats::add(&stats.rx_gro_segments, 1);
            Stats::add(&stats.rx_gro_merged, n);
            let wire: usize = idx.iter().filter_map(|&i| pending.get(i)).map(<[u8]>::len).sum();
            s.rx_frames += n - 1;
            s.rx_bytes += (wire - len) as u64;
        }
        RxOutcome::Dropped => {
            for _ in 1..n {
                stats.rx_drop(RxDrop::BadChain);
            }
        }
        RxOutcome::NoBuffers | RxOutcome::Split => {}
    }
}

/// RX without an intermediate copy: each frame goes from the port's buffer (the AF_XDP UMEM)
/// straight into the guest's descriptor chain; a frame the guest has no buffer for stays in
/// the port. None when the port does not lend its frames ([`Port::rx_each`]).
#[allow(clippy::too_many_arguments)]
fn rx_direct<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    port: &mut dyn Port,
    scratch: &mut Scratch,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> Option<QueueRun> {
    let (stop, rearmed) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
    let mut deliver = |frame: &[u8], meta: Option<XskMeta>| -> bool {
        offer(q, mem, stats, &stop, &rearmed, |q, mem| {
            rx_frame_in(q, mem, ring, frame, meta, None, mode, scratch, stats)
        })
    };
    rx_budgeted(port, budget, &stop, |port, max| port.rx_each(max, &mut deliver))
}

/// One budgeted receive run: `pull(port, max)` hands up to `max` packets to the guest (None:
/// the port has no such receive path; Ok(0): nothing waiting). Ends at the budget (`more`
/// set), when nothing waits, when the guest ran out of buffers (`stop`) or on an error, which is
/// logged. None when the port has no such path and nothing was handled.
pub(super) fn rx_budgeted(
    port: &mut dyn Port,
    budget: usize,
    stop: &std::cell::Cell<bool>,
    mut pull: impl FnMut(&mut dyn Port, usize) -> Option<std::io::Result<usize>>,
) -> Option<QueueRun> {
    let mut run = QueueRun::default();
    loop {
        if run.handled >= budget {
            run.more = true;
            return Some(run);
        }
        let max = BATCH.min(budget - run.handled);
        match pull(&mut *port, max) {
            None => return if run.handled == 0 { None } else { Some(run) },
            Some(Ok(0)) => return Some(run),
            // Fewer than asked and the guest took all it was offered: the port ran dry (a packet
            // socket said EAGAIN, the AF_XDP ring was short). Asking again would only hear that
            // once more, a syscall per wake-up on a packet socket; what arrives later fires the
            // port's edge-triggered fd.
            Some(Ok(n)) if n < max && !stop.get() => {
                run.handled += n;
                return Some(run);
            }
            Some(Ok(n)) => run.handled += n,
            Some(Err(e)) => {
                log::warn!("{}: receive failed: {e}", port.describe());
                return Some(run);
            }
        }
        if stop.get() {
            return Some(run);
        }
    }
}

/// Offer one packet to the guest through `attempt` (which returns what became of it): true when
/// it was taken (delivered or dropped); false, with `stop` set, when the guest has no buffers
/// (notifications are then enabled, so the guest kicks when it adds some).
fn offer<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    stats: &Stats,
    stop: &std::cell::Cell<bool>,
    rearmed: &std::cell::Cell<bool>,
    mut attempt: impl FnMut(&mut Queue, &M) -> RxOutcome,
) -> bool {
    loop {
        match attempt(q, mem) {
            // Buffers that appeared while notifications were being re-enabled are used at
            // once, but only once: a ring that still yields nothing (corrupt index) waits.
            RxOutcome::NoBuffers if rearmed.get() => {}
            RxOutcome::NoBuffers => match arm_for_more(q, mem) {
                Ok(true) => {
                    rearmed.set(true);
                    continue;
                }
                Ok(false) => {}
                Err(e) => stats.error(&e),
            },
            // Progress: a later shortage must re-arm notifications at the new position.
            RxOutcome::Delivered | RxOutcome::Dropped | RxOutcome::Split => {
                rearmed.set(false);
                return true;
            }
        }
        stop.set(true);
        return false;
    }
}

#[path = "net_krx.rs"]
mod krx;

#[path = "net_stats.rs"]
mod stats;
pub(crate) use stats::RxDrop;
pub use stats::{ErrorKind, GuestError, Stats, StatsSnapshot};

#[path = "net_ctrl.rs"]
mod ctrl;
pub use ctrl::{
    ctrl_chain, ctrl_queue, CtrlChanges, CtrlFeatures, CtrlReply, CTRL_ANNOUNCE, CTRL_ANNOUNCE_ACK,
    CTRL_GUEST_OFFLOADS, CTRL_GUEST_OFFLOADS_SET, CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, GUEST_OFFLOAD_BITS, MAX_CTRL_DATA,
    VIRTIO_NET_ERR, VIRTIO_NET_F_CTRL_GUEST_OFFLOADS, VIRTIO_NET_OK,
};

#[path = "net_ring.rs"]
mod ring;

#[path = "net_tx.rs"]
mod tx;
pub use tx::{
    arm_tx, moderate_tx, needs_signal, tx_chain, tx_consumed, tx_poll, tx_queue, TxOwed, TxState, TX_NOTIFY_MAX_FRAMES,
};

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
