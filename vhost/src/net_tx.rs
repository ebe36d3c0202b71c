//! TX (guest -> port) datapath of one queue, in batches: pop up to [`BATCH`] chains with one read
//! of the available index, copy each frame straight into a buffer lent by the port (one copy per
//! descriptor, header and frame together), send the batch with one port call, then add every
//! chain to the used ring and publish the used index once. The notification decision for the
//! whole run is [`needs_signal`] (EVENT_IDX `used_event`, or `VRING_AVAIL_F_NO_INTERRUPT`).

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use super::ring::{Next, RegionOf, Regions, Slice};
use super::HDR_LEN;
use super::{collect, gather, pop_chain, ChainError, FastRing, NetMode, QueueRun, Scratch, Stats, BATCH, ETH_HLEN};
use crate::offload::{self, write_segment, write_segment_partial, Gso, OffloadError, Plan, TxHdr};
use crate::port::{Batch, Port, TxFrame};

/// Validate one TX chain and append its frame(s) (header stripped; a GSO chain becomes several)
/// to `out`.
pub fn tx_chain<M: GuestMemory>(
    chain: DescriptorChain<&M>,
    mem: &M,
    mode: NetMode,
    s: &mut Scratch,
    out: &mut Batch,
    stats: &Stats,
) -> Result<usize, ChainError> {
    s.segs.clear();
    let total = collect(chain, mem, false, mode.hdr_len + mode.max_tx_frame(), &mut s.segs)?;
    if total < mode.hdr_len + ETH_HLEN {
        return Err(ChainError::TooShort(total));
    }
    let segs = std::mem::take(&mut s.segs);
    let res = to_batch(mem, None, mode, &segs, total, &mut s.big, out, stats);
    s.segs = segs;
    res
}

/// What a copied frame without segmentation needs: nothing, or a checksum. Checked on our copy:
/// the guest cannot change it between check and send. With `defer` a request for the frame's
/// own TCP/UDP checksum is returned for the port to finish (the kernel, through AF_XDP TX
/// metadata); any other is filled in here.
fn single(
    h: &TxHdr,
    frame: &mut [u8],
    mode: NetMode,
    stats: &Stats,
    defer: bool,
) -> Result<Option<(u16, u16)>, ChainError> {
    match offload::plan(h, frame, mode.offloads, mode.max_frame)? {
        _ if frame.len() > mode.max_frame => Err(ChainError::TooLarge(mode.max_frame)),
        Plan::Single { csum: Some((start, offset)) } => {
            Stats::add(&stats.tx_csum, 1);
            if defer && offload::l4_csum_at(frame, start, offset) {
                // Both fit in u16: they came from the header's u16 fields.
                return Ok(Some((start as u16, offset as u16)));
            }
            offload::fill_csum(frame, start, offset);
            Ok(None)
        }
        Plan::Single { csum: None } => Ok(None),
        // The header was read once and said "no GSO"; a copy saying otherwise changed under us.
        Plan::Gso(_) => Err(OffloadError::Mismatch(h.gso_type, "header changed while copied").into()),
    }
}

/// The header of a collected chain (copied to the stack).
fn read_hdr<M: GuestMemory>(
    mem: &M,
    regions: Option<&mut Regions<'_, RegionOf<M>>>,
    mode: NetMode,
    segs: &[(GuestAddress, usize)],
) -> Result<TxHdr, ChainError> {
    let mut hdr = [0u8; HDR_LEN];
    let n = mode.hdr_len.min(HDR_LEN);
    gather(mem, regions, segs, 0, &mut hdr[..n])?;
    Ok(TxHdr::parse(&hdr[..n]))
}

/// Copy the frame of a GSO chain into `big` and plan its segmentation there.
#[allow(clippy::too_many_arguments)]
fn stage_gso<M: GuestMemory>(
    mem: &M,
    regions: Option<&mut Regions<'_, RegionOf<M>>>,
    h: &TxHdr,
    mode: NetMode,
    segs: &[(GuestAddress, usize)],
    total: usize,
    big: &mut Vec<u8>,
    stats: &Stats,
) -> Result<Gso, ChainError> {
    big.clear();
    big.resize(total - mode.hdr_len, 0);
    gather(mem, regions, segs, mode.hdr_len, big)?;
    match offload::plan(h, big, mode.offloads, mode.max_frame)? {
        Plan::Gso(g) => {
            Stats::add(&stats.tx_gso, 1);
            Ok(g)
        }
        Plan::Single { .. } => Err(OffloadError::Mismatch(h.gso_type, "not a GSO request").into()),
    }
}

