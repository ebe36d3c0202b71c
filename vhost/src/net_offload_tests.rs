//! TX offloads through the real queue code (`tx_queue` with `MockSplitQueue`): GSO chains leave
//! as MSS-sized frames, checksums are filled in, lying headers are dropped and counted.

use super::*;
use crate::fuzzing::{gso_hdr, l4_check, packet};
use crate::offload::{plan, write_segment, Plan, TxHdr, MAX_GSO_FRAME};

const OFF: NetMode = NetMode { offloads: Offloads::ALL, ..MODE };

fn hdr12(h: TxHdr) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..10].copy_from_slice(&h.bytes());
    b
}

/// The frames `frame` with header `h` must become.
fn expected(h: &TxHdr, frame: &[u8]) -> Vec<Vec<u8>> {
    let Ok(Plan::Gso(g)) = plan(h, frame, Offloads::ALL, 1518) else { panic!("not a GSO frame") };
    (0..g.segs)
        .map(|i| {
            let mut out = vec![0u8; 2048];
            let n = write_segment(frame, &g, i, &mut out).unwrap();
            out.truncate(n);
            out
        })
        .collect()
}

#[test]
fn tx_gso_chains_leave_as_mss_frames_in_order() {
    // Both families, the batch path and lent buffers (one lent at first: the loan is renewed
    // while a chain is cut).
    for (v4, gso_type) in [(true, 1u8), (false, 4u8)] {
        for lend in [None, Some(2048)] {
            let m = mem();
            let vq = MockSplitQueue::new(&m, 16);
            let big = packet(v4, true, 20_000, 0x18);
            let h = gso_hdr(&big, gso_type, if v4 { 1448 } else { 1428 });
            let small = packet(v4, true, 10, 0x18);
            let chains = vec![
                tx_descs(&m, BUF_BASE, hdr12(h), &big, 4096),
                tx_descs(&m, BUF_BASE + 0x10000, [0; 12], &small, 64),
                tx_descs(&m, BUF_BASE + 0x20000, hdr12(h), &big, 100_000),
            ];
            add_chains(&vq, 0, &chains);
            let mut q: Queue = vq.create_queue().unwrap();
            let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
            port.lend = lend;
            let run = tx_queue(&mut q, &m, &mut port, &mut st, OFF, &stats, 64);
            assert_eq!(run.handled, 3);
            let segs = expected(&h, &big);
            let n = segs.len();
            assert_eq!(n, 20_000usize.div_ceil(if v4 { 1448 } else { 1428 }));
            let want: Vec<Vec<u8>> = [segs.clone(), vec![small.clone()], segs].concat();
            assert_eq!(port.sent.len(), want.len(), "v4 {v4} lend {lend:?}");
            assert!(port.sent == want, "v4 {v4} lend {lend:?}: frames differ");
            for f in &port.sent[..n] {
                assert!(f.len() <= 1518);
                assert_eq!(l4_check(f, v4), 0, "segment checksum");
            }
            let s = stats.snapshot();
            let want = (2, 2 * n as u64 + 1, 0, 0);
            assert_eq!((s.tx_gso, s.tx_frames, s.errors, s.tx_dropped), want, "v4 {v4} lend {lend:?}");
            assert_eq!(used_idx(&vq), 3);
        }
    }
}

#[test]
fn tx_lying_offload_headers_are_dropped_and_counted() {
    for lend in [None, Some(2048)] {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 32);
        let v4 = packet(true, true, 3000, 0x10);
        let v6 = packet(false, true, 3000, 0x10);
        let udp = packet(true, false, 3000, 0);
        let good = gso_hdr(&v4, 1, 1448);
        let mut csum = packet(true, true, 100, 0x18);
        let csum_hdr = TxHdr { gso_type: 0, gso_size: 0, ..gso_hdr(&csum, 0, 0) };
        let chains = vec![
            tx_descs(&m, BUF_BASE, hdr12(TxHdr { gso_size: 0, ..good }), &v4, 4096),
            tx_descs(&m, BUF_BASE + 0x2000, hdr12(TxHdr { hdr_len: 5000, ..good }), &v4, 4096),
            tx_descs(&m, BUF_BASE + 0x4000, hdr12(TxHdr { csum_start: 54, ..good }), &v6, 4096),
            tx_descs(&m, BUF_BASE + 0x6000, hdr12(good), &udp, 4096),
            tx_descs(&m, BUF_BASE + 0x8000, hdr12(TxHdr { gso_size: 10, ..good }), &v4, 4096),
            tx_descs(
                &m,
                BUF_BASE + 0xa000,
                hdr12(TxHdr { csum_start: 200, csum_offset: 0xffff, ..csum_hdr }),
                &csum,
                64,
            ),
            // Fine: a checksum to fill, and a plain frame.
            tx_descs(&m, BUF_BASE + 0xc000, hdr12(csum_hdr), &csum, 64),
            tx_descs(&m, BUF_BASE + 0xe000, [0; 12], &csum, 64),
            // No offload, but larger than the MTU allows (accepted as a chain: GSO is on).
            tx_descs(&m, BUF_BASE + 0x10000, [0; 12], &v4, 4096),
            // Larger than any GSO frame.
            vec![(BUF_BASE + 0x20000, (12 + MAX_GSO_FRAME + 1) as u32, false)],
        ];
        add_chains(&vq, 0, &chains);
        let mut q: Queue = vq.create_queue().unwrap();
        let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
        port.lend = lend;
        let run = tx_queue(&mut q, &m, &mut port, &mut st, OFF, &stats, 64);
        assert_eq!(run.handled, 10);
        assert_eq!(used_idx(&vq), 10, "every chain is returned to the guest");
        assert_eq!(port.sent.len(), 2, "lend {lend:?}: only the two good frames leave");
        assert_eq!(l4_check(&port.sent[0], true), 0, "checksum filled in");
        let unfilled = port.sent[1].clone();
        assert_eq!(unfilled, csum, "a plain frame is sent as it is");
        crate::offload::fill_csum(&mut csum, 34, 16);
        assert_eq!(port.sent[0], csum);
        let s = stats.snapshot();
        assert_eq!((s.errors, s.tx_csum, s.tx_gso), (8, 1, 0), "lend {lend:?}");
        // bad_chain, frame_too_large, invalid_ring, bad_offload.
        assert_eq!(s.error_kinds, [0, 2, 0, 6], "lend {lend:?}");
    }
}

