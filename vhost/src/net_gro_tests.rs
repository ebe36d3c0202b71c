//! Wire -> guest coalescing (GUEST_TSO) through the real RX queue code (`rx_queue` with
//! `MockSplitQueue`): a batch of one flow's frames reaches the guest as one packet with a GSO
//! header across mergeable buffers, and cuts back into exactly those frames.

use super::*;
use crate::offload::gro::tests::{resegment, wire};
use crate::offload::{TxHdr, F_NEEDS_CSUM};

const TSO: NetMode = NetMode { offloads: Offloads::ALL, ..MODE };
/// The RX chains' size (one 2 KiB buffer each, like a Linux guest's mergeable buffers).
const CHAIN: u32 = 2048;

/// A packet the guest read: (virtio header, frame).
type Packet = (Vec<u8>, Vec<u8>);

fn addr(id: u32) -> u64 {
    BUF_BASE + 0x1000 * u64::from(id)
}

/// Chains `first..first + n` of one buffer each.
fn post_rx(vq: &MockSplitQueue<GuestMemoryMmap>, first: u16, n: u16, size: u32) {
    let chains: Vec<_> = (first..first + n).map(|i| vec![(addr(u32::from(i)), size, true)]).collect();
    add_chains(vq, first, &chains);
}

/// The packets the guest received from used entry `from` on: (virtio header, frame), each
/// gathered from its `num_buffers` used entries.
fn guest_packets(m: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>, hl: usize) -> Vec<Packet> {
    let (mut out, mut u) = (Vec::new(), 0);
    while u < usize::from(used_idx(vq)) {
        let (id, len) = used(vq, u);
        let first = read_guest(m, addr(id), len as usize);
        let nb = usize::from(u16::from_le_bytes([first[10], first[11]]));
        assert!(nb >= 1, "num_buffers 0 at used {u}");
        let mut bytes = first[hl..].to_vec();
        for k in 1..nb {
            let (id, len) = used(vq, u + k);
            bytes.extend(read_guest(m, addr(id), len as usize));
        }
        out.push((first[..hl].to_vec(), bytes));
        u += nb;
    }
    out
}

fn port_of(frames: &[Vec<u8>]) -> TestPort {
    let mut p = TestPort::new();
    p.incoming.extend(frames.iter().cloned());
    p
}

/// Deliver `frames` (from a port that copies, or one that lends its frames with hash 7)
/// into a ring of `chains` chains of `size` bytes; returns the guest's packets.
fn deliver(frames: &[Vec<u8>], lend: bool, mode: NetMode, chains: u16, size: u32) -> (Vec<Packet>, StatsSnapshot) {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    post_rx(&vq, 0, chains, size);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    if lend {
        let mut port = LendingPort { frames: frames.iter().map(|f| (f.clone(), 7)).collect(), offered: 0 };
        rx_queue(&mut q, &m, &mut port, &mut st, mode, &stats, 64);
    } else {
        rx_queue(&mut q, &m, &mut port_of(frames), &mut st, mode, &stats, 64);
    }
    assert_eq!(st.backlog(), 0);
    (guest_packets(&m, &vq, mode.hdr_len), stats.snapshot())
}

/// Headers (Ethernet + IP + TCP) of `wire`'s frames.
fn hdrs(v4: bool) -> usize {
    if v4 {
        66
    } else {
        86
    }
}

#[test]
fn rx_one_flow_reaches_the_guest_as_one_gso_packet() {
    for v4 in [true, false] {
        for lend in [false, true] {
            let frames = wire(v4, 20 * 1448 + 100, 1448, 40000, 0xffff_f000);
            assert_eq!(frames.len(), 21);
            let mode = if lend { TSO.with_hash_report(true) } else { TSO };
            let (pk, s) = deliver(&frames, lend, mode, 64, CHAIN);
            assert_eq!(pk.len(), 1, "v4 {v4} lend {lend}: one guest packet");
            let (vh, f) = &pk[0];
            let h = TxHdr::parse(vh);
            let (l4, hl) = (if v4 { 34 } else { 54 }, hdrs(v4));
            let want = TxHdr {
                flags: F_NEEDS_CSUM,
                gso_type: if v4 { 1 } else { 4 },
                hdr_len: hl as u16,
                gso_size: 1448,
                csum_start: l4 as u16,
                csum_offset: 16,
            };
            assert_eq!(h, want, "v4 {v4} lend {lend}");
            let nb = (mode.hdr_len + f.len()).div_ceil(CHAIN as usize);
            assert_eq!(usize::from(u16::from_le_bytes([vh[10], vh[11]])), nb, "num_buffers");
            assert!(nb > 1, "the packet spans several buffers");
            if lend {
                assert_eq!(&vh[12..16], &7u32.to_le_bytes(), "the flow's hash is reported");
            }
            // The IP length covers the whole segment; the payload is every frame's, in order.
            let ip_len = if v4 { be(f, 16) + 14 } else { be(f, 18) + 54 };
            assert_eq!(ip_len, f.len());
            let payload: Vec<u8> = frames.iter().flat_map(|x| x[hl..].to_vec()).collect();
            assert_eq!(&f[hl..], &payload[..]);
            assert!(resegment(&h, f) == frames, "v4 {v4} lend {lend}: re-cut differs from the wire frames");
            let wire_bytes: usize = frames.iter().map(Vec::len).sum();
            let got = (s.rx_gro_segments, s.rx_gro_merged, s.rx_gro_split, s.rx_frames, s.rx_bytes);
            assert_eq!(got, (1, 21, 0, 21, wire_bytes as u64), "v4 {v4} lend {lend}");
            assert_eq!((s.rx_dropped, s.errors), (0, 0));
        }
    }
}

