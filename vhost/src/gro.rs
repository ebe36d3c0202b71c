//! Wire -> guest coalescing (`VIRTIO_NET_F_GUEST_TSO4` / `GUEST_TSO6`): consecutive TCP frames
//! of one flow taken from the port in one batch become one large segment with a
//! `virtio_net_hdr` of gso_type TCPV4 / TCPV6, so the guest's stack handles one packet instead
//! of dozens (what Linux GRO does for a tap device's traffic).
//!
//! Only frames that re-segment into exactly themselves are merged: TCP over IPv4 without
//! options or fragments, or IPv6 without extension headers, no Ethernet padding, a verified
//! TCP checksum, flags ACK (PSH only on the last frame), a payload. Frames merge into an open
//! segment when every header byte is the same (addresses, ports, ack, window, TCP options, TTL,
//! TOS, flow label) except the lengths and checksums, the sequence number (and an IPv4
//! id) continues the segment, and the payload is not larger than the first frame's (a smaller one is the
//! last). At most [`MAX_FLOWS`] segments are open at once; nothing is held past the batch.

use super::{
    be16, csum_add, csum_fold, l3_len, l3_of, rx_csum_ok, Offloads, TxHdr, F_NEEDS_CSUM, IPPROTO_TCP, TCP_PSH,
};
use virtio_bindings::virtio_net::{VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6};

/// Segments open at once (flows interleaved in one batch).
pub const MAX_FLOWS: usize = 8;
/// Largest IP packet a segment may become (the IP length fields are 16 bits).
pub const MAX_IP: usize = 65_535;
const TCP_ACK: u8 = 0x10;

/// Coalescing counters (added to the queue's stats by the caller).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GroStats {
    /// Segments of two or more frames handed to the guest.
    pub segments: u64,
    /// Frames merged into those segments.
    pub merged: u64,
    /// Segments closed by the end of the batch.
    pub flush_batch: u64,
    /// Closed because a frame of the flow could not join (sequence gap, header change, other
    /// flags, larger payload, unverified checksum).
    pub flush_rule: u64,
    /// Closed because the next frame would pass the size limit.
    pub flush_size: u64,
    /// Closed by their own last frame (PSH, or a payload shorter than the MSS).
    pub flush_last: u64,
    /// Closed to make room for another flow ([`MAX_FLOWS`]).
    pub flush_evict: u64,
}

