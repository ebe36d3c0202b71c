//! Unit tests of the wire -> guest coalescer.

use super::*;
pub(crate) use crate::fuzzing::{packet, wire};
use crate::offload::{plan, write_segment, Offloads, Plan};

const LIMIT: usize = 18 + MAX_IP;

/// Cut a merged segment again, as the guest's stack would see its packets.
pub(crate) fn resegment(hdr: &TxHdr, frame: &[u8]) -> Vec<Vec<u8>> {
    let p = plan(hdr, frame, Offloads::ALL, LIMIT);
    let Ok(Plan::Gso(g)) = p else { panic!("merged segment does not plan: {p:?}") };
    (0..g.segs)
        .map(|i| {
            let mut o = vec![0u8; LIMIT];
            let n = write_segment(frame, &g, i, &mut o).expect("segment");
            o.truncate(n);
            o
        })
        .collect()
}

fn run(frames: &[Vec<u8>]) -> (Vec<Out>, GroStats) {
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let (mut out, mut st) = (Vec::new(), GroStats::default());
    coalesce(&refs, LIMIT, Offloads::ALL, &mut out, &mut st);
    (out, st)
}

/// Every frame comes out exactly once: passed, or inside a segment that cuts back into it.
fn check_exact(frames: &[Vec<u8>], out: &[Out]) {
    let mut seen = Vec::new();
    for o in out {
        match o {
            Out::Pass(i) => seen.push(*i),
            Out::Segment { idx, hdr, frame } => {
                let again = resegment(hdr, frame);
                let want: Vec<&Vec<u8>> = idx.iter().map(|&i| &frames[i]).collect();
                assert_eq!(again.iter().collect::<Vec<_>>(), want, "segment of {idx:?}");
                seen.extend(idx);
            }
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..frames.len()).collect::<Vec<_>>());
}

#[test]
fn one_flow_becomes_one_segment_that_cuts_back_into_the_frames() {
    for v4 in [true, false] {
        let frames = wire(v4, 20 * 1448 + 100, 1448, 40000, 0xffff_f000);
        assert_eq!(frames.len(), 21);
        let (out, st) = run(&frames);
        assert_eq!(out.len(), 1, "v4 {v4}: {:?}", out.iter().map(|o| matches!(o, Out::Pass(_))).collect::<Vec<_>>());
        let Out::Segment { idx, hdr, frame } = &out[0] else { panic!() };
        assert_eq!(idx.len(), 21);
        assert_eq!((hdr.gso_size, hdr.flags, hdr.gso_type), (1448, F_NEEDS_CSUM, if v4 { 1 } else { 4 }));
        let hdrs = if v4 { 66 } else { 86 };
        assert_eq!(usize::from(hdr.hdr_len), hdrs);
        let payload: Vec<u8> = frames.iter().flat_map(|f| f[hdrs..].to_vec()).collect();
        assert_eq!(&frame[hdrs..], &payload[..]);
        check_exact(&frames, &out);
        assert_eq!(st, GroStats { segments: 1, merged: 21, flush_last: 1, ..GroStats::default() });
    }
}

#[test]
fn a_batch_end_flushes_and_each_refused_rule_passes_the_frame() {
    // No PSH, all full-sized: the end of the batch closes the segment.
    let mut frames = wire(true, 4 * 1000, 1000, 1, 0);
    frames[3][34 + 13] = 0x10;
    fix_csum(&mut frames[3], true);
    let (out, st) = run(&frames);
    assert_eq!((out.len(), st.flush_batch, st.merged), (1, 1, 4));
    check_exact(&frames, &out);

    type Mutate = fn(&mut Vec<u8>);
    let rules: [(&str, Mutate); 8] = [
        ("sequence gap", |f| f[38] ^= 1),
        ("other ack", |f| f[42] ^= 1),
        ("other window", |f| f[48] ^= 1),
        ("other options (timestamp)", |f| f[60] ^= 1),
        ("other TTL", |f| f[22] ^= 1),
        ("FIN", |f| f[47] |= 1),
        ("CWR", |f| f[47] |= 0x80),
        ("bad checksum", |f| f[70] ^= 1),
    ];
    for (why, m) in rules {
        let mut frames = wire(true, 4 * 1000, 1000, 1, 0);
        m(&mut frames[2]);
        if why != "bad checksum" {
            fix_csum(&mut frames[2], true);
        }
        let (out, st) = run(&frames);
        check_exact(&frames, &out);
        assert!(out.contains(&Out::Pass(2)), "{why}: frame 2 merged: {out:?}");
        assert!(st.flush_rule >= 1, "{why}: {st:?}");
        // Frames 0 and 1 merged, before frame 2.
        assert!(matches!(&out[0], Out::Segment { idx, .. } if idx == &[0, 1]), "{why}: {out:?}");
    }
}

