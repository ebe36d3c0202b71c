//! Wire -> guest through the kernel's packet socket (`net_krx.rs`) through the real RX queue code
//! (`rx_queue` with `MockSplitQueue`): a 64 KiB GSO packet reaches a TSO guest whole, a guest
//! without GUEST_TSO gets it cut into the wire frames, a lying header is dropped, and a cut that
//! runs out of buffers resumes where it stopped.

use super::*;
use crate::fuzzing::wire;
use crate::offload::gro::{coalesce, GroStats, Out};
use crate::offload::{self, Plan};

/// A port that hands whole packets behind a kernel header (like `XskPort` with `pkt_rx.rs`).
struct KernelPort {
    packets: VecDeque<(TxHdr, Vec<u8>)>,
    reads: usize, // rx_kernel calls
}

impl KernelPort {
    fn new(packets: VecDeque<(TxHdr, Vec<u8>)>) -> Self {
        KernelPort { packets, reads: 0 }
    }
}

impl Port for KernelPort {
    fn recv(&mut self, _batch: &mut Batch, _max: usize) -> io::Result<usize> {
        panic!("a kernel port is read with rx_kernel only")
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        Ok(batch.len())
    }
    fn rx_kernel(&mut self, max: usize, f: &mut dyn FnMut(TxHdr, &mut [u8]) -> bool) -> Option<io::Result<usize>> {
        self.reads += 1;
        let mut n = 0;
        while n < max {
            let Some((h, fr)) = self.packets.front_mut() else { break };
            if !f(*h, fr) {
                break;
            }
            self.packets.pop_front();
            n += 1;
        }
        Some(Ok(n))
    }
    fn fd(&self) -> RawFd {
        -1
    }
    fn describe(&self) -> String {
        "kernel port".into()
    }
}

/// One flow's wire frames and the GSO packet the kernel would hand for them (what a pod's TSO
/// send is before the host end cuts it): header NEEDS_CSUM + TCPV4/6, gso_size 1448.
fn gso_packet(v4: bool) -> (Vec<Vec<u8>>, TxHdr, Vec<u8>) {
    let frames = wire(v4, 44 * 1448 + 300, 1448, 40000, 0xffff_f000);
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut outs = Vec::new();
    coalesce(&refs, MAX_GSO_FRAME, Offloads::ALL, &mut outs, &mut GroStats::default());
    let [Out::Segment { hdr, frame, .. }] = &outs[..] else { panic!("one segment expected: {outs:?}") };
    (frames.clone(), *hdr, frame.clone())
}

fn run(port: &mut KernelPort, m: &GuestMemoryMmap, q: &mut Queue, st: &mut RxState, mode: NetMode, s: &Stats) {
    rx_queue(q, m, port, st, mode, s, 64);
}

/// Offer `packets` once to a fresh guest that posted `buffers` buffers of [`CHAIN`] bytes:
/// what it got, the counters, and how many packets stayed in the port.
fn deliver(packets: Vec<(TxHdr, Vec<u8>)>, mode: NetMode, buffers: u16) -> (Vec<Packet>, StatsSnapshot, usize) {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    post_rx(&vq, 0, buffers, CHAIN);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mut port = KernelPort::new(packets.into());
    run(&mut port, &m, &mut q, &mut st, mode, &stats);
    (guest_packets(&m, &vq, mode.hdr_len), stats.snapshot(), port.packets.len())
}

#[test]
fn rx_kernel_gso_packet_reaches_a_tso_guest_whole() {
    for v4 in [true, false] {
        let (frames, h, f) = gso_packet(v4);
        let (pk, s, _) = deliver(vec![(h, f.clone())], TSO, 64);
        assert_eq!(pk.len(), 1, "v4 {v4}: one guest packet");
        let gh = TxHdr::parse(&pk[0].0);
        assert_eq!(gh, h, "v4 {v4}: the header rebuilt from the validated plan");
        assert_eq!(pk[0].1, f, "v4 {v4}: the packet as the kernel gave it");
        assert!(resegment(&gh, &pk[0].1) == frames, "v4 {v4}: it cuts back into the wire frames");
        assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_cut, s.rx_kernel_refused, s.rx_frames), (1, 0, 0, 1));
        assert_eq!(s.rx_bytes, f.len() as u64);
    }
}

