//! Unit tests of the offload checks and the software segmentation / checksums.

use super::*;

use crate::fuzzing::{gso_hdr, l4_check, packet, reference_csum};

const TCPV4: u8 = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
const TCPV6: u8 = VIRTIO_NET_HDR_GSO_TCPV6 as u8;
const ECN: u8 = VIRTIO_NET_HDR_GSO_ECN as u8;

#[test]
fn needs_csum_fills_the_checksum_a_receiver_verifies() {
    for (v4, tcp) in [(true, true), (true, false), (false, true), (false, false)] {
        for payload in [0, 1, 17, 1400] {
            let mut f = packet(v4, tcp, payload, 0x18);
            let h = TxHdr { gso_type: 0, gso_size: 0, ..gso_hdr(&f, 0, 0) };
            let Ok(Plan::Single { csum: Some((s, o)) }) = plan(&h, &f, Offloads::ALL, 1518) else {
                panic!("v4 {v4} tcp {tcp}: not a checksum plan")
            };
            assert_ne!(l4_check(&f, v4), 0, "the guest's partial checksum is not final");
            fill_csum(&mut f, s, o);
            assert_eq!(l4_check(&f, v4), 0, "v4 {v4} tcp {tcp} payload {payload}");
        }
    }
}

#[test]
fn tso_cuts_mss_sized_frames_with_fixed_headers_and_checksums() {
    // One table for both families (and UDP segmentation).
    for (v4, tcp, gso_type) in [(true, true, TCPV4), (false, true, TCPV6), (true, false, 5), (false, false, 5)] {
        let hdrs = if v4 { 34 } else { 54 } + if tcp { 32 } else { 8 };
        // The largest MSS for a 1500-byte MTU.
        let (payload, mss) = (5000usize, 1500 - (hdrs - 14));
        let f = packet(v4, tcp, payload, 0x80 | 0x18 | 0x01); // CWR, PSH, ACK, FIN
        let h = gso_hdr(&f, gso_type | if tcp { ECN } else { 0 }, mss as u16);
        let p = plan(&h, &f, Offloads::ALL, 1518);
        let Ok(Plan::Gso(g)) = p else { panic!("{v4} {tcp}: no GSO plan: {p:?}") };
        assert_eq!(g.segs, 4);
        // Segments may be as large as the largest frame (MTU + 18), not a byte more.
        let at = TxHdr { gso_size: (1518 - hdrs) as u16, ..h };
        assert!(plan(&at, &f, Offloads::ALL, 1518).is_ok());
        let over = TxHdr { gso_size: (1518 - hdrs + 1) as u16, ..h };
        assert!(plan(&over, &f, Offloads::ALL, 1518).is_err(), "one byte over the largest frame");
        let mut data = Vec::new();
        for i in 0..g.segs {
            let mut out = [0u8; 2048];
            let n = write_segment(&f, &g, i, &mut out).unwrap();
            let s = &out[..n];
            assert_eq!(n, hdrs + mss.min(payload - i * mss), "segment {i}");
            assert!(n <= 1518);
            if v4 {
                assert_eq!(be16(s, 16), Some((n - 14) as u16), "IPv4 total length");
                assert_eq!(be16(s, 18), Some(0x1234 + i as u16), "IPv4 id");
                assert_eq!(reference_csum(&[&s[14..34]]), 0, "IPv4 header checksum");
            } else {
                assert_eq!(be16(s, 18), Some((n - 54) as u16), "IPv6 payload length");
            }
            let l4 = if v4 { 34 } else { 54 };
            if tcp {
                let seq = u32::from_be_bytes(s[l4 + 4..l4 + 8].try_into().unwrap());
                assert_eq!(seq, 0xffff_f000u32.wrapping_add((i * mss) as u32), "seq of {i}");
                let flags = s[l4 + 13];
                let last = i + 1 == g.segs;
                assert_eq!(flags & 0x10, 0x10, "ACK on every segment");
                assert_eq!(flags & (0x08 | 0x01) != 0, last, "FIN/PSH only on the last ({i})");
                assert_eq!(flags & 0x80 != 0, i == 0, "CWR only on the first ({i})");
            } else {
                assert_eq!(be16(s, l4 + 4), Some((n - l4) as u16), "UDP length");
            }
            assert_eq!(l4_check(s, v4), 0, "L4 checksum of segment {i} (v4 {v4} tcp {tcp})");
            data.extend_from_slice(&s[hdrs..]);
        }
        assert_eq!(data, f[hdrs..], "the payload, in order, once");
        assert_eq!(write_segment(&f, &g, 0, &mut [0u8; 100]), None, "too small a buffer");
    }
}