/// Append the frame(s) of a collected chain (`total` bytes in `segs`) to `out`.
#[allow(clippy::too_many_arguments)]
fn to_batch<M: GuestMemory>(
    mem: &M,
    mut regions: Option<&mut Regions<'_, RegionOf<M>>>,
    mode: NetMode,
    segs: &[(GuestAddress, usize)],
    total: usize,
    big: &mut Vec<u8>,
    out: &mut Batch,
    stats: &Stats,
) -> Result<usize, ChainError> {
    let h = read_hdr(mem, regions.as_deref_mut(), mode, segs)?;
    if h.is_gso() {
        let g = stage_gso(mem, regions, &h, mode, segs, total, big, stats)?;
        for i in 0..g.segs {
            let n = g.seg_len(i, big.len());
            out.push_with(n, |buf| write_segment(big, &g, i, buf).map(|_| ()).ok_or(ChainError::TooLarge(n)))?;
        }
        return Ok(big.len());
    }
    let len = total - mode.hdr_len;
    out.push_with(len, |buf| {
        gather(mem, regions, segs, mode.hdr_len, buf)?;
        single(&h, buf, mode, stats, false).map(|_| ())
    })?;
    Ok(len)
}

/// Where a chain's frame went: into the lent buffer (the frame's place in it and its checksum
/// request), or, for a GSO chain, into the scratch buffer (to be cut).
enum Staged {
    Buf(TxFrame),
    Gso(Gso),
}

/// Copy a collected chain into the port buffer `buf` (a GSO chain into `big`). Header and frame
/// are copied together when they fit (the frame then starts after the header), else the header
/// goes to the stack and the frame to the buffer's start.
#[allow(clippy::too_many_arguments)]
fn to_buf<M: GuestMemory>(
    mem: &M,
    mut regions: Option<&mut Regions<'_, RegionOf<M>>>,
    one: Option<&Slice<'_, RegionOf<M>>>,
    mode: NetMode,
    segs: &[(GuestAddress, usize)],
    total: usize,
    buf: &mut [u8],
    big: &mut Vec<u8>,
    stats: &Stats,
) -> Result<Staged, ChainError> {
    let (len, cap) = (total - mode.hdr_len, buf.len());
    if total <= cap {
        let all = &mut buf[..total];
        // A plain chain's buffer, resolved when it was popped: one copy, no lookup.
        if !one.is_some_and(|b| b.len() == total && b.read_slice(all, 0).is_ok()) {
            gather(mem, regions, segs, 0, all)?;
        }
        let (hdr, frame) = all.split_at_mut(mode.hdr_len);
        let h = TxHdr::parse(hdr);
        if h.is_gso() {
            big.clear();
            big.extend_from_slice(frame);
            return match offload::plan(&h, big, mode.offloads, mode.max_frame)? {
                Plan::Gso(g) => {
                    Stats::add(&stats.tx_gso, 1);
                    Ok(Staged::Gso(g))
                }
                Plan::Single { .. } => Err(OffloadError::Mismatch(h.gso_type, "not a GSO request").into()),
            };
        }
        let csum = single(&h, frame, mode, stats, true)?;
        return Ok(Staged::Buf(TxFrame { off: mode.hdr_len, len, csum }));
    }
    let h = read_hdr(mem, regions.as_deref_mut(), mode, segs)?;
    if h.is_gso() {
        return stage_gso(mem, regions, &h, mode, segs, total, big, stats).map(Staged::Gso);
    }
    let out = buf.get_mut(..len).ok_or(ChainError::TooLarge(cap))?;
    gather(mem, regions, segs, mode.hdr_len, out)?;
    let csum = single(&h, out, mode, stats, true)?;
    Ok(Staged::Buf(TxFrame { off: 0, len, csum }))
}

/// A chain popped in the current pass: its head, its segments in the scratch list and its byte
/// count (0: invalid, already counted; it is only returned to the guest).
#[derive(Debug, Clone, Copy)]
struct Popped {
    head: u16,
    start: usize,
    end: usize,
    total: usize,
}