#[test]
fn rx_kernel_gso_packet_is_cut_for_a_guest_without_tso() {
    let no_tso = NetMode { offloads: Offloads { guest_tso4: false, guest_tso6: false, ..Offloads::ALL }, ..MODE };
    for (mode, flags) in [(MODE, 0u8), (no_tso, HDR_F_DATA_VALID)] {
        for v4 in [true, false] {
            let (frames, h, f) = gso_packet(v4);
            let m = mem();
            let vq = MockSplitQueue::new(&m, 256);
            post_rx(&vq, 0, 64, CHAIN);
            let mut q: Queue = vq.create_queue().unwrap();
            let (mut st, stats) = (RxState::default(), Stats::default());
            let mut port = KernelPort::new([(h, f)].into());
            run(&mut port, &m, &mut q, &mut st, mode, &stats);
            let pk = guest_packets(&m, &vq, mode.hdr_len);
            let got: Vec<Vec<u8>> = pk.iter().map(|p| p.1.clone()).collect();
            assert!(got == frames, "v4 {v4}: the wire frames, checksums computed");
            for (vh, _) in &pk {
                assert_eq!(vh[0], flags, "DATA_VALID only for a GUEST_CSUM guest");
                assert_eq!(vh[1], 0, "no GSO type");
            }
            let s = stats.snapshot();
            assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_cut, s.rx_frames), (0, 1, frames.len() as u64));
        }
    }
}

#[test]
fn rx_kernel_cut_resumes_after_the_guest_adds_buffers() {
    let (frames, h, f) = gso_packet(true);
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    post_rx(&vq, 0, 10, CHAIN);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mut port = KernelPort::new([(h, f)].into());
    run(&mut port, &m, &mut q, &mut st, MODE, &stats);
    assert_eq!(guest_packets(&m, &vq, MODE.hdr_len).len(), 10);
    assert_eq!(port.packets.len(), 1, "the packet waits for buffers");
    post_rx(&vq, 10, 60, CHAIN);
    run(&mut port, &m, &mut q, &mut st, MODE, &stats);
    let got: Vec<Vec<u8>> = guest_packets(&m, &vq, MODE.hdr_len).into_iter().map(|p| p.1).collect();
    assert!(got == frames, "every frame once, in order");
    assert!(port.packets.is_empty());
    assert_eq!(stats.snapshot().rx_gso_kernel_cut, 1);
}

#[test]
fn rx_kernel_a_tso_guest_with_too_few_buffers_gets_the_frames() {
    let (frames, h, f) = gso_packet(false);
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    post_rx(&vq, 0, 64, 1600); // no room for 64 KiB in 64 buffers of 1600 bytes... nearly
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    let no_mrg = NetMode { mergeable: false, ..TSO };
    let mut port = KernelPort::new([(h, f)].into());
    run(&mut port, &m, &mut q, &mut st, no_mrg, &stats);
    let got: Vec<Vec<u8>> = guest_packets(&m, &vq, no_mrg.hdr_len).into_iter().map(|p| p.1).collect();
    assert!(got == frames, "without MRG_RXBUF a chain cannot take 64 KiB: the frames instead");
    let s = stats.snapshot();
    assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_cut), (0, 1));
}

#[test]
fn rx_kernel_lying_headers_are_dropped() {
    let (_, h, f) = gso_packet(true);
    let udp = wire(true, 100, 1448, 1, 1)[0].clone();
    let cases: Vec<(TxHdr, Vec<u8>, &str)> = vec![
        (TxHdr { gso_size: 0, ..h }, f.clone(), "gso_size 0"),
        (TxHdr { csum_start: f.len() as u16, ..h }, f.clone(), "csum_start past the frame"),
        (TxHdr { hdr_len: u16::MAX, ..h }, f.clone(), "hdr_len past the frame"),
        (TxHdr { csum_offset: 6, ..h }, f.clone(), "checksum not at the TCP checksum"),
        (TxHdr { gso_type: 4, ..h }, f.clone(), "TCPV6 on an IPv4 frame"),
        (TxHdr { flags: 0, ..h }, f.clone(), "GSO without NEEDS_CSUM"),
        (TxHdr { flags: 0x80 | 1, ..h }, f.clone(), "unknown flag"),
        (TxHdr { gso_type: 9, ..h }, f.clone(), "unknown GSO type"),
        (TxHdr { csum_start: 2000, csum_offset: 0, flags: 1, gso_type: 0, ..h }, udp, "csum_start past a small frame"),
    ];
    for (bad, fr, what) in cases {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 256);
        post_rx(&vq, 0, 64, CHAIN);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut st, stats) = (RxState::default(), Stats::default());
        let mut port = KernelPort::new([(bad, fr)].into());
        run(&mut port, &m, &mut q, &mut st, TSO, &stats);
        assert!(guest_packets(&m, &vq, TSO.hdr_len).is_empty(), "{what}: nothing reaches the guest");
        let s = stats.snapshot();
        assert_eq!((s.rx_kernel_refused, s.rx_dropped, s.rx_frames), (1, 1, 0), "{what}");
        assert_eq!((s.rx_dropped_refused, s.rx_dropped_no_room), (1, 0), "{what}: dropped as refused");
        assert!(port.packets.is_empty(), "{what}: the packet is consumed, not retried");
    }
}

