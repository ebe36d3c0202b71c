//! Wire -> guest through the kernel (`--rx-gso kernel`, `pkt_rx.rs`): whole packets with the
//! kernel's `virtio_net_hdr` in front, re-validated and matched to what the guest acked.
//!
//! The kernel is trusted to describe its own skb, but the header a guest sees is never the
//! kernel's as is: it is checked like a guest's TX header (`offload::plan`: csum_start inside the
//! frame and at the L4 checksum of a GSO packet, hdr_len inside the frame, gso_size non-zero, the
//! GSO type matching the frame) and rebuilt from that plan (`Gso::kernel_hdr`). Then, per packet:
//! - a TCP GSO packet to a guest that acked GUEST_CSUM and the family's GUEST_TSO goes whole
//!   (`NEEDS_CSUM`, the checksum field holding the pseudo-header sum, as tap hands it), across as
//!   many mergeable buffers as it needs; counted in [`Stats::rx_gso_kernel`];
//! - a TCP GSO packet larger than one IP packet (BIG TCP: the agent lets IPv4 packets of up to
//!   192 KiB cross the VM's device whole) goes to such a guest as consecutive GSO packets of at
//!   most 64 KiB (`Gso::write_chunk`; [`Stats::rx_gso_kernel_chunks`]);
//! - a GSO packet the posted mergeable buffers cannot take whole waits for the guest to add
//!   buffers (it is cut only when the ring is full of buffers and still too small);
//! - any other GSO packet (no such ack, UDP or ECN GSO, a ring of buffers too small for it, or
//!   no MRG_RXBUF and a chain too small) is cut here into MSS-sized frames with their checksums
//!   computed ([`Stats::rx_gso_kernel_cut`]);
//! - a `NEEDS_CSUM` frame keeps the request for a GUEST_CSUM guest, else its checksum is filled;
//! - a `DATA_VALID` frame (checked by a NIC or the stack) keeps the flag for a GUEST_CSUM guest;
//! - a header that does not pass the checks, or a frame above 64 KiB without GSO, drops the
//!   packet ([`Stats::rx_kernel_refused`]).
//!
//! Hash report: the kernel does not hand the Toeplitz hash, so for a HASH_REPORT guest the
//! backend computes it (`rss::hash`, the BPF code's rules) from the guest's key and types (the rx
//! queue itself follows its RSS table: the agent's fanout group delivers on the queue the
//! datapath chose).

use std::cell::Cell;
use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemory;

use super::{rx_frame_in, FastRing, NetMode, QueueRun, RxDrop, RxOutcome, RxState, Scratch, Stats, HDR_F_DATA_VALID};
use crate::offload::{self, Offloads, Plan, TxHdr, F_NEEDS_CSUM, MAX_GSO_FRAME};
use crate::port::Port;
use crate::rss::XskMeta;

const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;

/// What the kernel may hand: every offload the parser knows.
fn kernel_offloads() -> Offloads {
    Offloads { csum: true, tso4: true, tso6: true, ecn: true, uso: true, ..Offloads::default() }
}

/// Move packets from the port's packet socket into the RX queue; None when the port receives
/// through AF_XDP.
#[allow(clippy::too_many_arguments)]
pub(super) fn rx_kernel<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    port: &mut dyn Port,
    st: &mut RxState,
    mode: NetMode,
    stats: &Stats,
    budget: usize,
) -> Option<QueueRun> {
    let (stop, rearmed) = (Cell::new(false), Cell::new(false));
    let (scratch, cut, seg) = (&mut st.scratch, &mut st.cut, &mut st.kernel_seg);
    let mut deliver = |h: TxHdr, frame: &mut [u8]| -> bool {
        super::offer(q, mem, stats, &stop, &rearmed, |q, mem| {
            deliver_packet(q, mem, ring, h, frame, mode, scratch, cut, seg, stats)
        })
    };
    super::rx_budgeted(port, budget, &stop, |port, max| port.rx_kernel(max, &mut deliver))
}