/// TX state of one queue pair (reusable buffers; no allocation once warmed up).
#[derive(Debug, Default)]
pub struct TxState {
    batch: Batch,
    scratch: Scratch,
    popped: Vec<Popped>,
    frames: Vec<TxFrame>,
}

fn flush(port: &mut dyn Port, batch: &mut Batch, stats: &Stats) {
    if batch.is_empty() {
        return;
    }
    let sent = match port.send(batch) {
        Ok(n) => n.min(batch.len()),
        Err(e) => {
            log::warn!("{}: send failed: {e}", port.describe());
            0
        }
    };
    let bytes: usize = batch.iter().take(sent).map(<[u8]>::len).sum();
    Stats::add(&stats.tx_frames, sent as u64);
    Stats::add(&stats.tx_bytes, bytes as u64);
    stats.tx_drop((batch.len() - sent) as u64, 0);
    batch.clear();
}

/// Send the frames written into the current loan and end it; `full` / `large` frames were
/// dropped besides (no buffer, larger than the port's buffers).
fn commit(port: &mut dyn Port, frames: &mut Vec<TxFrame>, full: usize, large: usize, stats: &Stats) {
    // Commit even an empty list: it ends the loan.
    let offloaded = port.csum_offloaded();
    let sent = match port.tx_commit(frames) {
        Ok(n) => n.min(frames.len()),
        Err(e) => {
            log::warn!("{}: send failed: {e}", port.describe());
            0
        }
    };
    let bytes: usize = frames[..sent].iter().map(|f| f.len).sum();
    Stats::add(&stats.tx_csum_kernel, port.csum_offloaded().wrapping_sub(offloaded));
    Stats::add(&stats.tx_frames, sent as u64);
    Stats::add(&stats.tx_bytes, bytes as u64);
    stats.tx_drop((frames.len() - sent + full) as u64, large as u64);
    frames.clear();
}

/// A free lent buffer for the next frame: when the loan is used up, send it and take a new
/// one (the port sends synchronously, so a segmented chain's frames find room). False when
/// the port has no buffer left.
fn slot(port: &mut dyn Port, frames: &mut Vec<TxFrame>, lent: &mut usize, stats: &Stats) -> bool {
    if frames.len() < *lent {
        return true;
    }
    commit(port, frames, 0, 0, stats);
    *lent = port.tx_reserve(BATCH);
    *lent > 0
}

/// Send a validated GSO chain (its frame in `big`) whole, as ONE GSO packet the kernel
/// segments, when the port has a GSO socket: the frames of the current loan leave first (same
/// order as the guest's), then the packet, with the header rebuilt from the plan (never the
/// guest's). False: the caller cuts the chain itself (no GSO socket, a single segment, or the
/// kernel refused it: counted as `tx_gso_fallback`).
fn kernel_gso(
    port: &mut dyn Port,
    frames: &mut Vec<TxFrame>,
    lent: &mut usize,
    big: &mut [u8],
    g: &Gso,
    stats: &Stats,
) -> bool {
    if !port.gso_capable() {
        return false;
    }
    let Some(hdr) = g.kernel_hdr(big) else { return false };
    commit(port, frames, 0, 0, stats);
    *lent = 0;
    match port.send_gso(&hdr, big) {
        Ok(()) => {
            Stats::add(&stats.tx_gso_kernel, 1);
            Stats::add(&stats.tx_frames, 1);
            Stats::add(&stats.tx_bytes, big.len() as u64);
            true
        }
        Err(e) => {
            log::debug!("{}: gso send: {e}; cut here", port.describe());
            Stats::add(&stats.tx_gso_fallback, 1);
            false
        }
    }
}

