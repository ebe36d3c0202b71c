//! Wire -> guest through the kernel (`--rx-gso kernel`): an `AF_PACKET` socket with
//! `PACKET_VNET_HDR`, bound to the VM's device (`eth0` in its netns) for every protocol, receives
//! each skb whole: a 64 KiB GSO packet from a pod arrives as ONE packet with a `virtio_net_hdr`
//! (gso_type, gso_size, hdr_len, `NEEDS_CSUM` csum_start/offset or `DATA_VALID`) in front,
//! instead of ~45 frames cut by the host end and copied one by one through AF_XDP. The device then
//! runs no XDP program (so the veth keeps GSO); the agent joins the queues' sockets in one
//! `PACKET_FANOUT_QM` group (a frame lands on the socket of the rx queue the datapath chose) and
//! drops every frame at tcx ingress after the packet taps saw it, so the VM netns' own stack never
//! answers for the VM. What the kernel says is re-validated (`net_krx.rs`) before a guest sees it.
//!
//! The agent creates the socket (`CAP_NET_RAW`) and hands it over with the queue's AF_XDP socket
//! (handover protocol, `"rx_gso":true`); tests open one themselves ([`RxGsoSocket::open`]).
//!
//! Where a packet for the guest can die on this path ([`RxSocketCounters`], exported by
//! `metrics.rs`): the kernel drops it when the socket's receive queue is full (`SO_RCVBUF`, set
//! by the agent with `SO_RCVBUFFORCE`; counted by the kernel's `PACKET_STATISTICS` `tp_drops`),
//! which happens while the backend waits: when the guest has posted no RX buffers the backend
//! HOLDS the packet it has (`each`) and reads no further, so the queue fills. The backend drops
//! a packet larger than its buffer ([`RX_BUF`], cut by the kernel) and one whose header fails the
//! checks (`net_krx.rs`); a packet too big for the guest's buffers is cut into frames, not
//! dropped (a frame that fits no chain is dropped there as `no_room`).

use std::io;
use std::mem::{size_of, size_of_val, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::offload::TxHdr;
use crate::pkt_gso::{getsockopt_int, setsockopt_int};

const SOL_PACKET: libc::c_int = 263;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_STATISTICS: libc::c_int = 6;
const SO_MEMINFO: libc::c_int = 55;
const ETH_P_ALL: u16 = 0x0003;

/// The `virtio_net_hdr` in front of each received packet.
pub const VNET_HDR_LEN: usize = 10;
/// Room for one packet: a BIG TCP GSO packet of up to 256 KiB with its headers, and the header.
pub const RX_BUF: usize = VNET_HDR_LEN + crate::offload::MAX_KERNEL_FRAME;

/// The socket of an [`RxGsoSocket`] and its counters, shared between the worker that receives
/// on it and the metrics scrape (which reads the kernel's counters with [`Self::read`]). The
/// socket closes when both are gone, so a scrape never reads another socket's counters.
#[derive(Debug)]
pub struct RxSocketCounters {
    fd: OwnedFd,
    /// `tp_packets` summed over every read (the kernel resets its counters on each).
    packets: AtomicU64,
    /// `tp_drops` summed likewise.
    drops: AtomicU64,
    /// Packets larger than [`RX_BUF`] (cut by the kernel): dropped by the backend.
    truncated: AtomicU64,
}

/// What [`RxSocketCounters::read`] returns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RxSocketStats {
    /// Packets the kernel passed to the socket, the dropped ones included (`tp_packets`).
    pub packets: u64,
    /// Packets the kernel dropped because the receive queue was full (`tp_drops`). The kernel
    /// counts no bytes: each is one skb, up to 64 KiB of a GSO packet.
    pub drops: u64,
    /// Packets the backend dropped because they were larger than its buffer.
    pub truncated: u64,
    /// The receive queue's limit in bytes of skb truesize (`SO_RCVBUF`: twice what was set).
    pub rcvbuf: u64,
    /// Bytes (truesize) queued now, waiting for the backend (`SO_MEMINFO` rmem_alloc).
    pub queued: u64,
}

impl RxSocketCounters {
    /// Read the kernel's `PACKET_STATISTICS` (which resets them: each read's counts are added
    /// here, so concurrent readers never count a packet twice) and the buffer's state.
    pub fn read(&self) -> io::Result<RxSocketStats> {
        let fd = self.fd.as_raw_fd();
        let mut st = [0u32; 2]; // struct tpacket_stats { tp_packets, tp_drops }
        getsockopt_into(fd, SOL_PACKET, PACKET_STATISTICS, &mut st)?;
        let packets = self.packets.fetch_add(u64::from(st[0]), Ordering::Relaxed) + u64::from(st[0]);
        let drops = self.drops.fetch_add(u64::from(st[1]), Ordering::Relaxed) + u64::from(st[1]);
        let mut mem = [0u32; 9]; // SK_MEMINFO_RMEM_ALLOC .. SK_MEMINFO_DROPS
        getsockopt_into(fd, libc::SOL_SOCKET, SO_MEMINFO, &mut mem)?;
        Ok(RxSocketStats {
            packets,
            drops,
            truncated: self.truncated.load(Ordering::Relaxed),
            rcvbuf: u64::from(mem[libc::SK_MEMINFO_RCVBUF as usize]),
            queued: u64::from(mem[libc::SK_MEMINFO_RMEM_ALLOC as usize]),
        })
    }
}