#[test]
fn rx_kernel_needs_csum_frame_keeps_the_request_or_is_filled() {
    // A small TCP frame with a partial checksum (a pod's, CHECKSUM_PARTIAL): the field holds
    // the pseudo-header sum.
    let good = wire(true, 500, 1448, 7, 9)[0].clone();
    let mut partial = good.clone();
    let (l3, l4) = (14, 34);
    let sum = crate::offload::csum_add(crate::offload::csum_add(0, &good[l3 + 12..l3 + 20]), &[0, 6])
        + (good.len() - l4) as u64;
    partial[l4 + 16..l4 + 18].copy_from_slice(&crate::offload::csum_fold(sum).to_be_bytes());
    let h = TxHdr { flags: F_NEEDS_CSUM, csum_start: l4 as u16, csum_offset: 16, ..TxHdr::default() };
    for (mode, want_hdr, want_frame) in [(TSO, h, &partial), (MODE, TxHdr::default(), &good)] {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 256);
        post_rx(&vq, 0, 8, CHAIN);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut st, stats) = (RxState::default(), Stats::default());
        let mut port = KernelPort::new([(h, partial.clone())].into());
        run(&mut port, &m, &mut q, &mut st, mode, &stats);
        let pk = guest_packets(&m, &vq, mode.hdr_len);
        assert_eq!(pk.len(), 1);
        assert_eq!(TxHdr::parse(&pk[0].0), want_hdr);
        assert_eq!(&pk[0].1, want_frame);
    }
}

/// Hostile kernel input (the kernel is trusted, but a bug there must not become one here): 3,000
/// random headers and mutated frames, each alone into a fresh ring of a TSO guest or one
/// without offloads. Nothing panics; every packet is delivered, cut or refused (never left);
/// whatever the guest gets carries a header it acked: a GSO type only for a GUEST_TSO guest,
/// at most `num_buffers` buffers, no flag besides NEEDS_CSUM / DATA_VALID.
#[test]
fn rx_kernel_random_headers_never_break_the_guest_contract() {
    let (_, h, f) = gso_packet(true);
    let (_, h6, f6) = gso_packet(false);
    let mut r = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        r ^= r >> 12;
        r ^= r << 25;
        r ^= r >> 27;
        r.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for i in 0..3000 {
        let (mut hdr, mut fr) = match i % 5 {
            4 => big_packet(i % 2 == 0), // BIG TCP: the chunk path
            _ if i % 2 == 0 => (h, f.clone()),
            _ => (h6, f6.clone()),
        };
        let b = hdr.bytes();
        let mut b = b.to_vec();
        for _ in 0..(next() % 3) {
            let at = (next() % 10) as usize;
            b[at] = next() as u8;
        }
        hdr = TxHdr::parse(&b);
        for _ in 0..(next() % 3) {
            let at = (next() % 100) as usize;
            fr[at] = next() as u8;
        }
        if next() % 4 == 0 {
            fr.truncate((next() % fr.len() as u64) as usize);
        }
        let mode = if i % 3 == 0 { MODE } else { TSO };
        let m = mem();
        let vq = MockSplitQueue::new(&m, 256);
        post_rx(&vq, 0, 64, CHAIN);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut st, stats) = (RxState::default(), Stats::default());
        let mut port = KernelPort::new([(hdr, fr)].into());
        run(&mut port, &m, &mut q, &mut st, mode, &stats);
        // A packet stays only to wait for buffers: when those left cannot take its next piece,
        // at most one IP packet (33 buffers of 2,048 bytes): a small gso_size the kernel may hand
        // cuts into more frames than 64 buffers take, a BIG TCP packet is three such pieces.
        let used: u16 = m.read_obj(vq.used_addr().unchecked_add(2)).unwrap();
        assert!(
            port.packets.is_empty() || 64 - used < 33,
            "case {i}: the packet was left in the port, {used} buffers used: {:?} {}",
            port.packets.front().map(|p| p.0),
            port.packets.front().map_or(0, |p| p.1.len())
        );
        let s = stats.snapshot();
        let gso_or_refused = s.rx_gso_kernel + s.rx_gso_kernel_cut + s.rx_kernel_refused;
        let waiting = !port.packets.is_empty();
        assert!(
            gso_or_refused == 1 || (gso_or_refused == 0 && (waiting || s.rx_frames + s.rx_dropped == 1)),
            "case {i}: {s:?}"
        );
        for (vh, frame) in guest_packets(&m, &vq, mode.hdr_len) {
            let g = TxHdr::parse(&vh);
            assert_eq!(g.flags & !(F_NEEDS_CSUM | HDR_F_DATA_VALID), 0, "case {i}: flags {g:?}");
            if g.gso_type != 0 {
                assert!(mode.offloads.guest_tso(), "case {i}: GSO to a guest without GUEST_TSO");
                assert!(usize::from(g.hdr_len) <= frame.len() && g.gso_size > 0, "case {i}: {g:?}");
            }
            if g.flags & F_NEEDS_CSUM != 0 {
                assert!(mode.offloads.guest_csum, "case {i}: NEEDS_CSUM to a guest without GUEST_CSUM");
                assert!(usize::from(g.csum_start) + usize::from(g.csum_offset) + 2 <= frame.len(), "case {i}: {g:?}");
            }
        }
    }
}