#[test]
fn lying_headers_are_refused() {
    let v4 = packet(true, true, 3000, 0x10);
    let v6 = packet(false, true, 3000, 0x10);
    let udp = packet(true, false, 3000, 0);
    let good = gso_hdr(&v4, TCPV4, 1448);
    assert!(matches!(plan(&good, &v4, Offloads::ALL, 1518), Ok(Plan::Gso(_))));
    let mut frag = v4.clone();
    frag[20] = 0x20; // MF
    let mut ihl = v4.clone();
    ihl[14] = 0x44;
    let mut doff = v4.clone();
    doff[34 + 12] = 0x40;
    let no_tso = Offloads { tso4: false, ..Offloads::ALL };
    let no_ecn = Offloads { ecn: false, ..Offloads::ALL };
    let cases: Vec<(&str, TxHdr, &[u8], Offloads)> = vec![
        ("gso_size 0", TxHdr { gso_size: 0, ..good }, &v4, Offloads::ALL),
        ("hdr_len past the frame", TxHdr { hdr_len: 3067, ..good }, &v4, Offloads::ALL),
        ("csum_start past the frame", TxHdr { gso_type: 0, csum_start: 3066, ..good }, &v4, Offloads::ALL),
        ("csum field past the frame", TxHdr { gso_type: 0, csum_offset: 3066 - 34 - 1, ..good }, &v4, Offloads::ALL),
        ("csum_start not at L4", TxHdr { csum_start: 14, ..good }, &v4, Offloads::ALL),
        ("csum_offset not TCP's", TxHdr { csum_offset: 6, ..good }, &v4, Offloads::ALL),
        ("TCPV4 on an IPv6 frame", TxHdr { csum_start: 54, ..good }, &v6, Offloads::ALL),
        ("TCPV6 on an IPv4 frame", TxHdr { gso_type: TCPV6, ..good }, &v4, Offloads::ALL),
        ("TCP GSO on a UDP frame", good, &udp, Offloads::ALL),
        ("UDP GSO on a TCP frame", TxHdr { gso_type: 5, ..good }, &v4, Offloads::ALL),
        ("GSO without NEEDS_CSUM", TxHdr { flags: 0, ..good }, &v4, Offloads::ALL),
        ("unknown flag", TxHdr { flags: 3, ..good }, &v4, Offloads::ALL),
        ("unknown GSO type", TxHdr { gso_type: 2, ..good }, &v4, Offloads::ALL),
        ("TSO4 not negotiated", good, &v4, no_tso),
        ("ECN not negotiated", TxHdr { gso_type: TCPV4 | ECN, ..good }, &v4, no_ecn),
        ("checksum not negotiated", TxHdr { gso_type: 0, ..good }, &v4, Offloads::NONE),
        ("too many segments", TxHdr { gso_size: 20, ..good }, &v4, Offloads::ALL),
        ("segments above the MTU", TxHdr { gso_size: 1500, ..good }, &v4, Offloads::ALL),
        ("IPv4 fragment", good, &frag, Offloads::ALL),
        ("IPv4 header length below 20", good, &ihl, Offloads::ALL),
        ("TCP data offset below 5", good, &doff, Offloads::ALL),
        ("truncated headers", good, &v4[..40], Offloads::ALL),
        ("not IP", good, &[0u8; 60], Offloads::ALL),
    ];
    for (why, h, f, off) in cases {
        let r = plan(&h, f, off, 1518);
        assert!(r.is_err(), "{why}: accepted as {r:?}");
    }
}

#[test]
fn features_follow_the_flags() {
    use virtio_bindings::virtio_net::{VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6};
    let all = Offloads::ALL.features();
    assert_eq!(Offloads::from_features(all), Offloads::ALL);
    let (gcsum, gtso4, gtso6) =
        (1u64 << VIRTIO_NET_F_GUEST_CSUM, 1u64 << VIRTIO_NET_F_GUEST_TSO4, 1u64 << VIRTIO_NET_F_GUEST_TSO6);
    let no_csum = Offloads::ALL.without("csum").unwrap();
    assert_eq!(no_csum.features(), gcsum | gtso4 | gtso6, "host segmentation needs CSUM, not the guest's");
    assert_eq!(no_csum.without("guest_csum").unwrap().features(), 0, "guest TSO needs GUEST_CSUM");
    assert_eq!(no_csum.without("guest_tso").unwrap().features(), gcsum);
    assert_eq!(no_csum.without("guest_tso6").unwrap().features(), gcsum | gtso4);
    assert_eq!(Offloads { guest_csum: false, ..Offloads::ALL }.features() & (gtso4 | gtso6), 0);
    assert!(Offloads::ALL.guest_tso() && !Offloads { guest_csum: false, ..Offloads::ALL }.guest_tso());
    let f = Offloads::ALL.without("tso4").unwrap().without("tso6").unwrap().features();
    assert_eq!(f & (1 << VIRTIO_NET_F_HOST_ECN), 0, "ECN needs TSO");
    assert!(Offloads::ALL.without("gso").is_err());
}