/// `getsockopt` into an array of u32 (the kernel fills what it has, up to its length).
fn getsockopt_into(fd: RawFd, level: libc::c_int, name: libc::c_int, out: &mut [u32]) -> io::Result<()> {
    let mut len = size_of_val(out) as libc::socklen_t;
    // SAFETY: out and len are valid for writes of their sizes for the duration of the call.
    let r = unsafe { libc::getsockopt(fd, level, name, out.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// IPv6 BIG TCP: the kernel carries a TCP GSO packet above 64 KiB with a hop-by-hop header that
/// holds only the jumbo payload option (RFC 2675; payload length 0), and hands it so to a packet
/// socket. Remove it, in `pkt` (`virtio_net_hdr` + frame), so that the packet reads like any other
/// GSO packet (the IPv6 next header taken from it, its length left 0: every frame written from the
/// plan gets its own): the header and the Ethernet and IPv6 headers move 8 bytes on, and the
/// `virtio_net_hdr`'s `hdr_len` and `csum_start` 8 back. Returns where the packet now starts (8, or
/// 0 for a packet without that header: left as it is).
pub fn strip_jumbo(pkt: &mut [u8]) -> usize {
    const GSO_TCPV6: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_TCPV6 as u8;
    const L3: usize = VNET_HDR_LEN + 14;
    const HBH: usize = L3 + 40;
    let jumbo = pkt.len() > HBH + 8
        && pkt[1] & 0x7f == GSO_TCPV6
        && pkt[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14] == [0x86, 0xdd]
        && pkt[L3] >> 4 == 6
        && pkt[L3 + 6] == 0 // next header: hop-by-hop
        && pkt[HBH + 1] == 0 // 8 bytes
        && pkt[HBH + 2..HBH + 4] == [0xc2, 4]; // jumbo payload, 4 bytes
    if !jumbo {
        return 0;
    }
    pkt[L3 + 6] = pkt[HBH];
    pkt.copy_within(..HBH, 8);
    let h = &mut pkt[8..8 + VNET_HDR_LEN];
    for at in [2, 6] {
        let v = u16::from_le_bytes([h[at], h[at + 1]]).saturating_sub(8);
        h[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    8
}

/// An `AF_PACKET` socket that receives whole (GSO) packets behind a `virtio_net_hdr`.
#[derive(Debug)]
pub struct RxGsoSocket {
    sock: Arc<RxSocketCounters>,
    buf: Box<[u8]>,
    /// Where a packet received but not yet taken by the guest starts in `buf` and ends (header
    /// included).
    held: Option<(usize, usize)>,
    /// Packets received.
    pub received: u64,
}

impl RxGsoSocket {
    /// Take over a socket from the agent; it must be an `AF_PACKET` socket with `PACKET_VNET_HDR`
    /// on (checked: without it the first 10 bytes of every frame would be read as a header).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let dom = getsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN)?;
        if dom != libc::AF_PACKET {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("rx gso fd is not AF_PACKET (domain {dom})"),
            ));
        }
        if getsockopt_int(fd.as_raw_fd(), SOL_PACKET, PACKET_VNET_HDR)? != 1 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "rx gso socket without PACKET_VNET_HDR"));
        }
        let sock = Arc::new(RxSocketCounters {
            fd,
            packets: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
        });
        Ok(RxGsoSocket { sock, buf: vec![0u8; RX_BUF].into_boxed_slice(), held: None, received: 0 })
    }

    /// Open one on `ifindex` in the current network namespace (needs `CAP_NET_RAW`): every
    /// protocol, outgoing frames ignored, no fanout (tests; the agent makes the real ones).
    pub fn open(ifindex: u32) -> io::Result<Self> {
        // SAFETY: plain socket(2); the result is checked before being owned.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt_int(raw, SOL_PACKET, PACKET_VNET_HDR, 1)?;
        setsockopt_int(raw, SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
        // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETH_P_ALL.to_be();
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: sa is an initialised sockaddr_ll of the given size.
        let r = unsafe { libc::bind(raw, (&raw const sa).cast(), size_of::<libc::sockaddr_ll>() as libc::socklen_t) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        RxGsoSocket::from_fd(fd)
    }

    /// Hand up to `max` packets, in order, to `f` as (the kernel's header, the frame); `f` may
    /// rewrite the frame in place (it is the backend's copy). When `f` returns false the packet
    /// is kept and offered again first on the next call. Returns how many packets `f` took.
    /// Never blocks.
    pub fn each(&mut self, max: usize, f: &mut dyn FnMut(TxHdr, &mut [u8]) -> bool) -> io::Result<usize> {
        let mut took = 0;
        while took < max {
            let (at, n) = match self.held.take() {
                Some(p) => p,
                None => match self.recv_one()? {
                    Some(n) => (strip_jumbo(&mut self.buf[..n]), n),
                    None => break,
                },
            };
            let (hdr, frame) = self.buf[at..n].split_at_mut(VNET_HDR_LEN);
            if !f(TxHdr::parse(hdr), frame) {
                self.held = Some((at, n));
                break;
            }
            took += 1;
        }
        Ok(took)
    }

    /// Receive one packet into the buffer: its length with the header, None when nothing is
    /// pending. Truncated packets are dropped and counted.
    fn recv_one(&mut self) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: buf is valid for writes of its length for the duration of the call.
            let r = unsafe {
                libc::recv(
                    self.sock.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let n = r as usize;
            if n > self.buf.len() {
                self.sock.truncated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if n < VNET_HDR_LEN + 14 {
                continue; // the kernel never sends less; nothing a guest could use
            }
            self.received += 1;
            return Ok(Some(n));
        }
    }

    /// The socket (readable when packets are pending).
    pub fn fd(&self) -> RawFd {
        self.sock.fd.as_raw_fd()
    }

    /// The socket's counters, for the metrics scrape.
    pub fn counters(&self) -> Arc<RxSocketCounters> {
        Arc::clone(&self.sock)
    }
}