/// What one batch becomes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// Frame `i` of the batch, unchanged.
    Pass(usize),
    /// Frames `idx` (in order) merged into `frame`, to be delivered with header `hdr`.
    Segment {
        /// The merged frames' indices.
        idx: Vec<usize>,
        /// The virtio header (NEEDS_CSUM, TCPV4 / TCPV6, gso_size = the first frame's payload).
        hdr: TxHdr,
        /// Headers of the first frame (lengths, checksums fixed) and every payload.
        frame: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Tcp {
    v4: bool,
    l3: usize,
    l4: usize,
    hdrs: usize,
    payload: usize,
    seq: u32,
    psh: bool,
}

/// A TCP frame that may be merged, or None.
fn parse(f: &[u8]) -> Option<Tcp> {
    let v4 = super::frame_is_v4(f);
    let (l3, proto) = l3_of(f, v4).ok()?;
    let ihl = l3_len(f, l3, v4).ok()?;
    if proto != IPPROTO_TCP || (v4 && ihl != 20) {
        return None;
    }
    let ip_len = if v4 { usize::from(be16(f, l3 + 2)?) } else { usize::from(be16(f, l3 + 4)?) + 40 };
    let l4 = l3 + ihl;
    let doff = usize::from(f.get(l4 + 12)? >> 4) * 4;
    let hdrs = l4 + doff;
    let flags = *f.get(l4 + 13)?;
    if l3 + ip_len != f.len()
        || doff < 20
        || hdrs >= f.len()
        || flags & !(TCP_ACK | TCP_PSH) != 0
        || flags & TCP_ACK == 0
    {
        return None;
    }
    // Both checksums verified: the IPv4 header's (the merged header gets a new one) and TCP's.
    if (v4 && csum_fold(csum_add(0, &f[l3..l4])) != 0xffff) || !rx_csum_ok(f) {
        return None;
    }
    let seq = u32::from_be_bytes([f[l4 + 4], f[l4 + 5], f[l4 + 6], f[l4 + 7]]);
    Some(Tcp { v4, l3, l4, hdrs, payload: f.len() - hdrs, seq, psh: flags & TCP_PSH != 0 })
}

/// Whether byte `i` of the headers may differ between frames of one segment.
fn varies(t: &Tcp, i: usize) -> bool {
    let (l3, l4) = (t.l3, t.l4);
    let ip = if t.v4 {
        (l3 + 2..l3 + 6).contains(&i) || (l3 + 10..l3 + 12).contains(&i)
    } else {
        (l3 + 4..l3 + 6).contains(&i)
    };
    ip || (l4 + 4..l4 + 8).contains(&i) || i == l4 + 13 || (l4 + 16..l4 + 18).contains(&i)
}

/// Same flow: Ethernet header, addresses and ports.
fn same_flow(a: &[u8], t: &Tcp, b: &[u8]) -> bool {
    let addrs = if t.v4 { t.l3 + 12..t.l3 + 20 } else { t.l3 + 8..t.l3 + 40 };
    b.len() >= t.l4 + 4
        && a[..t.l3] == b[..t.l3]
        && a[addrs.clone()] == b[addrs]
        && a[t.l4..t.l4 + 4] == b[t.l4..t.l4 + 4]
}

struct Open {
    t: Tcp,
    idx: Vec<usize>,
    next_seq: u32,
    len: usize,
}

/// Coalesce one batch of frames into `out` (cleared first). `limit` bounds a segment's length
/// (without virtio header): what the guest's buffers take. Only the families whose
/// `guest_tso4` / `guest_tso6` is in `off` are merged. Frames that do not merge come out as
/// [`Out::Pass`]; every frame appears exactly once, and the frames of one flow stay in order.
pub fn coalesce(frames: &[&[u8]], limit: usize, off: Offloads, out: &mut Vec<Out>, st: &mut GroStats) {
    out.clear();
    let mut open: Vec<Open> = Vec::with_capacity(MAX_FLOWS);
    for (i, f) in frames.iter().enumerate() {
        let t = parse(f).filter(|t| if t.v4 { off.guest_tso4 } else { off.guest_tso6 });
        // An open segment of this frame's flow, if any (also for frames that cannot merge,
        // so that they do not overtake their flow's earlier frames).
        let at = open.iter().position(|o| same_flow(frames[o.idx[0]], &o.t, f));
        if let Some(k) = at {
            let o = &open[k];
            let first = frames[o.idx[0]];
            let joins = t.filter(|t| {
                t.hdrs == o.t.hdrs
                    && t.v4 == o.t.v4
                    && t.seq == o.next_seq
                    && t.payload <= o.t.payload
                    && (!t.v4
                        || be16(f, t.l3 + 4) == be16(first, t.l3 + 4).map(|id| id.wrapping_add(o.idx.len() as u16)))
                    && (0..t.hdrs).all(|b| varies(t, b) || first[b] == f[b])
            });
            match joins {
                Some(t) if o.len + t.payload <= limit && o.len + t.payload - t.l3 <= MAX_IP => {
                    let o = &mut open[k];
                    o.idx.push(i);
                    o.len += t.payload;
                    o.next_seq = t.seq.wrapping_add(t.payload as u32);
                    if t.psh || t.payload < o.t.payload {
                        st.flush_last += 1;
                        flush(frames, open.remove(k), out, st);
                    }
                    continue;
                }
                Some(_) => st.flush_size += 1,
                None => st.flush_rule += 1,
            }
            flush(frames, open.remove(k), out, st);
        }
        let Some(t) = t.filter(|t| !t.psh && t.hdrs + t.payload <= limit) else {
            out.push(Out::Pass(i));
            continue;
        };
        if open.len() == MAX_FLOWS {
            st.flush_evict += 1;
            flush(frames, open.remove(0), out, st);
        }
        open.push(Open { t, idx: vec![i], next_seq: t.seq.wrapping_add(t.payload as u32), len: f.len() });
    }
    for o in open {
        st.flush_batch += 1;
        flush(frames, o, out, st);
    }
}

fn flush(frames: &[&[u8]], o: Open, out: &mut Vec<Out>, st: &mut GroStats) {
    if o.idx.len() == 1 {
        out.push(Out::Pass(o.idx[0]));
        return;
    }
    let t = o.t;
    let mut m = Vec::with_capacity(o.len);
    m.extend_from_slice(frames[o.idx[0]]);
    for &i in &o.idx[1..] {
        m.extend_from_slice(&frames[i][t.hdrs..]);
    }
    let last = frames[*o.idx.last().unwrap_or(&o.idx[0])];
    m[t.l4 + 13] = last[t.l4 + 13];
    let put = |m: &mut [u8], at: usize, v: u16| m[at..at + 2].copy_from_slice(&v.to_be_bytes());
    let (l3, l4) = (t.l3, t.l4);
    if t.v4 {
        put(&mut m, l3 + 2, (o.len - l3) as u16);
        put(&mut m, l3 + 10, 0);
        let c = !csum_fold(csum_add(0, &m[l3..l4]));
        put(&mut m, l3 + 10, c);
    } else {
        put(&mut m, l3 + 4, (o.len - l3 - 40) as u16);
    }
    // NEEDS_CSUM: the checksum field holds the pseudo-header sum, as a sender's stack leaves it.
    let addrs = if t.v4 { &m[l3 + 12..l3 + 20] } else { &m[l3 + 8..l3 + 40] };
    let pseudo = csum_fold(csum_add(0, addrs) + (o.len - l4) as u64 + u64::from(IPPROTO_TCP));
    put(&mut m, l4 + 16, pseudo);
    let gso_type = if t.v4 { VIRTIO_NET_HDR_GSO_TCPV4 } else { VIRTIO_NET_HDR_GSO_TCPV6 } as u8;
    let hdr = TxHdr {
        flags: F_NEEDS_CSUM,
        gso_type,
        hdr_len: t.hdrs as u16,
        gso_size: t.payload as u16,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    st.segments += 1;
    st.merged += o.idx.len() as u64;
    out.push(Out::Segment { idx: o.idx, hdr, frame: m });
}

#[cfg(test)]
#[path = "gro_tests.rs"]
pub(crate) mod tests;