#[test]
fn rx_checksums_are_verified_not_assumed() {
    for (v4, tcp) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut f = packet(v4, tcp, 700, 0x18);
        let h = gso_hdr(&f, 0, 0);
        fill_csum(&mut f, usize::from(h.csum_start), usize::from(h.csum_offset));
        assert!(rx_csum_ok(&f), "v4 {v4} tcp {tcp}");
        let mut padded = f.clone();
        padded.extend_from_slice(&[0xab; 7]);
        assert!(rx_csum_ok(&padded), "Ethernet padding is not summed");
        for at in [f.len() - 1, usize::from(h.csum_start) + usize::from(h.csum_offset), f.len() - 300] {
            let mut bad = f.clone();
            bad[at] ^= 0x40;
            assert!(!rx_csum_ok(&bad), "v4 {v4} tcp {tcp}: corrupt byte {at} accepted");
        }
        // An IP length past the frame, a truncated frame, not IP.
        let mut long = f.clone();
        long[if v4 { 16 } else { 18 }] ^= 0x80;
        assert!(!rx_csum_ok(&long));
        assert!(!rx_csum_ok(&f[..40]));
        assert!(!rx_csum_ok(&[0u8; 60]));
    }
    let mut none = packet(true, false, 100, 0);
    none[40..42].copy_from_slice(&[0, 0]);
    assert!(rx_csum_ok(&none), "IPv4 UDP without a checksum");
}

#[test]
fn only_the_frames_own_l4_checksum_may_be_left_to_the_kernel() {
    let (tcp4, udp6) = (packet(true, true, 100, 0x18), packet(false, false, 100, 0));
    assert!(l4_csum_at(&tcp4, 34, 16));
    assert!(l4_csum_at(&udp6, 54, 6));
    let mut frag = tcp4.clone();
    frag[20] = 0x20; // more fragments
    let mut icmp = tcp4.clone();
    icmp[23] = 1;
    let mut ext = udp6.clone();
    ext[20] = 0; // hop-by-hop extension header
    for (why, f, s, o) in [
        ("TCP checksum offset", &tcp4, 34usize, 6usize),
        ("IPv4 destination", &tcp4, 30, 0),
        ("TCP ports", &tcp4, 34, 0),
        ("past L4 start", &tcp4, 36, 14),
        ("UDP offset on IPv6", &udp6, 54, 16),
        ("IPv4 fragment", &frag, 34, 16),
        ("not TCP/UDP", &icmp, 34, 16),
        ("IPv6 extension header", &ext, 54, 6),
        ("truncated", &tcp4[..50].to_vec(), 34, 16),
    ] {
        assert!(!l4_csum_at(f, s, o), "{why}");
    }
}

#[test]
fn partial_segments_finished_anywhere_equal_software_segments() {
    for (v4, tcp, gso_type) in [(true, true, TCPV4), (false, true, TCPV6), (true, false, 5), (false, false, 5)] {
        let f = packet(v4, tcp, 5000, 0x18);
        let Ok(Plan::Gso(g)) = plan(&gso_hdr(&f, gso_type, 1000), &f, Offloads::ALL, 1518) else { panic!() };
        for i in 0..g.segs {
            let (mut a, mut b) = (vec![0u8; 2048], vec![0u8; 2048]);
            let n = write_segment(&f, &g, i, &mut a).unwrap();
            let (m, (s, o)) = write_segment_partial(&f, &g, i, &mut b).unwrap();
            assert_eq!((m, usize::from(s), usize::from(o)), (n, g.l4, if tcp { 16 } else { 6 }));
            assert!(l4_csum_at(&b[..m], s.into(), o.into()), "v4 {v4} tcp {tcp}: the request is the L4 checksum");
            assert_ne!(l4_check(&b[..m], v4), 0, "left partial");
            fill_csum(&mut b[..m], s.into(), o.into());
            assert_eq!(a[..n], b[..m], "v4 {v4} tcp {tcp} segment {i}");
        }
    }
}