/// Send the valid popped chains: into buffers the port lends, or through a [`Batch`]. A GSO
/// chain goes whole to a port that can send it so ([`kernel_gso`]) when buffers are lent; the
/// batch path (a port without free buffers) always cuts it.
fn send_popped<M: GuestMemory>(
    mem: &M,
    mut regions: Option<&mut Regions<'_, RegionOf<M>>>,
    bufs: &[Option<Slice<'_, RegionOf<M>>>],
    port: &mut dyn Port,
    st: &mut TxState,
    mode: NetMode,
    stats: &Stats,
) {
    let valid = st.popped.iter().filter(|p| p.total > 0).count();
    if valid == 0 {
        return;
    }
    let mut lent = port.tx_reserve(valid);
    if lent == 0 {
        for p in st.popped.iter().filter(|p| p.total > 0) {
            let segs = &st.scratch.segs[p.start..p.end];
            let big = &mut st.scratch.big;
            if let Err(e) = to_batch(mem, regions.as_deref_mut(), mode, segs, p.total, big, &mut st.batch, stats) {
                stats.error(&e);
            }
        }
        flush(port, &mut st.batch, stats);
        return;
    }
    st.frames.clear();
    let (mut full, mut large) = (0usize, 0usize);
    for (i, p) in st.popped.iter().enumerate().filter(|(_, p)| p.total > 0) {
        if !slot(port, &mut st.frames, &mut lent, stats) {
            full += 1;
            continue;
        }
        let segs = &st.scratch.segs[p.start..p.end];
        let one = bufs.get(i).and_then(Option::as_ref);
        let (k, big) = (st.frames.len(), &mut st.scratch.big);
        match to_buf(mem, regions.as_deref_mut(), one, mode, segs, p.total, port.tx_buf(k), big, stats) {
            Ok(Staged::Buf(f)) => st.frames.push(f),
            Ok(Staged::Gso(g)) => {
                if kernel_gso(port, &mut st.frames, &mut lent, big, &g, stats) {
                    continue;
                }
                for s in 0..g.segs {
                    if !slot(port, &mut st.frames, &mut lent, stats) {
                        full += g.segs - s;
                        break;
                    }
                    match write_segment_partial(big, &g, s, port.tx_buf(st.frames.len())) {
                        Some((n, csum)) => st.frames.push(TxFrame { off: 0, len: n, csum: Some(csum) }),
                        None => large += 1,
                    }
                }
            }
            // Valid, but larger than the port's frames: the port refuses it.
            Err(ChainError::TooLarge(_)) if p.total - mode.hdr_len <= mode.max_frame => large += 1,
            Err(e) => stats.error(&e),
        }
    }
    commit(port, &mut st.frames, full, large, stats);
}

/// Add every popped chain to the used ring (length 0: TX buffers are only read) and publish
/// the used index once.
fn add_used_batch<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    fast: &mut FastRing<'_, M>,
    popped: &[Popped],
    stats: &Stats,
) {
    if let Some(r) = fast {
        let (before, size) = (q.next_used(), q.size());
        // A head outside the table yields an empty chain, already counted as an error; there
        // is no descriptor to give back.
        for p in popped.iter().filter(|p| p.head < size) {
            if let Err(e) = r.push_used(q, p.head, 0) {
                stats.error(&vm_memory::GuestMemoryError::from(e));
            }
        }
        super::ring::publish_used(q, fast, before, stats);
        return;
    }
    let (size, ring) = (q.size(), GuestAddress(q.used_ring()));
    let mut next = q.next_used();
    for p in popped {
        if p.head >= size {
            // A head outside the table yields an empty chain, already counted as an error;
            // there is no descriptor to give back.
            continue;
        }
        // virtq_used_elem { le32 id; le32 len = 0 } after the 4-byte used ring header.
        let at = ring.checked_add(4 + 8 * u64::from(next % size));
        match at.map(|a| mem.write_obj(u64::from(p.head).to_le(), a)) {
            Some(Ok(())) => next = next.wrapping_add(1),
            Some(Err(e)) => {
                stats.error(&e);
                break;
            }
            None => {
                stats.error(&ChainError::BadAddress(ring.0, 8));
                break;
            }
        }
    }
    if next == q.next_used() {
        return;
    }
    // Release: the elements are visible before the index that hands them to the driver.
    let published = ring.checked_add(2).map(|a| mem.store(next.to_le(), a, Ordering::Release));
    match published {
        Some(Ok(())) => q.set_next_used(next),
        Some(Err(e)) => stats.error(&e),
        None => stats.error(&ChainError::BadAddress(ring.0, 2)),
    }
}