/// Offer one packet from the kernel (header `h`) to the guest; [`RxOutcome::NoBuffers`] leaves
/// it (and, for a packet being cut, the segments not yet delivered: `seg` says where to resume)
/// for the next run.
#[allow(clippy::too_many_arguments)]
fn deliver_packet<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    h: TxHdr,
    frame: &mut [u8],
    mode: NetMode,
    s: &mut Scratch,
    cut: &mut Vec<u8>,
    seg: &mut usize,
    stats: &Stats,
) -> RxOutcome {
    let valid = h.flags & HDR_F_DATA_VALID != 0;
    let req = TxHdr { flags: h.flags & !HDR_F_DATA_VALID, ..h };
    let plan = match offload::plan_kernel(&req, frame, kernel_offloads()) {
        Ok(p) => p,
        Err(e) => {
            log::debug!("packet socket header refused: {e}");
            Stats::add(&stats.rx_kernel_refused, 1);
            stats.rx_drop(RxDrop::Refused);
            return RxOutcome::Dropped;
        }
    };
    let off = mode.offloads;
    if matches!(plan, Plan::Single { .. }) && frame.len() > MAX_GSO_FRAME {
        // Only a GSO packet may exceed one IP packet (BIG TCP); the kernel sends no such frame.
        Stats::add(&stats.rx_kernel_refused, 1);
        stats.rx_drop(RxDrop::Refused);
        return RxOutcome::Dropped;
    }
    // The guest's hash of the packet, for every frame it becomes (one flow).
    let meta = mode.rx_hash.and_then(|r| r.of(frame));
    match plan {
        Plan::Gso(g) => {
            let acked = off.guest_csum
                && match h.gso_type {
                    GSO_TCPV4 => off.guest_tso4,
                    GSO_TCPV6 => off.guest_tso6,
                    _ => false, // UDP (no GUEST_USO offered), ECN (no GUEST_ECN offered)
                };
            if acked && g.needs_chunks(frame.len()) {
                match chunks(q, mem, ring, frame, meta, &g, mode, s, cut, seg, stats) {
                    RxOutcome::Split => {} // the buffers cannot take a chunk whole: cut the rest
                    o => return o,
                }
            } else if acked && *seg == 0 {
                if let Some(kh) = g.kernel_hdr(frame) {
                    let kh = TxHdr::parse(&kh);
                    match rx_frame_in(q, mem, ring, frame, meta, Some(&kh), mode, s, stats) {
                        RxOutcome::Delivered => {
                            Stats::add(&stats.rx_gso_kernel, 1);
                            return RxOutcome::Delivered;
                        }
                        // Too few buffers posted right now: wait for the guest to add some,
                        // unless its ring is already full of them (then it never can).
                        RxOutcome::Split if mode.mergeable && !ring_full(q, mem) => return RxOutcome::NoBuffers,
                        RxOutcome::Split => {} // the buffers cannot take it whole: cut it
                        o => return o,
                    }
                }
            }
            cut.resize(g.seg_len(0, frame.len()), 0);
            while *seg < g.segs {
                let Some(n) = offload::write_segment(frame, &g, *seg, cut) else {
                    break; // cannot happen: the buffer holds the largest segment
                };
                if plain(q, mem, ring, &cut[..n], meta, true, mode, s, stats) == RxOutcome::NoBuffers {
                    return RxOutcome::NoBuffers;
                }
                *seg += 1;
            }
            *seg = 0;
            Stats::add(&stats.rx_gso_kernel_cut, 1);
            RxOutcome::Delivered
        }
        Plan::Single { csum: Some((start, offset)) } => {
            if off.guest_csum {
                let (csum_start, csum_offset) = (start as u16, offset as u16);
                let ch = TxHdr { flags: F_NEEDS_CSUM, csum_start, csum_offset, ..TxHdr::default() };
                match rx_frame_in(q, mem, ring, frame, meta, Some(&ch), mode, s, stats) {
                    RxOutcome::Split => {}
                    o => return o,
                }
            }
            offload::fill_csum(frame, start, offset);
            plain(q, mem, ring, frame, meta, true, mode, s, stats)
        }
        Plan::Single { csum: None } => plain(q, mem, ring, frame, meta, valid, mode, s, stats),
    }
}

/// Offer a packet larger than one IP packet (BIG TCP, up to 192 KiB) to a TSO guest as
/// consecutive GSO packets of at most 64 KiB, resuming at segment `seg`; waits for buffers as a
/// whole packet does, [`RxOutcome::Split`] (with `seg` at the first segment not yet delivered)
/// when the ring cannot take a chunk whole.
#[allow(clippy::too_many_arguments)]
fn chunks<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    frame: &[u8],
    meta: Option<XskMeta>,
    g: &offload::Gso,
    mode: NetMode,
    s: &mut Scratch,
    cut: &mut Vec<u8>,
    seg: &mut usize,
    stats: &Stats,
) -> RxOutcome {
    let k = g.chunk_segs();
    cut.resize(MAX_GSO_FRAME, 0);
    while *seg < g.segs {
        let Some((n, h)) = g.write_chunk(frame, *seg, k, cut) else {
            return RxOutcome::Split; // cannot happen: the plan and the buffer hold every chunk
        };
        match rx_frame_in(q, mem, ring, &cut[..n], meta, Some(&h), mode, s, stats) {
            RxOutcome::Delivered => {
                Stats::add(&stats.rx_gso_kernel_chunks, 1);
                *seg += k;
            }
            RxOutcome::Split if mode.mergeable && !ring_full(q, mem) => return RxOutcome::NoBuffers,
            o => return o,
        }
    }
    *seg = 0;
    Stats::add(&stats.rx_gso_kernel, 1);
    RxOutcome::Delivered
}

/// Every descriptor of the ring is posted: the guest cannot add buffers before we use some.
fn ring_full<M: GuestMemory>(q: &Queue, mem: &M) -> bool {
    q.avail_idx(mem, Ordering::Acquire).map_or(true, |a| (a - Wrapping(q.next_avail())).0 >= q.size())
}

/// Offer a frame without GSO; `valid`: its checksum is known good (marked `DATA_VALID` for a
/// GUEST_CSUM guest without checking it again).
#[allow(clippy::too_many_arguments)]
fn plain<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    frame: &[u8],
    meta: Option<XskMeta>,
    valid: bool,
    mode: NetMode,
    s: &mut Scratch,
    stats: &Stats,
) -> RxOutcome {
    if valid && mode.offloads.guest_csum {
        let vh = TxHdr { flags: HDR_F_DATA_VALID, ..TxHdr::default() };
        match rx_frame_in(q, mem, ring, frame, meta, Some(&vh), mode, s, stats) {
            RxOutcome::Split => {}
            o => return o,
        }
    }
    rx_frame_in(q, mem, ring, frame, meta, None, mode, s, stats)
}
