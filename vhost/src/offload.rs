//! Guest -> wire offloads: the `virtio_net_hdr` of a TX chain asking for a checksum
//! (`NEEDS_CSUM`) or segmentation (`gso_type` TCPV4 / TCPV6 / UDP_L4, optionally with the ECN
//! bit), validated against the frame it describes and then executed: a segmentation request
//! leaves whole as ONE GSO packet through the queue's GSO socket when the agent handed one
//! (`pkt_gso.rs`: the kernel segments it after the agent's BPF programs saw one packet, with
//! the VM's identity, like a pod's TSO traffic), else it is cut here, in software, into
//! ordinary MTU-sized AF_XDP frames with their checksums.
//!
//! Nothing in the header is trusted: the L2/L3/L4 headers are parsed from the frame itself, the
//! header's `csum_start` / `csum_offset` must point at that L4 checksum, `gso_size` must be
//! non-zero and produce segments that fit the MTU, at most [`MAX_SEGS`] of them, and the GSO type
//! must match the frame's family and protocol. Anything else is an [`OffloadError`] (the chain is
//! dropped and counted as `bad_offload`). The guest's `hdr_len` is only a hint (a Linux guest
//! puts its linear length there), so it is only checked to lie inside the frame.

use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// `VIRTIO_NET_F_HOST_USO` (56): the device takes UDP segmentation offload.
pub const VIRTIO_NET_F_HOST_USO: u32 = 56;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`.
const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
pub const F_NEEDS_CSUM: u8 = 1;
/// Most frames one GSO chain may become (a 64 KiB segment cut at an MSS of 536 is 123).
pub const MAX_SEGS: usize = 128;
/// Largest frame (without virtio header) a TX chain may carry when segmentation is negotiated:
/// an IPv6 packet of 40 + 65,535 bytes behind an Ethernet header and a VLAN tag.
pub const MAX_GSO_FRAME: usize = 18 + 40 + 65_535;
/// The largest packet the kernel may hand the wire -> guest path (`pkt_rx.rs`): a BIG TCP GSO
/// packet (the agent gives a VM's device at most 192 KiB, `netdev.BIGTCPSize`), bounded here at
/// 256 KiB. It reaches a guest as several GSO packets of at most 64 KiB ([`Gso::write_chunk`]).
pub const MAX_KERNEL_FRAME: usize = 18 + 60 + 262_144;
/// Segments a kernel packet may describe: [`MAX_KERNEL_FRAME`] at an MSS of 536.
pub const MAX_KERNEL_SEGS: usize = 512;
/// The most an IP packet's length field can say (IPv4 total length, IPv6 payload length).
const MAX_IP_LEN: usize = 65_535;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Guest -> wire offloads, one flag per virtio feature (offered, or negotiated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offloads {
    /// `VIRTIO_NET_F_CSUM`: the guest may leave checksums to us.
    pub csum: bool,
    /// `VIRTIO_NET_F_HOST_TSO4`.
    pub tso4: bool,
    /// `VIRTIO_NET_F_HOST_TSO6`.
    pub tso6: bool,
    /// `VIRTIO_NET_F_HOST_ECN`: TSO segments may carry the ECN bit (CWR on the first segment).
    pub ecn: bool,
    /// `VIRTIO_NET_F_HOST_USO`: UDP segmentation.
    pub uso: bool,
    /// `VIRTIO_NET_F_GUEST_CSUM` (wire -> guest): frames whose TCP/UDP checksum the backend
    /// verified are marked `DATA_VALID`, so the guest does not check them again.
    pub guest_csum: bool,
    /// `VIRTIO_NET_F_GUEST_TSO4` (wire -> guest, needs `guest_csum`): consecutive TCP/IPv4
    /// frames of one flow taken from the port in one batch reach the guest as one segment
    /// (`gro.rs`). `GUEST_ECN` is not offered: frames with CWR or ECE are never merged.
    pub guest_tso4: bool,
    /// `VIRTIO_NET_F_GUEST_TSO6`: the same for TCP/IPv6.
    pub guest_tso6: bool,
}

impl Offloads {
    /// No offload.
    pub const NONE: Offloads = Offloads {
        csum: false,
        tso4: false,
        tso6: false,
        ecn: false,
        uso: false,
        guest_csum: false,
        guest_tso4: false,
        guest_tso6: false,
    };
    /// Every offload this backend implements.
    pub const ALL: Offloads = Offloads {
        csum: true,
        tso4: true,
        tso6: true,
        ecn: true,
        uso: true,
        guest_csum: true,
        guest_tso4: true,
        guest_tso6: true,
    };
    /// Names accepted by [`Offloads::without`] (`--no-offload`; `guest_tso` is both families).
    pub const NAMES: [&'static str; 9] =
        ["csum", "tso4", "tso6", "ecn", "uso", "guest_csum", "guest_tso4", "guest_tso6", "guest_tso"];

    /// These offloads minus the named one (`csum` and `guest_csum` also remove everything that
    /// needs them).
    pub fn without(mut self, name: &str) -> Result<Self, String> {
        match name {
            "csum" => {
                self = Offloads {
                    guest_csum: self.guest_csum,
                    guest_tso4: self.guest_tso4,
                    guest_tso6: self.guest_tso6,
                    ..Offloads::NONE
                }
            }
            "guest_csum" => (self.guest_csum, self.guest_tso4, self.guest_tso6) = (false, false, false),
            "guest_tso4" => self.guest_tso4 = false,
            "guest_tso6" => self.guest_tso6 = false,
            "guest_tso" => (self.guest_tso4, self.guest_tso6) = (false, false),
            "tso4" => self.tso4 = false,
            "tso6" => self.tso6 = false,
            "ecn" => self.ecn = false,
            "uso" => self.uso = false,
            _ => return Err(format!("unknown offload {name:?} (known: {})", Self::NAMES.join(", "))),
        }
        Ok(self)
    }

    /// The virtio feature bits (the spec makes every segmentation feature depend on CSUM, ECN
    /// on TSO, and the guest's TSO on GUEST_CSUM).
    pub fn features(self) -> u64 {
        let bit = |on: bool, b: u32| if on { 1u64 << b } else { 0 };
        let g = self.guest_csum;
        let rx = bit(g, VIRTIO_NET_F_GUEST_CSUM)
            | bit(g && self.guest_tso4, VIRTIO_NET_F_GUEST_TSO4)
            | bit(g && self.guest_tso6, VIRTIO_NET_F_GUEST_TSO6);
        if !self.csum {
            return rx;
        }
        rx | bit(true, VIRTIO_NET_F_CSUM)
            | bit(self.tso4, VIRTIO_NET_F_HOST_TSO4)
            | bit(self.tso6, VIRTIO_NET_F_HOST_TSO6)
            | bit(self.ecn && (self.tso4 || self.tso6), VIRTIO_NET_F_HOST_ECN)
            | bit(self.uso, VIRTIO_NET_F_HOST_USO)
    }

    /// The offloads a set of (acked) feature bits grants.
    pub fn from_features(f: u64) -> Self {
        let has = |b: u32| f & (1 << b) != 0;
        Offloads {
            csum: has(VIRTIO_NET_F_CSUM),
            tso4: has(VIRTIO_NET_F_HOST_TSO4),
            tso6: has(VIRTIO_NET_F_HOST_TSO6),
            ecn: has(VIRTIO_NET_F_HOST_ECN),
            uso: has(VIRTIO_NET_F_HOST_USO),
            guest_csum: has(VIRTIO_NET_F_GUEST_CSUM),
            guest_tso4: has(VIRTIO_NET_F_GUEST_TSO4),
            guest_tso6: has(VIRTIO_NET_F_GUEST_TSO6),
        }
    }

    /// Wire -> guest coalescing is on: GUEST_CSUM and a GUEST_TSO negotiated.
    pub fn guest_tso(self) -> bool {
        self.guest_csum && (self.guest_tso4 || self.guest_tso6)
    }

    /// Any segmentation offload: TX chains may be up to [`MAX_GSO_FRAME`].
    pub fn gso(self) -> bool {
        self.tso4 || self.tso6 || self.uso
    }
}

/// Why an offload request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// A flag or GSO type the guest did not negotiate (or that does not exist).
    #[error("offload not negotiated (flags {flags:#x}, gso_type {gso_type:#x})")]
    NotNegotiated {
        /// `flags` of the header.
        flags: u8,
        /// `gso_type` of the header.
        gso_type: u8,
    },
    /// `csum_start` / `csum_offset` outside the frame, or not at the L4 checksum of a GSO frame.
    #[error("checksum at {start}+{offset} does not fit a {len}-byte frame's L4 header")]
    Csum {
        /// `csum_start`.
        start: usize,
        /// `csum_offset`.
        offset: usize,
        /// Frame length.
        len: usize,
    },
    /// `hdr_len` past the end of the frame.
    #[error("hdr_len {0} is past the end of the frame")]
    HdrLen(usize),
    /// `gso_size` zero, or segments that would not fit the MTU or exceed [`MAX_SEGS`].
    #[error("gso_size {gso_size} for {payload} payload bytes (segments of at most {max} bytes)")]
    GsoSize {
        /// `gso_size`.
        gso_size: usize,
        /// Payload bytes to cut.
        payload: usize,
        /// Largest payload a segment may carry.
        max: usize,
    },
    /// The frame is not what the GSO type says (family, protocol, fragment, headers).
    #[error("GSO type {0:#x} does not match the frame: {1}")]
    Mismatch(u8, &'static str),
    /// A GSO request without `NEEDS_CSUM` (the spec requires it).
    #[error("GSO without NEEDS_CSUM")]
    GsoWithoutCsum,
}

/// The guest's `virtio_net_hdr` (first 10 bytes, little endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxHdr {
    /// `flags`.
    pub flags: u8,
    /// `gso_type`.
    pub gso_type: u8,
    /// `hdr_len`.
    pub hdr_len: u16,
    /// `gso_size`.
    pub gso_size: u16,
    /// `csum_start`.
    pub csum_start: u16,
    /// `csum_offset`.
    pub csum_offset: u16,
}

impl TxHdr {
    /// Parse the first 10 bytes (shorter input reads as zeroes).
    pub fn parse(b: &[u8]) -> Self {
        let mut h = [0u8; 10];
        let n = b.len().min(10);
        h[..n].copy_from_slice(&b[..n]);
        let w = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        TxHdr { flags: h[0], gso_type: h[1], hdr_len: w(2), gso_size: w(4), csum_start: w(6), csum_offset: w(8) }
    }

    /// Serialize (tests and fuzzers).
    pub fn bytes(&self) -> [u8; 10] {
        let mut b = [0u8; 10];
        b[0] = self.flags;
        b[1] = self.gso_type;
        for (i, v) in [self.hdr_len, self.gso_size, self.csum_start, self.csum_offset].into_iter().enumerate() {
            b[2 + 2 * i..4 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Nothing requested: the frame goes out as it is.
    pub fn is_plain(&self) -> bool {
        self.flags & F_NEEDS_CSUM == 0 && self.gso_type == VIRTIO_NET_HDR_GSO_NONE as u8
    }

    /// A segmentation request.
    pub fn is_gso(&self) -> bool {
        self.gso_type != VIRTIO_NET_HDR_GSO_NONE as u8
    }
}

/// What one TX chain becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Sent as it is (no request, or only a checksum to fill at `start` + `offset`).
    Single {
        /// Where to fill a checksum, if requested: (`csum_start`, `csum_offset`).
        csum: Option<(usize, usize)>,
    },
    /// Cut into `segs` frames.
    Gso(Gso),
}

/// A validated segmentation of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gso {
    l3: usize,
    l4: usize,
    /// Length of every header (L2 + L3 + L4) copied in front of each segment.
    hdrs: usize,
    mss: usize,
    /// Frames this one becomes.
    pub segs: usize,
    v4: bool,
    tcp: bool,
    /// The request carried `VIRTIO_NET_HDR_GSO_ECN` (negotiated): CWR on the first segment only.
    ecn: bool,
}

impl Gso {
    /// Length of segment `i` of a `frame_len`-byte frame.
    pub fn seg_len(&self, i: usize, frame_len: usize) -> usize {
        let start = self.hdrs + i * self.mss;
        self.hdrs + frame_len.saturating_sub(start).min(self.mss)
    }

    /// Hand the whole frame to the kernel instead of cutting it here (`pkt_gso.rs`): rewrite,
    /// on the backend's own copy, every field the kernel's segmentation derives the segments
    /// from (IPv4 total length and header checksum, IPv6 payload length, UDP length, and the L4
    /// checksum field = the pseudo-header sum, as a `NEEDS_CSUM` sender leaves it), and return
    /// the `virtio_net_hdr` built from this validated plan, never the guest's. None when the
    /// frame is one segment (nothing to cut) or does not fit one IP packet.
    pub fn kernel_hdr(&self, frame: &mut [u8]) -> Option<[u8; 10]> {
        let (n, l3, l4) = (frame.len(), self.l3, self.l4);
        if self.segs < 2 || n < self.hdrs {
            return None;
        }
        let put = |o: &mut [u8], at: usize, v: u16| o[at..at + 2].copy_from_slice(&v.to_be_bytes());
        put(frame, if self.v4 { l3 + 2 } else { l3 + 4 }, u16::try_from(self.ip_len(n)).ok()?);
        if self.v4 {
            put(frame, l3 + 10, 0);
            let c = !csum_fold(csum_add(0, &frame[l3..l4]));
            put(frame, l3 + 10, c);
        }
        let (proto, at) = if self.tcp { (IPPROTO_TCP, l4 + 16) } else { (IPPROTO_UDP, l4 + 6) };
        if !self.tcp {
            // A UDP length field cannot say more than 65,535 (the kernel rewrites it per segment).
            put(frame, l4 + 4, u16::try_from(n - l4).unwrap_or(0));
        }
        put(frame, at, csum_fold(pseudo(frame, self, n - l4, proto)));
        Some(self.gso_hdr().bytes())
    }

    /// The `virtio_net_hdr` of this plan's GSO packet: `NEEDS_CSUM` at the L4 checksum, its GSO
    /// type (with ECN as requested), `hdr_len` and `gso_size`.
    fn gso_hdr(&self) -> TxHdr {
        let gso_type = match (self.tcp, self.v4) {
            (true, true) => VIRTIO_NET_HDR_GSO_TCPV4 as u8,
            (true, false) => VIRTIO_NET_HDR_GSO_TCPV6 as u8,
            (false, _) => GSO_UDP_L4,
        } | if self.ecn { VIRTIO_NET_HDR_GSO_ECN as u8 } else { 0 };
        TxHdr {
            flags: F_NEEDS_CSUM,
            gso_type,
            hdr_len: self.hdrs as u16,
            gso_size: self.mss as u16,
            csum_start: self.l4 as u16,
            csum_offset: if self.tcp { 16 } else { 6 },
        }
    }

    /// What the IP length field (IPv4 total length, IPv6 payload length) of a `frame_len`-byte
    /// frame with this plan's headers says.
    fn ip_len(&self, frame_len: usize) -> usize {
        frame_len - self.l3 - if self.v4 { 0 } else { 40 }
    }

    /// Whether the frame is more than one IP packet can carry (a BIG TCP packet), so that it
    /// reaches a guest only as chunks ([`Gso::write_chunk`]).
    pub fn needs_chunks(&self, frame_len: usize) -> bool {
        self.ip_len(frame_len) > MAX_IP_LEN
    }

    /// Segments in one chunk: as many as one IP packet (64 KiB) holds.
    pub fn chunk_segs(&self) -> usize {
        (MAX_IP_LEN.saturating_sub(self.ip_len(self.hdrs)) / self.mss).max(1)
    }

    /// Write the chunk of segments `first .. first + count` of a TCP frame into `out` as one
    /// packet a TSO guest takes: the first segment's headers with the IP length (IPv4: also id
    /// and header checksum), sequence number and flags of the range (FIN/PSH only if it ends the
    /// frame, CWR only if it starts it), and the TCP checksum field holding the pseudo-header sum,
    /// with the `virtio_net_hdr` that says so (`NEEDS_CSUM`, and the GSO type and `gso_size` when
    /// the chunk is more than one segment). None when `out` is too small, the range is empty or
    /// the chunk would not fit one IP packet.
    pub fn write_chunk(&self, frame: &[u8], first: usize, count: usize, out: &mut [u8]) -> Option<(usize, TxHdr)> {
        if !self.tcp || count == 0 || first >= self.segs || count > self.chunk_segs() {
            return None;
        }
        let count = count.min(self.segs - first);
        let n = segments(frame, self, first, count, out, true)?;
        let h = self.gso_hdr();
        // One segment: a plain NEEDS_CSUM packet.
        let h = if count < 2 { TxHdr { gso_type: 0, hdr_len: 0, gso_size: 0, ..h } } else { h };
        Some((n, h))
    }
}

/// Check `h` against `frame` and the negotiated offloads; `max_frame` bounds each resulting
/// frame. Only the frame's first bytes (headers) are read.
pub fn plan(h: &TxHdr, frame: &[u8], off: Offloads, max_frame: usize) -> Result<Plan, OffloadError> {
    plan_segs(h, frame, off, max_frame, MAX_SEGS)
}

/// [`plan`] for a packet the kernel hands (`--rx-gso kernel`): the same checks, but up to
/// [`MAX_KERNEL_SEGS`] segments, since a BIG TCP packet may carry more than a guest's TX chain.
/// An IPv4 BIG TCP packet's total length is 0 (it cannot say more than 64 KiB); no length field
/// is trusted here: every frame written from the plan gets its own.
pub fn plan_kernel(h: &TxHdr, frame: &[u8], off: Offloads) -> Result<Plan, OffloadError> {
    plan_segs(h, frame, off, MAX_GSO_FRAME, MAX_KERNEL_SEGS)
}

fn plan_segs(h: &TxHdr, frame: &[u8], off: Offloads, max_frame: usize, max_segs: usize) -> Result<Plan, OffloadError> {
    if h.is_plain() {
        return Ok(Plan::Single { csum: None });
    }
    let (flags, gso_type) = (h.flags, h.gso_type);
    let refuse = OffloadError::NotNegotiated { flags, gso_type };
    let (len, start, offset) = (frame.len(), usize::from(h.csum_start), usize::from(h.csum_offset));
    let needs_csum = flags & F_NEEDS_CSUM != 0;
    if flags & !F_NEEDS_CSUM != 0 || (needs_csum && !off.csum) {
        return Err(refuse);
    }
    // The checksum field (2 bytes) must lie in the frame, and what it covers must too.
    if needs_csum && (start >= len || start.saturating_add(offset).saturating_add(2) > len) {
        return Err(OffloadError::Csum { start, offset, len });
    }
    if usize::from(h.hdr_len) > len {
        return Err(OffloadError::HdrLen(usize::from(h.hdr_len)));
    }
    if !h.is_gso() {
        return Ok(Plan::Single { csum: Some((start, offset)) });
    }
    let ecn = gso_type & VIRTIO_NET_HDR_GSO_ECN as u8 != 0;
    let (v4, tcp) = match gso_type & !(VIRTIO_NET_HDR_GSO_ECN as u8) {
        t if t == VIRTIO_NET_HDR_GSO_TCPV4 as u8 && off.tso4 => (true, true),
        t if t == VIRTIO_NET_HDR_GSO_TCPV6 as u8 && off.tso6 => (false, true),
        GSO_UDP_L4 if off.uso && !ecn => (frame_is_v4(frame), false),
        _ => return Err(refuse),
    };
    if ecn && !off.ecn {
        return Err(refuse);
    }
    if !needs_csum {
        return Err(OffloadError::GsoWithoutCsum);
    }
    let mismatch = |why| OffloadError::Mismatch(gso_type, why);
    let (l3, proto) = l3_of(frame, v4).map_err(mismatch)?;
    let l4 = l3 + l3_len(frame, l3, v4).map_err(mismatch)?;
    if proto != if tcp { IPPROTO_TCP } else { IPPROTO_UDP } {
        return Err(mismatch("L4 protocol"));
    }
    let l4len = if tcp {
        let doff = usize::from(frame.get(l4 + 12).ok_or(mismatch("truncated TCP header"))? >> 4) * 4;
        if doff < 20 {
            return Err(mismatch("TCP data offset below 5"));
        }
        doff
    } else {
        8
    };
    let hdrs = l4 + l4len;
    if hdrs > len {
        return Err(mismatch("truncated L4 header"));
    }
    if start != l4 || offset != if tcp { 16 } else { 6 } {
        return Err(OffloadError::Csum { start, offset, len });
    }
    let (mss, payload) = (usize::from(h.gso_size), len - hdrs);
    let max = max_frame.saturating_sub(hdrs);
    let segs = payload.div_ceil(mss.max(1)).max(1);
    if mss == 0 || mss > max || segs > max_segs {
        return Err(OffloadError::GsoSize { gso_size: mss, payload, max });
    }
    Ok(Plan::Gso(Gso { l3, l4, hdrs, mss, segs, v4, tcp, ecn }))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn frame_is_v4(frame: &[u8]) -> bool {
    l3_of(frame, true).is_ok()
}

/// Offset of the L3 header (after one optional VLAN tag) and its protocol / next header,
/// checking the EtherType and IP version against the family.
fn l3_of(frame: &[u8], v4: bool) -> Result<(usize, u8), &'static str> {
    let mut l3 = 14;
    let mut et = be16(frame, 12).ok_or("truncated Ethernet header")?;
    if et == ETH_P_8021Q {
        et = be16(frame, 16).ok_or("truncated VLAN tag")?;
        l3 = 18;
    }
    let version = frame.get(l3).ok_or("truncated IP header")? >> 4;
    match (v4, et, version) {
        (true, ETH_P_IP, 4) => Ok((l3, *frame.get(l3 + 9).ok_or("truncated IPv4 header")?)),
        (false, ETH_P_IPV6, 6) => Ok((l3, *frame.get(l3 + 6).ok_or("truncated IPv6 header")?)),
        _ => Err("EtherType or IP version is not the GSO type's family"),
    }
}

/// Length of the IP header at `l3`: IPv4 options allowed, fragments not; IPv6 without
/// extension headers (the next header must be the L4 protocol itself).
fn l3_len(frame: &[u8], l3: usize, v4: bool) -> Result<usize, &'static str> {
    if !v4 {
        return if frame.len() >= l3 + 40 { Ok(40) } else { Err("truncated IPv6 header") };
    }
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    let frag = be16(frame, l3 + 6).ok_or("truncated IPv4 header")?;
    if ihl < 20 || frame.len() < l3 + ihl {
        return Err("bad IPv4 header length");
    }
    if frag & 0x3fff != 0 {
        return Err("IPv4 fragment");
    }
    Ok(ihl)
}

/// Ones' complement sum of `b` (big-endian 16-bit words) added to `sum`.
pub fn csum_add(mut sum: u64, b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Fold a sum to 16 bits (not complemented).
pub fn csum_fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// `NEEDS_CSUM`: the checksum of `frame[start..]` (which already holds the guest's
/// pseudo-header sum at `start + offset`) stored at `start + offset`. A zero result is written
/// as 0xffff (the same in ones' complement, and "no checksum" must not appear for UDP). The
/// bounds were checked by [`plan`].
pub fn fill_csum(frame: &mut [u8], start: usize, offset: usize) {
    let at = start + offset;
    let c = !csum_fold(csum_add(0, &frame[start..]));
    let c = if c == 0 { 0xffff } else { c };
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// A `NEEDS_CSUM` request (`start`, `offset`, inside the frame: checked by [`plan`]) that is
/// exactly the frame's TCP or UDP checksum (IPv4 not a fragment, IPv6 without extension
/// header). Only such a request may be left to the kernel: it computes the sum after the
/// agent's BPF programs have looked at the frame, so a request aimed anywhere else (an
/// address, a port) would rewrite bytes the policy already accepted. Anything else is
/// computed by the backend before the frame leaves.
pub fn l4_csum_at(frame: &[u8], start: usize, offset: usize) -> bool {
    let v4 = frame_is_v4(frame);
    let Ok((l3, proto)) = l3_of(frame, v4) else { return false };
    let Ok(ihl) = l3_len(frame, l3, v4) else { return false };
    let want = match proto {
        IPPROTO_TCP => 16,
        IPPROTO_UDP => 6,
        _ => return false,
    };
    start == l3 + ihl && offset == want && start + offset + 2 <= frame.len()
}

/// Wire -> guest: the frame is TCP or UDP over IPv4 (not a fragment) or IPv6 (no extension
/// header) and its L4 checksum is right (an IPv4 UDP checksum of 0, "none", counts as right).
/// Only such frames are marked `DATA_VALID` for the guest; anything else is left for the guest
/// to check. Ethernet padding after the IP packet is not summed.
pub fn rx_csum_ok(frame: &[u8]) -> bool {
    let v4 = frame_is_v4(frame);
    let Ok((l3, proto)) = l3_of(frame, v4) else { return false };
    let Ok(ihl) = l3_len(frame, l3, v4) else { return false };
    let ip_len =
        if v4 { be16(frame, l3 + 2).map(usize::from) } else { be16(frame, l3 + 4).map(|p| usize::from(p) + 40) };
    let Some(end) = ip_len.map(|n| l3 + n).filter(|&e| e <= frame.len() && e >= l3 + ihl) else { return false };
    let (l4, tcp) = (l3 + ihl, proto == IPPROTO_TCP);
    if !tcp && proto != IPPROTO_UDP || end - l4 < if tcp { 20 } else { 8 } {
        return false;
    }
    if !tcp && v4 && frame[l4 + 6..l4 + 8] == [0, 0] {
        return true;
    }
    let g = Gso { l3, l4, hdrs: 0, mss: 0, segs: 0, v4, tcp, ecn: false };
    csum_fold(pseudo(frame, &g, end - l4, proto) + csum_add(0, &frame[l4..end])) == 0xffff
}

/// Sum of the pseudo header of the L4 segment at `l4` of `len` bytes.
fn pseudo(frame: &[u8], g: &Gso, len: usize, proto: u8) -> u64 {
    let addrs = if g.v4 { &frame[g.l3 + 12..g.l3 + 20] } else { &frame[g.l3 + 8..g.l3 + 40] };
    csum_add(0, addrs) + len as u64 + u64::from(proto)
}

/// Write segment `i` of `frame` (as planned by `g`) into `out`; returns its length, or None
/// when `out` is too small. Headers are copied and fixed (IPv4 total length, id + i and header
/// checksum; IPv6 payload length; TCP sequence number, FIN/PSH only on the last segment, CWR
/// only on the first; UDP length) and the L4 checksum is computed over the segment.
pub fn write_segment(frame: &[u8], g: &Gso, i: usize, out: &mut [u8]) -> Option<usize> {
    segment(frame, g, i, out, false)
}

/// [`write_segment`] leaving the L4 checksum to whoever sends the segment: the checksum field
/// holds the pseudo-header sum (as a guest's `NEEDS_CSUM` frame does) and the returned
/// (`csum_start`, `csum_offset`) say where the sum starts and goes.
pub fn write_segment_partial(frame: &[u8], g: &Gso, i: usize, out: &mut [u8]) -> Option<(usize, (u16, u16))> {
    let n = segment(frame, g, i, out, true)?;
    Some((n, (g.l4 as u16, if g.tcp { 16 } else { 6 })))
}

fn segment(frame: &[u8], g: &Gso, i: usize, out: &mut [u8], partial: bool) -> Option<usize> {
    segments(frame, g, i, 1, out, partial)
}

/// Write segments `i .. i + count` of `frame` as one frame (one segment: [`write_segment`]):
/// the headers of the first, fixed for the range, and the payload of all of them.
fn segments(frame: &[u8], g: &Gso, i: usize, count: usize, out: &mut [u8], partial: bool) -> Option<usize> {
    let start = g.hdrs + i * g.mss;
    let n = g.hdrs + frame.len().checked_sub(start)?.min(count * g.mss);
    let out = out.get_mut(..n)?;
    out[..g.hdrs].copy_from_slice(frame.get(..g.hdrs)?);
    out[g.hdrs..].copy_from_slice(frame.get(start..start + n - g.hdrs)?);
    let (l3, l4) = (g.l3, g.l4);
    let put = |o: &mut [u8], at: usize, v: u16| o[at..at + 2].copy_from_slice(&v.to_be_bytes());
    if g.v4 {
        put(out, l3 + 2, g.ip_len(n) as u16);
        let id = u16::from_be_bytes([out[l3 + 4], out[l3 + 5]]).wrapping_add(i as u16);
        put(out, l3 + 4, id);
        put(out, l3 + 10, 0);
        let ihl = l4 - l3;
        let c = !csum_fold(csum_add(0, &out[l3..l3 + ihl]));
        put(out, l3 + 10, c);
    } else {
        put(out, l3 + 4, g.ip_len(n) as u16);
    }
    let seg_len = n - l4;
    let (proto, at) = if g.tcp {
        let seq = u32::from_be_bytes([out[l4 + 4], out[l4 + 5], out[l4 + 6], out[l4 + 7]]);
        out[l4 + 4..l4 + 8].copy_from_slice(&seq.wrapping_add((i * g.mss) as u32).to_be_bytes());
        if i + count < g.segs {
            out[l4 + 13] &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            out[l4 + 13] &= !TCP_CWR;
        }
        (IPPROTO_TCP, l4 + 16)
    } else {
        put(out, l4 + 4, seg_len as u16);
        (IPPROTO_UDP, l4 + 6)
    };
    if partial {
        put(out, at, csum_fold(pseudo(out, g, seg_len, proto)));
        return Some(n);
    }
    put(out, at, 0);
    let c = !csum_fold(pseudo(out, g, seg_len, proto) + csum_add(0, &out[l4..]));
    put(out, at, if c == 0 && !g.tcp { 0xffff } else { c });
    Some(n)
}

#[path = "gro.rs"]
pub mod gro;

#[cfg(test)]
#[path = "offload_tests.rs"]
mod tests;