/// One pass: pop up to `want` chains, send their frames, return them. Returns chains handled.
#[allow(clippy::too_many_arguments)]
fn tx_pass<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    port: &mut dyn Port,
    st: &mut TxState,
    mode: NetMode,
    stats: &Stats,
    want: usize,
) -> usize {
    st.popped.clear();
    st.scratch.segs.clear();
    let limit = mode.hdr_len + mode.max_tx_frame();
    // The buffers of plain chains, by position in `st.popped`.
    let mut bufs: [Option<Slice<'_, RegionOf<M>>>; BATCH] = std::array::from_fn(|_| None);
    while st.popped.len() < want.min(BATCH) {
        let start = st.scratch.segs.len();
        let (head, res) = match ring.as_mut().map_or(Next::Checked, |r| r.next(q, false)) {
            Next::Simple { head, addr, buf } => {
                q.set_next_avail(q.next_avail().wrapping_add(1));
                let len = buf.len();
                if len > limit {
                    (head, Err(ChainError::TooLarge(limit)))
                } else {
                    st.scratch.segs.push((addr, len));
                    bufs[st.popped.len()] = Some(buf);
                    (head, Ok(len))
                }
            }
            Next::Checked => {
                // virtio-queue's checked walk (and its avail index checks) for everything else.
                let Some(chain) = pop_chain(q, mem, stats) else { break };
                (chain.head_index(), collect(chain, mem, false, limit, &mut st.scratch.segs))
            }
        };
        let total = match res {
            Ok(t) if t >= mode.hdr_len + ETH_HLEN => t,
            res => {
                let e = res.map_or_else(|e| e, ChainError::TooShort);
                stats.error(&e);
                st.scratch.segs.truncate(start);
                0
            }
        };
        st.popped.push(Popped { head, start, end: st.scratch.segs.len(), total });
    }
    if st.popped.is_empty() {
        return 0;
    }
    send_popped(mem, ring.as_mut().map(|r| &mut r.regions), &bufs, port, st, mode, stats);
    add_used_batch(q, mem, ring, &st.popped, stats);
    st.popped.len()
}

/// Move frames from the TX queue to `port` in batches until the queue is empty or `budget`;
/// guest kicks are re-enabled when it runs empty (chains that raced with that are handled).
pub fn tx_queue<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    port: &mut dyn Port,
    st: &mut TxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> QueueRun {
    tx_run(q, mem, port, st, mode, stats, budget, true)
}

/// [`tx_queue`] for a polling caller: guest kicks stay disabled when the queue runs empty. The
/// caller must call [`arm_tx`] before it stops polling.
pub fn tx_poll<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    port: &mut dyn Port,
    st: &mut TxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> QueueRun {
    tx_run(q, mem, port, st, mode, stats, budget, false)
}

/// Re-enable guest TX kicks (EVENT_IDX `avail_event` at the next chain, else clear
/// `VRING_USED_F_NO_NOTIFY`), then look at the available index once more: true when chains
/// arrived before the driver could see the change (poll again instead of sleeping; the driver
/// kicks for anything published after it).
pub fn arm_tx<M: GuestMemory>(q: &mut Queue, mem: &M, stats: &Stats) -> bool {
    q.enable_notification(mem).unwrap_or_else(|e| {
        stats.error(&e);
        false
    })
}

#[allow(clippy::too_many_arguments)]
fn tx_run<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    port: &mut dyn Port,
    st: &mut TxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
    rearm: bool,
) -> QueueRun {
    let mut run = QueueRun::default();
    let mut ring = super::ring::ring(q, mem);
    loop {
        if let Err(e) = q.disable_notification(mem) {
            stats.error(&e);
        }
        let before = run.handled;
        loop {
            let want = BATCH.min(budget.saturating_sub(run.handled));
            if want == 0 {
                run.more = true;
                return run;
            }
            let n = tx_pass(q, mem, &mut ring, port, st, mode, stats, want);
            if n == 0 {
                break;
            }
            run.used = true;
            run.handled += n;
        }
        if !rearm {
            return run;
        }
        match q.enable_notification(mem) {
            // More chains arrived: go again, unless this pass found none (corrupt ring).
            Ok(true) if run.handled > before => continue,
            Ok(_) => return run,
            Err(e) => {
                stats.error(&e);
                return run;
            }
        }
    }
}