/// A TSO guest that has posted too few buffers for a 64 KiB packet gets it whole once it posts
/// more (the packet waits, it is not cut); only a ring full of buffers too small for it gets
/// the frames.
#[test]
fn rx_kernel_gso_packet_waits_for_buffers_unless_the_ring_is_full() {
    let (frames, h, f) = gso_packet(true);
    let m = mem();
    let vq = MockSplitQueue::new(&m, 256);
    post_rx(&vq, 0, 10, CHAIN);
    let mut q: Queue = vq.create_queue().unwrap();
    q.set_event_idx(true);
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mut port = KernelPort::new([(h, f.clone())].into());
    run(&mut port, &m, &mut q, &mut st, TSO, &stats);
    assert!(guest_packets(&m, &vq, TSO.hdr_len).is_empty(), "nothing delivered yet");
    assert_eq!(port.packets.len(), 1, "the packet waits for buffers");
    // The guest must kick when it adds its 11th buffer: with EVENT_IDX it kicks only when its
    // avail index crosses avail_event, so an event left at the 10 unused buffers' first one (0)
    // would never be crossed and the packet would wait for the next packet to arrive.
    let avail_event: u16 = m.read_obj(vq.used_addr().unchecked_add(4 + 8 * 256)).unwrap();
    assert_eq!(avail_event, 10, "the device asks for a kick at the guest's next buffer");
    post_rx(&vq, 10, 40, CHAIN);
    run(&mut port, &m, &mut q, &mut st, TSO, &stats);
    let pk = guest_packets(&m, &vq, TSO.hdr_len);
    assert_eq!(pk.len(), 1, "one packet, whole");
    assert_eq!(pk[0].1, f);
    let s = stats.snapshot();
    assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_cut), (1, 0));

    // 64 buffers of 200 bytes: the full ring holds 12,800 bytes, less than the packet. It is cut:
    // the first frames go (8 buffers each), the rest waits for buffers.
    let vq = MockSplitQueue::new(&m, 64);
    post_rx(&vq, 0, 64, 200);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut st, stats) = (RxState::default(), Stats::default());
    let mut port = KernelPort::new([(h, f)].into());
    run(&mut port, &m, &mut q, &mut st, TSO, &stats);
    let s = stats.snapshot();
    assert_eq!((s.rx_gso_kernel, s.rx_frames), (0, 8), "cut: 8 frames of 8 buffers each");
    assert_eq!(port.packets.len(), 1, "the rest of the cut waits for buffers");
    assert!(frames.len() > 8);
}

