//! Guest -> wire GSO by the kernel (`pkt_gso.rs`) through the real queue code: a validated TSO
//! chain leaves as ONE GSO send whose header and headers the backend rebuilt (never the
//! guest's), after the frames before it; a lying header is still dropped; a refused send is cut
//! here instead.

use super::*;
use crate::fuzzing::{gso_hdr, l4_check, packet};
use crate::offload::{plan, write_segment, Plan, TxHdr};

const OFF: NetMode = NetMode { offloads: Offloads::ALL, ..MODE };

/// A lending [`TestPort`] with a GSO socket: records each GSO send and how many frames the
/// port had sent before it; `refuse` makes every GSO send fail (a full send buffer).
struct GsoPort {
    inner: TestPort,
    gso: Vec<([u8; 10], Vec<u8>, usize)>,
    refuse: bool,
}

impl Port for GsoPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        self.inner.recv(batch, max)
    }
    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        self.inner.send(batch)
    }
    fn tx_reserve(&mut self, n: usize) -> usize {
        self.inner.tx_reserve(n)
    }
    fn tx_buf(&mut self, i: usize) -> &mut [u8] {
        self.inner.tx_buf(i)
    }
    fn tx_commit(&mut self, frames: &[TxFrame]) -> io::Result<usize> {
        self.inner.tx_commit(frames)
    }
    fn gso_capable(&self) -> bool {
        true
    }
    fn send_gso(&mut self, hdr: &[u8; 10], frame: &[u8]) -> io::Result<()> {
        if self.refuse {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        self.gso.push((*hdr, frame.to_vec(), self.inner.sent.len()));
        Ok(())
    }
    fn fd(&self) -> RawFd {
        -1
    }
    fn describe(&self) -> String {
        "gso test port".into()
    }
}

fn hdr12(h: TxHdr) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..10].copy_from_slice(&h.bytes());
    b
}

/// The MSS-sized frames `frame` becomes when cut as `h` says (what the kernel's segmentation
/// of a correct GSO packet yields).
fn cut(h: &TxHdr, frame: &[u8]) -> Vec<Vec<u8>> {
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

fn run(m: &GuestMemoryMmap, chains: &[Vec<(u64, u32, bool)>], refuse: bool) -> (GsoPort, Stats) {
    let vq = MockSplitQueue::new(m, 64);
    add_chains(&vq, 0, chains);
    let mut q: Queue = vq.create_queue().unwrap();
    let mut port = GsoPort { inner: TestPort::new(), gso: Vec::new(), refuse };
    port.inner.lend = Some(2048);
    let (mut st, stats) = (TxState::default(), Stats::default());
    let n = tx_queue(&mut q, m, &mut port, &mut st, OFF, &stats, 64).handled;
    assert_eq!(n, chains.len());
    (port, stats)
}

#[test]
fn tx_gso_chain_leaves_whole_with_the_header_the_backend_rebuilt() {
    for (v4, gso_type, mss) in [(true, 1u8, 1448u16), (false, 4, 1428)] {
        let m = mem();
        let big = packet(v4, true, 60_000, 0x18);
        let h = gso_hdr(&big, gso_type, mss);
        // The guest lies where the kernel would believe it: its checksum field, its IP length
        // and its hdr_len (inside the frame, so the plan takes it as a hint).
        let mut lying = big.clone();
        let (len_at, l4) = if v4 { (16, 34) } else { (18, 54) };
        lying[len_at..len_at + 2].copy_from_slice(&[0x01, 0x00]);
        lying[l4 + 16..l4 + 18].copy_from_slice(&[0xde, 0xad]);
        let lying_hdr = TxHdr { hdr_len: 20, ..h };
        let small = packet(v4, true, 10, 0x18);
        let chains = vec![
            tx_descs(&m, BUF_BASE, [0; 12], &small, 64),
            tx_descs(&m, BUF_BASE + 0x10000, hdr12(lying_hdr), &lying, 16384),
        ];
        let (port, stats) = run(&m, &chains, false);
        assert_eq!(port.gso.len(), 1, "v4 {v4}: one GSO send");
        let (hdr, frame, before) = &port.gso[0];
        assert_eq!(*before, 1, "the frame queued before the GSO chain left first");
        let want = TxHdr {
            flags: 1,
            gso_type,
            hdr_len: (l4 + 32) as u16,
            gso_size: mss,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        assert_eq!(TxHdr::parse(hdr), want, "v4 {v4}: the header comes from the parsed frame");
        // What the kernel cuts from it is exactly what the guest's frame, told the truth, is.
        assert!(cut(&want, frame) == cut(&h, &big), "v4 {v4}: kernel segments differ");
        // The guest's lies are gone: lengths and the pseudo-header sum are the parsed frame's.
        assert!(*frame == big, "v4 {v4}: the frame handed to the kernel is not the rebuilt one");
        for s in cut(&want, frame) {
            assert_eq!(l4_check(&s, v4), 0);
        }
        assert_eq!(port.inner.sent, vec![small.clone()]);
        let s = stats.snapshot();
        assert_eq!((s.tx_gso, s.tx_gso_kernel, s.tx_gso_fallback, s.tx_frames, s.errors), (1, 1, 0, 2, 0));
        assert_eq!(s.tx_bytes, (small.len() + big.len()) as u64);
    }
}

#[test]
fn tx_gso_lying_headers_never_reach_the_kernel() {
    let m = mem();
    let big = packet(true, true, 20_000, 0x18);
    let good = gso_hdr(&big, 1, 1448);
    let udp = packet(true, false, 20_000, 0);
    let chains = vec![
        tx_descs(&m, BUF_BASE, hdr12(TxHdr { gso_size: 0, ..good }), &big, 16384),
        tx_descs(&m, BUF_BASE + 0x10000, hdr12(TxHdr { csum_start: 30, ..good }), &big, 16384),
        tx_descs(&m, BUF_BASE + 0x20000, hdr12(TxHdr { gso_type: 4, ..good }), &big, 16384),
        tx_descs(&m, BUF_BASE + 0x30000, hdr12(good), &udp, 16384),
        tx_descs(&m, BUF_BASE + 0x40000, hdr12(TxHdr { gso_size: 100, ..good }), &big, 16384),
    ];
    let (port, stats) = run(&m, &chains, false);
    assert!(port.gso.is_empty() && port.inner.sent.is_empty(), "nothing of a lying chain leaves");
    let s = stats.snapshot();
    assert_eq!((s.errors, s.tx_gso_kernel), (5, 0));
}

#[test]
fn tx_gso_refused_by_the_kernel_is_cut_here() {
    let m = mem();
    let big = packet(true, true, 20_000, 0x18);
    let h = gso_hdr(&big, 1, 1448);
    let chains = vec![tx_descs(&m, BUF_BASE, hdr12(h), &big, 4096)];
    let (port, stats) = run(&m, &chains, true);
    assert!(port.gso.is_empty());
    assert!(port.inner.sent == cut(&h, &big), "the fallback sends the MSS-sized frames");
    let s = stats.snapshot();
    assert_eq!((s.tx_gso, s.tx_gso_kernel, s.tx_gso_fallback), (1, 0, 1));
    assert_eq!(s.tx_frames, cut(&h, &big).len() as u64);
}