#[test]
fn ip_options_fragments_padding_and_pure_acks_pass_unchanged() {
    let f = wire(true, 2000, 1000, 1, 0);
    let mut frag = f.clone();
    for g in &mut frag {
        g[20] |= 0x20; // more fragments
    }
    let mut padded = f.clone();
    for g in &mut padded {
        g.extend_from_slice(&[0; 4]);
    }
    let acks: Vec<Vec<u8>> = (0..3).map(|_| packet(true, true, 0, 0x10)).collect();
    for (why, frames) in [("fragment", frag), ("padding", padded), ("no payload", acks)] {
        let (out, _) = run(&frames);
        assert_eq!(out, (0..frames.len()).map(Out::Pass).collect::<Vec<_>>(), "{why}");
    }
}

#[test]
fn interleaved_flows_merge_separately_and_keep_their_order() {
    let a = wire(true, 3 * 1000, 1000, 1, 0);
    let b = wire(false, 3 * 1000, 1000, 2, 5);
    let frames = vec![a[0].clone(), b[0].clone(), a[1].clone(), b[1].clone(), a[2].clone(), b[2].clone()];
    let (out, st) = run(&frames);
    check_exact(&frames, &out);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(matches!(&out[0], Out::Segment { idx, .. } if idx == &[0, 2, 4]));
    assert!(matches!(&out[1], Out::Segment { idx, .. } if idx == &[1, 3, 5]));
    assert_eq!((st.segments, st.merged), (2, 6));
}

#[test]
fn a_frame_that_cannot_join_does_not_overtake_its_flow() {
    let mut frames = wire(true, 3 * 1000, 1000, 1, 0);
    frames[2][47] |= 0x01; // FIN on the last
    fix_csum(&mut frames[2], true);
    let (out, _) = run(&frames);
    assert!(matches!(&out[0], Out::Segment { idx, .. } if idx == &[0, 1]), "{out:?}");
    assert_eq!(out[1], Out::Pass(2));
}

#[test]
fn segments_stay_under_the_limit_and_64_kib() {
    let frames = wire(false, 60 * 1400, 1400, 1, 0);
    let (out, st) = run(&frames);
    check_exact(&frames, &out);
    for o in &out {
        if let Out::Segment { frame, .. } = o {
            assert!(frame.len() - 14 <= MAX_IP, "{}", frame.len());
        }
    }
    assert!(st.flush_size >= 1 && st.segments >= 2, "{st:?}");
    // A guest with small buffers: nothing larger than they take.
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let (mut out, mut st) = (Vec::new(), GroStats::default());
    coalesce(&refs, 5000, Offloads::ALL, &mut out, &mut st);
    check_exact(&frames, &out);
    assert!(out.iter().all(|o| !matches!(o, Out::Segment { frame, .. } if frame.len() > 5000)));
}

/// Recompute the TCP checksum (and the IPv4 header's) after a test changed a header.
fn fix_csum(f: &mut [u8], v4: bool) {
    let (l3, l4) = (14, if v4 { 34 } else { 54 });
    if v4 {
        f[l3 + 10..l3 + 12].fill(0);
        let c = !csum_fold(csum_add(0, &f[l3..l4]));
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    f[l4 + 16..l4 + 18].fill(0);
    let addrs = if v4 { &f[l3 + 12..l3 + 20] } else { &f[l3 + 8..l3 + 40] };
    let s = csum_add(0, addrs) + (f.len() - l4) as u64 + 6;
    let c = !csum_fold(s + csum_add(0, &f[l4..]));
    f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

/// A frame from the wire cut anywhere (a hostile sender's truncated TCP header included) is
/// parsed without a panic and passes unmerged.
#[test]
fn a_frame_cut_anywhere_passes_without_a_panic() {
    for v4 in [true, false] {
        let full = wire(v4, 1448, 1448, 40000, 1).remove(0);
        for n in 0..full.len() {
            let frames = vec![full[..n].to_vec(), full.clone()];
            let (out, _) = run(&frames);
            assert!(matches!(out[0], Out::Pass(0)), "v4 {v4}: a frame cut at {n} bytes was merged");
        }
    }
}