/// A BIG TCP GSO packet as the kernel hands it: 150,000 bytes of TCP payload behind one set of
/// headers, the IP length 0 (it cannot say more than 64 KiB), MSS 1448.
fn big_packet(v4: bool) -> (TxHdr, Vec<u8>) {
    let mut f = crate::fuzzing::packet(v4, true, 150_000, 0x18);
    let l4 = if v4 { 34 } else { 54 };
    let at = if v4 { 16 } else { 18 };
    f[at..at + 2].copy_from_slice(&[0, 0]);
    let h = TxHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v4 { 1 } else { 4 },
        hdr_len: (l4 + 32) as u16,
        gso_size: 1448,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    (h, f)
}

/// The wire segments a kernel GSO packet describes (its plan, cut here).
fn kernel_segments(h: &TxHdr, f: &[u8]) -> Vec<Vec<u8>> {
    let Ok(Plan::Gso(g)) = offload::plan_kernel(h, f, Offloads::ALL) else { panic!("no plan for {h:?}") };
    let mut o = vec![0u8; MAX_GSO_FRAME];
    (0..g.segs)
        .map(|i| {
            let n = offload::write_segment(f, &g, i, &mut o).unwrap();
            o[..n].to_vec()
        })
        .collect()
}

/// A BIG TCP packet (the kernel's IPv4 total length 0, 150,000 bytes of payload, more than one IP
/// packet holds) reaches a TSO guest as GSO packets of at most 64 KiB that cut back, in order,
/// into exactly the segments the whole packet describes; a guest without TSO gets those segments.
#[test]
fn rx_kernel_big_tcp_packet_reaches_a_tso_guest_in_64k_chunks() {
    for v4 in [true, false] {
        let (h, f) = big_packet(v4);
        let (l3, l4) = if v4 { (14, 34) } else { (14, 54) };
        let want = kernel_segments(&h, &f);
        assert_eq!(want.len(), 150_000usize.div_ceil(1448));
        for (mode, chunked) in [(TSO, true), (MODE, false)] {
            let (pk, s, left) = deliver(vec![(h, f.clone())], mode, 200);
            assert_eq!(left, 0, "v4 {v4}: taken");
            let got: Vec<Vec<u8>> = if chunked {
                assert_eq!(pk.len(), 3, "v4 {v4}: 150,000 bytes in three GSO packets");
                assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_chunks, s.rx_gso_kernel_cut), (1, 3, 0));
                pk.iter()
                    .flat_map(|(vh, p)| {
                        let gh = TxHdr::parse(vh);
                        assert!(p.len() - l3 - if v4 { 0 } else { 40 } <= 65_535, "v4 {v4}: one IP packet each");
                        let ip_len =
                            u16::from_be_bytes(if v4 { [p[l3 + 2], p[l3 + 3]] } else { [p[l3 + 4], p[l3 + 5]] });
                        assert_eq!(
                            usize::from(ip_len),
                            p.len() - l3 - if v4 { 0 } else { 40 },
                            "v4 {v4}: its own length"
                        );
                        assert_eq!((gh.flags, gh.gso_size, gh.csum_start), (F_NEEDS_CSUM, 1448, l4 as u16));
                        resegment(&gh, p)
                    })
                    .collect()
            } else {
                assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_chunks, s.rx_gso_kernel_cut), (0, 0, 1));
                pk.into_iter().map(|p| p.1).collect()
            };
            assert!(got == want, "v4 {v4} chunked {chunked}: the packet's segments, in order, each once");
        }
    }
}