fn be(f: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([f[at], f[at + 1]]))
}

#[test]
fn rx_interleaved_flows_stay_separate_and_in_order() {
    let a = wire(true, 6 * 1448, 1448, 40000, 1000);
    let b = wire(true, 6 * 1448, 1448, 40001, 90_000);
    let c = wire(false, 6 * 1448, 1448, 40000, 5);
    let mut frames = Vec::new();
    for i in 0..6 {
        frames.extend([a[i].clone(), b[i].clone(), c[i].clone()]);
    }
    let (pk, s) = deliver(&frames, false, TSO, 128, CHAIN);
    assert_eq!(pk.len(), 3);
    for ((vh, f), want) in pk.iter().zip([&a, &b, &c]) {
        assert!(resegment(&TxHdr::parse(vh), f) == *want, "a flow's segment is its own frames, in order");
    }
    assert_eq!((s.rx_gro_segments, s.rx_gro_merged, s.rx_frames), (3, 18, 18));
}

#[test]
fn rx_a_frame_with_a_bad_checksum_is_never_merged() {
    for v4 in [true, false] {
        let mut frames = wire(v4, 10 * 1448, 1448, 40000, 77);
        let last = frames[4].len() - 1;
        frames[4][last] ^= 1;
        let (pk, s) = deliver(&frames, false, TSO, 64, CHAIN);
        assert_eq!(pk.len(), 3, "v4 {v4}: segment, the bad frame alone, segment");
        assert!(resegment(&TxHdr::parse(&pk[0].0), &pk[0].1) == frames[..4]);
        assert_eq!(pk[1].1, frames[4], "the bad frame arrives unchanged");
        assert_eq!(&pk[1].0[..10], &[0; 10], "neither DATA_VALID nor GSO");
        assert!(resegment(&TxHdr::parse(&pk[2].0), &pk[2].1) == frames[5..]);
        assert_eq!((s.rx_gro_segments, s.rx_gro_merged, s.rx_csum_valid), (2, 9, 0));
    }
}

#[test]
fn rx_without_guest_tso_nothing_is_merged() {
    let csum = NetMode { offloads: Offloads { guest_csum: true, ..Offloads::NONE }, ..MODE };
    let v4_only = NetMode { offloads: Offloads { guest_tso6: false, ..Offloads::ALL }, ..MODE };
    // GUEST_TSO acked without GUEST_CSUM (a driver breaking the spec): no coalescing either.
    let no_csum = NetMode { offloads: Offloads { guest_csum: false, ..Offloads::ALL }, ..MODE };
    for (mode, v4, data_valid) in [(csum, true, 2u8), (csum, false, 2), (v4_only, false, 2), (no_csum, true, 0)] {
        let frames = wire(v4, 8 * 1448, 1448, 40000, 1);
        let (pk, s) = deliver(&frames, false, mode, 64, CHAIN);
        assert_eq!(pk.len(), 8, "{mode:?} v4 {v4}");
        for ((vh, f), want) in pk.iter().zip(&frames) {
            assert_eq!(f, want);
            assert_eq!((vh[0], vh[1]), (data_valid, 0), "{mode:?} v4 {v4}");
        }
        assert_eq!((s.rx_gro_segments, s.rx_gro_merged), (0, 0));
    }
}

/// Not enough buffers for a whole segment: with some buffers posted its frames are delivered
/// unmerged (counted in rx_gro_split), never part of a packet; with none it waits whole.
#[test]
fn rx_a_segment_the_buffers_cannot_take_is_delivered_unmerged() {
    let frames = wire(true, 20 * 1448 + 100, 1448, 40000, 3);
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mut port = port_of(&frames);
    // No buffer at all: the segment waits (nothing split, nothing dropped).
    rx_queue(&mut q, &m, &mut port, &mut st, TSO, &stats, 64);
    assert_eq!((st.backlog(), stats.snapshot().rx_gro_split), (21, 0));
    // Five buffers for a 30 KB segment: split, five frames go, the rest wait.
    post_rx(&vq, 0, 5, CHAIN);
    rx_queue(&mut q, &m, &mut port, &mut st, TSO, &stats, 64);
    assert_eq!(st.backlog(), 16);
    post_rx(&vq, 5, 16, CHAIN);
    rx_queue(&mut q, &m, &mut port, &mut st, TSO, &stats, 64);
    assert_eq!(st.backlog(), 0);
    let pk = guest_packets(&m, &vq, HDR_LEN);
    assert!(pk.iter().map(|p| &p.1).eq(frames.iter()), "every frame, alone and in order");
    assert!(pk.iter().all(|p| p.0[1] == 0), "no GSO header");
    let s = stats.snapshot();
    let got = (s.rx_gro_segments, s.rx_gro_split, s.rx_frames, s.rx_dropped, s.errors);
    assert_eq!(got, (0, 21, 21, 0, 0));

    // Without MRG_RXBUF a segment larger than a chain is split, not dropped.
    let single = NetMode { mergeable: false, ..TSO };
    let (pk, s) = deliver(&frames, false, single, 32, CHAIN);
    assert!(pk.iter().map(|p| &p.1).eq(frames.iter()));
    assert_eq!((s.rx_gro_split, s.rx_dropped, s.rx_frames), (21, 0, 21));
    // ... and with chains of 64 KiB it is one packet.
    let (pk, s) = deliver(&frames, false, single, 2, 0x1_0000);
    assert_eq!((pk.len(), s.rx_gro_segments, s.rx_gro_split), (1, 1, 0));
}

#[path = "net_krx_tests.rs"]
mod krx_rx;