/// Most TX chains returned to a guest without the notification it asked for: with this many
/// unconsumed, the notification goes at once (a guest that only frees its buffers on it must not
/// run out of them).
pub const TX_NOTIFY_MAX_FRAMES: u16 = 32;

/// A TX used-buffer notification the driver asked for and the backend held back (`--tx-notify-
/// delay-us`, `backend/notify.rs`): since when, and the used index it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxOwed {
    /// When the first notification of this episode was held back.
    pub since: std::time::Instant,
    /// The used index when it was held back (the run's old index: what the guest had been told).
    pub first: u16,
    /// The used index it covers now (the latest run's new index).
    pub used: u16,
}

/// Decide a TX queue run's notification under moderation: `asked` (the driver's `used_event`
/// fell in the run's range), `old`..`new` the run's used indexes. Returns true when the
/// notification goes now; else it is held in `owed` (a new episode when `asked`: the guest moved
/// `used_event` past every entry held before, so it has consumed them) until the guest shows it
/// no longer needs it ([`tx_consumed`]) or its delay runs out. A held episode that reaches
/// [`TX_NOTIFY_MAX_FRAMES`] unconsumed entries goes at once.
pub fn moderate_tx(owed: &mut Option<TxOwed>, asked: bool, old: u16, new: u16, now: std::time::Instant) -> bool {
    let o = if asked {
        owed.insert(TxOwed { since: now, first: old, used: new })
    } else if let Some(o) = owed.as_mut() {
        o.used = new;
        o
    } else {
        return false;
    };
    let full = o.used.wrapping_sub(o.first) >= TX_NOTIFY_MAX_FRAMES;
    if full {
        *owed = None;
    }
    full
}

/// Where the driver writes `used_event` (EVENT_IDX): after the avail ring's flags, idx and
/// `size` entries. None when that overflows the address space.
fn used_event_at(q: &Queue) -> Option<GuestAddress> {
    GuestAddress(q.avail_ring()).checked_add(4 + 2 * u64::from(q.size()))
}

/// Whether the driver has consumed the used entries up to `used` (a held notification is then
/// moot): with EVENT_IDX it moved `used_event` to `used` or past it (a Linux guest cleans its TX
/// ring when it polls the pair's RX queue and re-arms `used_event` at its new position), at most
/// a ring ahead (`used_event` 0, which Linux writes while it disables callbacks, is not taken
/// for consumption unless it lies in that window). Unreadable: not consumed.
pub fn tx_consumed<M: GuestMemory>(q: &Queue, mem: &M, used: u16) -> bool {
    if !q.event_idx_enabled() {
        return false;
    }
    let Some(at) = used_event_at(q) else {
        return false;
    };
    fence(Ordering::SeqCst);
    match mem.load::<u16>(at, Ordering::Relaxed).map(u16::from_le) {
        Ok(used_event) => used_event.wrapping_sub(used) <= q.size(),
        Err(_) => false,
    }
}

/// Whether the driver wants a used-buffer notification now that the used index moved from
/// `old` to `q.next_used()`: with EVENT_IDX when `used_event` lies in `[old, new)`, else unless
/// the driver set `VRING_AVAIL_F_NO_INTERRUPT`. Unreadable fields count as an error and signal.
pub fn needs_signal<M: GuestMemory>(q: &Queue, mem: &M, old: u16, stats: &Stats) -> bool {
    let new = q.next_used();
    if new == old {
        return false;
    }
    // The used index must be visible before the driver's suppression fields are read (pairs with
    // the driver's barrier between writing them and reading the used index).
    fence(Ordering::SeqCst);
    let avail = GuestAddress(q.avail_ring());
    let (at, event_idx) = if q.event_idx_enabled() { (used_event_at(q), true) } else { (Some(avail), false) };
    let Some(at) = at else {
        stats.error(&ChainError::BadAddress(avail.0, 2));
        return true;
    };
    match mem.load::<u16>(at, Ordering::Relaxed).map(u16::from_le) {
        Ok(used_event) if event_idx => new.wrapping_sub(used_event).wrapping_sub(1) < new.wrapping_sub(old),
        Ok(flags) => flags & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0,
        Err(e) => {
            stats.error(&e);
            true
        }
    }
}