/// IPv6 BIG TCP as the kernel hands it to the packet socket: a hop-by-hop header holding only the
/// jumbo payload option between the IPv6 and TCP headers. `strip_jumbo` removes it in the receive
/// buffer, and the packet then reaches a TSO guest in 64 KiB chunks that cut back into exactly the
/// segments of the packet without it. Anything else with a hop-by-hop header is left as it is
/// (and then refused: its next header is not TCP).
#[test]
fn rx_kernel_ipv6_big_tcp_jumbo_header_is_removed() {
    use crate::pkt_rx::{strip_jumbo, VNET_HDR_LEN};
    let (h, f) = big_packet(false);
    let with_hbh = |opt: [u8; 2]| {
        let mut hh = h;
        hh.hdr_len += 8;
        hh.csum_start += 8;
        let mut buf = hh.bytes().to_vec();
        buf.extend_from_slice(&f[..54]);
        buf[VNET_HDR_LEN + 20] = 0; // next header: hop-by-hop
        buf.extend_from_slice(&[6, 0, opt[0], opt[1]]);
        buf.extend_from_slice(&(f.len() as u32 - 54 + 8).to_be_bytes());
        buf.extend_from_slice(&f[54..]);
        buf
    };
    let mut buf = with_hbh([0xc2, 4]);
    let at = strip_jumbo(&mut buf);
    assert_eq!(at, 8);
    let (vh, frame) = buf[at..].split_at(VNET_HDR_LEN);
    assert_eq!(TxHdr::parse(vh), h, "the header as for the packet without the option");
    assert!(frame == &f[..], "the packet without the option");

    let mut plain = h.bytes().to_vec();
    plain.extend_from_slice(&f);
    assert_eq!(strip_jumbo(&mut plain), 0, "no hop-by-hop header: untouched");
    let mut other = with_hbh([0x05, 2]); // a router alert, not the jumbo option
    let before = other.clone();
    assert_eq!(strip_jumbo(&mut other), 0);
    assert!(other == before, "any other hop-by-hop header: untouched");

    let (vh, frame) = buf[at..].split_at(VNET_HDR_LEN);
    let (ovh, oframe) = other.split_at(VNET_HDR_LEN);
    let (pk, s, _) = deliver(vec![(TxHdr::parse(vh), frame.to_vec()), (TxHdr::parse(ovh), oframe.to_vec())], TSO, 200);
    assert_eq!((s.rx_gso_kernel, s.rx_gso_kernel_chunks, s.rx_kernel_refused), (1, 3, 1));
    let want = kernel_segments(&h, &f);
    let got: Vec<Vec<u8>> = pk.iter().flat_map(|(vh, p)| resegment(&TxHdr::parse(vh), p)).collect();
    assert!(got == want, "the packet's segments, in order, each once");
}

/// A HASH_REPORT guest gets, on this path that no steer_vm serves, the Toeplitz hash of the
/// packet's flow under its own key and types (`rss::hash`): on the whole GSO packet, and on
/// every frame when it is cut; TCP disabled, the addresses' hash; no configuration, none.
#[test]
fn rx_kernel_reports_the_guests_hash() {
    use crate::rss::{hash::frame_hash, hash_type, SUPPORTED_HASH_TYPES};
    let key: [u8; crate::rss::KEY_SIZE] = std::array::from_fn(|i| (i * 37 + 11) as u8);
    for v4 in [true, false] {
        let (frames, h, f) = gso_packet(v4);
        let addrs_only = hash_type::IPV4 | hash_type::IPV6;
        for (tso, types, want_report) in [
            (true, SUPPORTED_HASH_TYPES, if v4 { 2 } else { 5 }),
            (false, SUPPORTED_HASH_TYPES, if v4 { 2 } else { 5 }),
            (true, addrs_only, if v4 { 1 } else { 4 }),
            (true, 0, 0),
        ] {
            let base = if tso { TSO } else { MODE };
            let rx_hash = Some(RxHash { types, key });
            let mode = base.with_hash_report(true).with_rx_hash(rx_hash);
            let want = frame_hash(&f, types, &key).map_or(0, |m| m.hash);
            assert_eq!(want != 0, types != 0, "v4 {v4}: the test's own expectation");
            let (pk, _, _) = deliver(vec![(h, f.clone())], mode, 64);
            assert_eq!(pk.len(), if tso { 1 } else { frames.len() }, "v4 {v4} tso {tso}");
            for (vh, _) in &pk {
                let hash = u32::from_le_bytes([vh[12], vh[13], vh[14], vh[15]]);
                let report = u16::from_le_bytes([vh[16], vh[17]]);
                assert_eq!((hash, report), (want, want_report), "v4 {v4} tso {tso} types {types:#x}");
            }
        }
    }
}

/// A run stops at the first short read: the packets waiting are one read of the port (on a packet
/// socket a second would only say EAGAIN, a syscall per wake-up).
#[test]
fn rx_kernel_stops_at_the_first_short_read() {
    for (n, reads) in [(1, 1), (10, 1)] {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 256);
        post_rx(&vq, 0, 200, CHAIN);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut st, stats) = (RxState::default(), Stats::default());
        let frame = wire(true, 100, 1448, 40000, 0xffff_f000).remove(0);
        let mut port = KernelPort::new((0..n).map(|_| (TxHdr::default(), frame.clone())).collect());
        run(&mut port, &m, &mut q, &mut st, MODE, &stats);
        assert_eq!(port.packets.len(), 0, "{n} packets: all delivered");
        assert_eq!(port.reads, reads, "{n} packets: port reads");
    }
}