#[test]
fn tx_offload_requests_are_refused_when_not_negotiated() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let v4 = packet(true, true, 1000, 0x10);
    let h = gso_hdr(&v4, 1, 536);
    add_chains(&vq, 0, &[tx_descs(&m, BUF_BASE, hdr12(h), &v4, 4096)]);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    let csum_only = NetMode { offloads: Offloads { csum: true, ..Offloads::NONE }, ..MODE };
    tx_queue(&mut q, &m, &mut port, &mut st, csum_only, &stats, 64);
    assert!(port.sent.is_empty());
    assert_eq!(stats.snapshot().error_kinds, [0, 0, 0, 1]);
}

#[test]
fn rx_marks_data_valid_only_for_verified_checksums() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let chains: Vec<_> = (0..6).map(|i| vec![(BUF_BASE + 0x1000 * i, 2048, true)]).collect();
    add_chains(&vq, 0, &chains);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut s, stats) = (Scratch::default(), Stats::default());
    let mut good = packet(false, true, 500, 0x18);
    crate::offload::fill_csum(&mut good, 54, 16);
    let mut bad = good.clone();
    bad[100] ^= 1;
    let guest_csum = NetMode { offloads: Offloads { guest_csum: true, ..Offloads::NONE }, ..MODE };
    // (frame, mode, flags the guest must see)
    let cases = [(&good, guest_csum, 2u8), (&bad, guest_csum, 0), (&good, MODE, 0), (&frame(300, 1), guest_csum, 0)];
    for (i, (f, mode, flags)) in cases.into_iter().enumerate() {
        assert_eq!(rx_frame(&mut q, &m, f, None, mode, &mut s, &stats), RxOutcome::Delivered);
        let got = read_guest(&m, BUF_BASE + 0x1000 * i as u64, 12 + f.len());
        assert_eq!(got[0], flags, "case {i}: header flags");
        assert_eq!(&got[12..], &f[..], "case {i}: frame");
    }
    assert_eq!(stats.snapshot().rx_csum_valid, 1);
}

#[test]
fn tx_only_the_l4_checksum_is_left_to_the_port() {
    // Direct TX: a checksum request at the frame's own TCP/UDP checksum (and every GSO segment)
    // goes to the port with the pseudo-header sum in place; a request aimed anywhere else (here
    // the IPv4 destination address, which the agent's policy reads before a deferred checksum
    // would be written) is computed here before the frame leaves.
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let (tcp4, udp4, tcp6) =
        (packet(true, true, 300, 0x18), packet(true, false, 300, 0), packet(false, true, 300, 0x18));
    let csum = |f: &[u8]| TxHdr { gso_type: 0, gso_size: 0, ..gso_hdr(f, 0, 0) };
    let aimed = TxHdr { csum_start: 30, csum_offset: 0, ..csum(&tcp4) };
    let big = packet(true, true, 4000, 0x18);
    let gso = gso_hdr(&big, 1, 1448);
    let chains = vec![
        tx_descs(&m, BUF_BASE, hdr12(csum(&tcp4)), &tcp4, 4096),
        tx_descs(&m, BUF_BASE + 0x2000, hdr12(csum(&udp4)), &udp4, 4096),
        tx_descs(&m, BUF_BASE + 0x4000, hdr12(csum(&tcp6)), &tcp6, 4096),
        tx_descs(&m, BUF_BASE + 0x6000, hdr12(aimed), &tcp4, 4096),
        tx_descs(&m, BUF_BASE + 0x8000, hdr12(gso), &big, 4096),
    ];
    add_chains(&vq, 0, &chains);
    let mut q: Queue = vq.create_queue().unwrap();
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    port.lend = Some(2048);
    assert_eq!(tx_queue(&mut q, &m, &mut port, &mut st, OFF, &stats, 64).handled, 5);
    let segs = expected(&gso, &big);
    let mut want_reqs = vec![Some((34, 16)), Some((34, 6)), Some((54, 16)), None];
    want_reqs.extend(std::iter::repeat_n(Some((34u16, 16u16)), segs.len()));
    assert_eq!(port.csum_reqs, want_reqs);
    // The port finished them (as a port without TX metadata does): what a receiver verifies.
    for (i, (f, v4)) in [(&port.sent[0], true), (&port.sent[1], true), (&port.sent[2], false)].into_iter().enumerate() {
        assert_eq!(l4_check(f, v4), 0, "frame {i}");
    }
    let mut filled = tcp4.clone();
    crate::offload::fill_csum(&mut filled, 30, 0);
    assert_eq!(port.sent[3], filled, "a request aimed elsewhere is computed by the backend");
    assert!(port.sent[4..] == segs[..], "segments finished by the port equal the software ones");
    let s = stats.snapshot();
    assert_eq!((s.tx_csum, s.tx_gso, s.errors), (4, 1, 0));
}
