//! AF_XDP port: a thin layer over libc, for sockets we create or that the agent hands us.
//!
//! # Socket handover protocol (agent -> backend)
//!
//! The agent (`lanekitd`) creates, configures and binds the AF_XDP sockets and passes them to an
//! unprivileged backend over a unix socket. Exactly:
//!
//! 1. The agent listens on a unix socket of type `SOCK_SEQPACKET` (`--xsk-socket PATH`).
//! 2. The backend connects and sends ONE message, a UTF-8 JSON object without trailing newline:
//!    `{"version":1,"vm":"<name>","rss":true,"tx_meta":true,"tx_gso":true}` (`<name>` from
//!    `--vm`; `"rss":true`: the backend takes the VM's RSS map, see step 3; `"tx_meta":true`: it
//!    writes AF_XDP TX metadata, see step 4; `"tx_gso":true` (unless `--tx-gso software`): it
//!    takes a GSO socket per queue, see step 3; agents that do not know a field ignore it).
//! 3. The agent replies with ONE message whose body is a UTF-8 JSON object
//!    `{"version":1,"queues":[{"queue":0,"umem_size":N,"frame_size":2048,"frame_count":N,`
//!    `"fill_size":2048,"comp_size":2048,"rx_size":2048,"tx_size":2048}, ...]}`
//!    with one entry per queue pair, `queue` = 0, 1, ... in order, and an `SCM_RIGHTS` control
//!    message carrying `2 * queues` fds ordered `[xsk0, umem0, xsk1, umem1, ...]`.
//!    On failure the agent replies `{"version":1,"error":"<text>"}` without fds.
//!    When the request says `"rss":true` and the agent has one, it also hands the VM's RSS
//!    configuration map (a one-entry
//!    `BPF_F_MMAPABLE` array, value `struct lk_vm_rss_cfg`, see `rss.rs`), the body has
//!    `"rss":{"value_size":312}` and that map's fd comes last: `2 * queues + 1` fds. The backend
//!    then offers VIRTIO_NET_F_RSS and VIRTIO_NET_F_HASH_REPORT.
//!    When the request says `"tx_gso":true` and the agent hands them (`lanekitd --tx-gso
//!    kernel`, the default), a queue's entry has `"gso":true` and a third fd follows its pair:
//!    `[xsk0, umem0, gso0, xsk1, ...]`. It is an `AF_PACKET` `SOCK_RAW` socket bound to the same
//!    device with protocol 0 (it receives nothing), with `PACKET_VNET_HDR` (and
//!    `PACKET_QDISC_BYPASS`); the backend sends a guest's validated TSO/USO frame whole through
//!    it, behind a `virtio_net_hdr` it rebuilt (`pkt_gso.rs`).
//!    The body is at most 64 KiB; at most 31 queue pairs (62 fds, 63 with the RSS map, 94 with
//!    GSO sockets too).
//! 4. Each `xsk` fd is an AF_XDP socket that already has: its UMEM registered (`XDP_UMEM_REG`,
//!    aligned mode, `headroom` 0, `chunk_size` = `frame_size`, `len` = `umem_size` =
//!    `frame_size * frame_count`, address = the agent's shared mapping of `umem`; with
//!    `"tx_meta":true` and a kernel >= 6.8 also `XDP_UMEM_TX_METADATA_LEN` and the queue entry's
//!    `"tx_metadata_len"` (24; absent: 0), and every TX frame then starts that far into its
//!    chunk, its `struct xsk_tx_metadata` right before it); its fill,
//!    completion, RX and TX rings created with the given sizes (powers of two); and is bound to
//!    (uplink, queue) with its own UMEM (no shared UMEM), copy or zero-copy mode, with or
//!    without `XDP_USE_NEED_WAKEUP`. The agent has inserted it in its XSKMAP.
//!    Each `umem` fd is a memfd (or any shareable file) of `umem_size` bytes, the same pages
//!    the agent registered; the backend maps it `MAP_SHARED`.
//! 5. The backend owns every frame: it puts frames `[0, fill_frames)` on the fill ring and uses
//!    the rest for TX; the agent must not touch the rings or the UMEM after the handover.
//!    The backend closes the unix connection after the reply; it needs no privileges.
//!
//! With `--ifname IF` the backend instead creates the sockets itself (needs `CAP_NET_RAW`):
//! memfd UMEM, `XDP_COPY` bind on queues `0..N-1`. It loads no XDP program: without one that
//! redirects into an XSKMAP nothing is received, but TX works.

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::offload::TxHdr;
use crate::pkt_gso::GsoSocket;
use crate::pkt_rx::RxGsoSocket;
use crate::port::{finish_csum, Batch, Port, TxFrame};
use crate::rss::{self, XskMeta};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
const XDP_COPY: u16 = 1 << 1;
const XDP_RING_NEED_WAKEUP: u32 = 1;

/// `struct xdp_umem_reg` (v1 layout, accepted by every kernel with AF_XDP).
#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
}

/// `struct xdp_umem_reg` with `flags` and `tx_metadata_len` (kernel >= 6.8).
#[repr(C)]
struct UmemRegMeta {
    v1: UmemReg,
    flags: u32,
    tx_metadata_len: u32,
}

/// `XDP_UMEM_TX_METADATA_LEN`: the UMEM has `tx_metadata_len` bytes of TX metadata room.
const XDP_UMEM_TX_METADATA_LEN: u32 = 1 << 2;
/// `XDP_TX_METADATA` (descriptor option): a `struct xsk_tx_metadata` precedes the frame.
const XDP_TX_METADATA: u32 = 1 << 1;
/// `XDP_TXMD_FLAGS_CHECKSUM`: the kernel builds the skb `CHECKSUM_PARTIAL` at
/// `csum_start` / `csum_offset` (copy mode since 6.8, `xsk_build_skb`).
const XDP_TXMD_FLAGS_CHECKSUM: u64 = 1 << 1;
/// TX metadata room the backend asks for: `struct xsk_tx_metadata` is 24 bytes since 6.15
/// (16 before); the kernel takes any multiple of 8 below 256.
pub const TX_METADATA_LEN: u32 = 24;

/// `struct xsk_tx_metadata` as the backend fills it: `flags` (u64), then the request's
/// `csum_start` and `csum_offset` (u16 each, from the frame's first byte), in native byte order.
pub fn tx_metadata(csum_start: u16, csum_offset: u16) -> [u8; 12] {
    let mut m = [0u8; 12];
    m[..8].copy_from_slice(&XDP_TXMD_FLAGS_CHECKSUM.to_ne_bytes());
    m[8..10].copy_from_slice(&csum_start.to_ne_bytes());
    m[10..12].copy_from_slice(&csum_offset.to_ne_bytes());
    m
}

/// `struct sockaddr_xdp`.
#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// `struct xdp_desc`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct XdpDesc {
    addr: u64,
    len: u32,
    options: u32,
}

/// Geometry of one queue's socket and UMEM (one entry of the handover reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskParams {
    /// Queue pair (and NIC queue) index.
    pub queue: u32,
    /// UMEM bytes; must equal `frame_size * frame_count`.
    pub umem_size: u64,
    /// UMEM chunk size.
    pub frame_size: u32,
    /// Number of UMEM frames.
    pub frame_count: u32,
    /// Fill ring entries (power of two).
    pub fill_size: u32,
    /// Completion ring entries (power of two).
    pub comp_size: u32,
    /// RX ring entries (power of two).
    pub rx_size: u32,
    /// TX ring entries (power of two).
    pub tx_size: u32,
    /// The UMEM's `tx_metadata_len` (0: registered without TX metadata; checksums are then
    /// computed by the backend). Every TX frame starts this far into its chunk.
    pub tx_metadata_len: u32,
}

impl XskParams {
    /// Defaults used with `--ifname`: 4096 frames of 2048 bytes, 2048-entry rings.
    pub fn standard(queue: u32) -> Self {
        XskParams {
            queue,
            umem_size: 4096 * 2048,
            frame_size: 2048,
            frame_count: 4096,
            fill_size: 2048,
            comp_size: 2048,
            rx_size: 2048,
            tx_size: 2048,
            tx_metadata_len: 0,
        }
    }

    /// Check everything the rings and frame accounting rely on.
    pub fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        for (name, v) in [
            ("fill_size", self.fill_size),
            ("comp_size", self.comp_size),
            ("rx_size", self.rx_size),
            ("tx_size", self.tx_size),
        ] {
            if !v.is_power_of_two() || v > 1 << 20 {
                return bad(format!("queue {}: {name} {v} is not a power of two <= 2^20", self.queue));
            }
        }
        if !(2048..=65536).contains(&self.frame_size) || !self.frame_size.is_power_of_two() {
            return bad(format!(
                "queue {}: frame_size {} not a power of two in 2048..=65536",
                self.queue, self.frame_size
            ));
        }
        if self.frame_count < 2 || u64::from(self.frame_count) * u64::from(self.frame_size) != self.umem_size {
            return bad(format!(
                "queue {}: umem_size {} != frame_size {} * frame_count {} (>= 2)",
                self.queue, self.umem_size, self.frame_size, self.frame_count
            ));
        }
        let m = self.tx_metadata_len;
        if !m.is_multiple_of(8) || m >= 256 || (1..16).contains(&m) {
            return bad(format!(
                "queue {}: tx_metadata_len {} not 0 or a multiple of 8 in 16..256",
                self.queue, self.tx_metadata_len
            ));
        }
        if self.umem_size > 1 << 36 {
            return bad(format!("queue {}: umem_size {} too large", self.queue, self.umem_size));
        }
        Ok(())
    }

    /// Frames put on the fill ring: half the frames, at most the fill and RX ring sizes.
    fn fill_frames(&self) -> u32 {
        (self.frame_count / 2).min(self.fill_size).min(self.rx_size)
    }
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: v points to a readable T of the given size for the duration of the call.
    let r = unsafe { libc::setsockopt(fd, SOL_XDP, name, (v as *const T).cast(), size_of::<T>() as libc::socklen_t) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An AF_XDP socket with its UMEM and rings, used as a [`Port`].
#[derive(Debug)]
pub struct XskPort {
    fd: OwnedFd,
    umem: Mmap,
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<XdpDesc>,
    tx: Ring<XdpDesc>,
    params: XskParams,
    tx_free: Vec<u64>,
    fill_pending: Vec<u64>,
    /// Frames at the end of `tx_free` lent by `tx_reserve` (the last one is buffer 0).
    tx_lent: usize,
    /// Descriptors from the kernel that pointed outside the UMEM (never expected).
    pub bad_descs: u64,
    /// Frames sent with a checksum request in their TX metadata (left to the kernel).
    pub csum_offloaded: u64,
    /// The queue's GSO socket (`pkt_gso.rs`), when the agent handed one.
    gso: Option<GsoSocket>,
    /// The queue's wire -> guest packet socket (`pkt_rx.rs`), when the agent handed one: the
    /// queue then receives through it, not through the AF_XDP socket.
    rx_gso: Option<RxGsoSocket>,
}

impl XskPort {
    /// Take over a bound AF_XDP socket and its UMEM file (see the module docs).
    pub fn from_fds(xsk: OwnedFd, umem: &File, params: XskParams) -> io::Result<Self> {
        params.validate()?;
        let fd = xsk.as_raw_fd();
        let size = usize::try_from(params.umem_size).map_err(io::Error::other)?;
        let file_len = umem.metadata()?.len();
        if file_len < params.umem_size {
            return Err(io::Error::other(format!("umem file is {file_len} bytes, expected {size}")));
        }
        let umem_map = Mmap::map(umem.as_raw_fd(), size, 0)?;
        let off = getsockopt_offsets(fd)?;
        let fill = Ring::map(fd, &off.fr, params.fill_size, XDP_UMEM_PGOFF_FILL_RING, true)?;
        let comp = Ring::map(fd, &off.cr, params.comp_size, XDP_UMEM_PGOFF_COMPLETION_RING, false)?;
        let rx = Ring::map(fd, &off.rx, params.rx_size, XDP_PGOFF_RX_RING, false)?;
        let tx = Ring::map(fd, &off.tx, params.tx_size, XDP_PGOFF_TX_RING, true)?;
        let fs = u64::from(params.frame_size);
        let nfill = params.fill_frames();
        let mut port = XskPort {
            fd: xsk,
            umem: umem_map,
            fill,
            comp,
            rx,
            tx,
            params,
            tx_free: (nfill..params.frame_count).map(|i| u64::from(i) * fs).collect(),
            fill_pending: (0..nfill).map(|i| u64::from(i) * fs).collect(),
            tx_lent: 0,
            bad_descs: 0,
            csum_offloaded: 0,
            gso: None,
            rx_gso: None,
        };
        port.refill();
        Ok(port)
    }

    /// Create, register and bind a socket on `ifname` queue `params.queue` in copy mode, with
    /// [`TX_METADATA_LEN`] bytes of TX metadata room when the kernel takes it (>= 6.8; else
    /// without, and the backend computes checksums itself).
    pub fn create(ifname: &str, mut params: XskParams) -> io::Result<Self> {
        params.tx_metadata_len = TX_METADATA_LEN;
        let (xsk, umem) = match create_unbound(params) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                log::info!("queue {}: kernel refuses AF_XDP TX metadata ({e}): software checksums", params.queue);
                params.tx_metadata_len = 0;
                create_unbound(params)?
            }
            r => r?,
        };
        let raw = xsk.as_raw_fd();
        let port = XskPort::from_fds(xsk, &umem, params)?;
        bind_copy(raw, ifname, params.queue)?;
        Ok(port)
    }

    /// Send TSO/USO frames whole through `gso` (the kernel segments them) instead of cutting
    /// them into AF_XDP frames.
    pub fn set_gso(&mut self, gso: GsoSocket) {
        self.gso = Some(gso);
    }

    /// Receive through `rx` (whole GSO packets, `pkt_rx.rs`) instead of the AF_XDP socket.
    pub fn set_rx_gso(&mut self, rx: RxGsoSocket) {
        self.rx_gso = Some(rx);
    }

    /// The GSO socket's counters: (packets sent, sends refused).
    pub fn gso_counters(&self) -> Option<(u64, u64)> {
        self.gso.as_ref().map(|g| (g.sent, g.failed))
    }

    /// Geometry of this socket.
    pub fn params(&self) -> XskParams {
        self.params
    }

    /// Room in front of every TX frame for its `struct xsk_tx_metadata`.
    fn meta_room(&self) -> usize {
        self.params.tx_metadata_len as usize
    }

    /// Largest TX frame.
    fn tx_cap(&self) -> usize {
        self.params.frame_size as usize - self.meta_room()
    }

    fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let end = addr.checked_add(len as u64)?;
        if end > self.params.umem_size {
            return None;
        }
        // SAFETY: [addr, end) lies inside the UMEM mapping (checked above); the kernel wrote the
        // frame before publishing its descriptor (acquire on the producer index).
        Some(unsafe { std::slice::from_raw_parts(self.umem.ptr.as_ptr().add(addr as usize), len) })
    }

    /// Where the XDP metadata in front of the frame at `addr` starts: inside the same chunk
    /// (copy mode puts frames XDP_PACKET_HEADROOM into their chunk) and the UMEM, else None.
    fn meta_at(&self, addr: u64) -> Option<usize> {
        let fs = u64::from(self.params.frame_size);
        let at = addr.checked_sub(rss::META_LEN as u64)?;
        if addr % fs < rss::META_LEN as u64 || addr > self.params.umem_size {
            return None;
        }
        usize::try_from(at).ok()
    }

    /// The hash `steer_vm` put in front of the frame at `addr`, if it did.
    fn meta(&self, addr: u64) -> Option<XskMeta> {
        let at = self.meta_at(addr)?;
        let mut b = [0u8; rss::META_LEN];
        // SAFETY: [at, at + META_LEN) lies in the frame's chunk inside the UMEM (meta_at); the
        // kernel wrote it with the frame, before publishing the descriptor.
        unsafe { std::ptr::copy_nonoverlapping(self.umem.ptr.as_ptr().add(at), b.as_mut_ptr(), rss::META_LEN) };
        XskMeta::decode(&b)
    }

    /// Forget the metadata in front of a frame before its chunk goes back to the fill ring: a
    /// later frame the program put no metadata in front of must not inherit this hash.
    fn clear_meta(&mut self, addr: u64) {
        if let Some(at) = self.meta_at(addr) {
            // SAFETY: as in `meta`; the chunk is ours until it is put on the fill ring.
            unsafe { std::ptr::write_bytes(self.umem.ptr.as_ptr().add(at), 0, rss::META_LEN) };
        }
    }

    /// Put pending frames back on the fill ring.
    fn refill(&mut self) {
        let n = self.fill.free(self.fill_pending.len() as u32).min(self.fill_pending.len() as u32);
        if n == 0 {
            return;
        }
        let start = self.fill.local;
        for i in 0..n {
            let addr = self.fill_pending.pop().unwrap_or(0);
            self.fill.write(start.wrapping_add(i), addr);
        }
        self.fill.submit(n);
        if self.fill.needs_wakeup() {
            // SAFETY: recvfrom with a NULL buffer of length 0 only wakes the driver.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Take completed TX frames back.
    fn reclaim(&mut self) {
        let n = self.comp.ready(self.params.comp_size);
        for i in 0..n {
            let addr = self.comp.read(self.comp.local.wrapping_add(i));
            let aligned = addr - addr % u64::from(self.params.frame_size);
            if aligned < self.params.umem_size {
                self.tx_free.push(aligned);
            } else {
                self.bad_descs += 1;
            }
        }
        self.comp.release(n);
    }

    /// Publish `sent` TX descriptors written at the producer position and have the kernel send
    /// them. Copy mode always needs the kick, and each kick sends at most 32 frames
    /// (TX_BATCH_SIZE in the kernel), so kick until the ring is drained (bounded); one kick per
    /// 32 frames, not per frame.
    fn publish_tx(&mut self, sent: u32) {
        if sent > 0 {
            self.tx.submit(sent);
        }
        for _ in 0..sent / 32 + 1 {
            self.kick();
            if self.tx.free(self.params.tx_size) == self.params.tx_size {
                break;
            }
        }
        self.reclaim();
    }

    fn kick(&self) {
        // SAFETY: sendto with no buffer and no address only asks the kernel to process the TX ring.
        let r =
            unsafe { libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => {}
                _ => log::debug!("queue {}: tx kick: {e}", self.params.queue),
            }
        }
    }
}

impl Port for XskPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        let n = self.rx.ready(max.min(u32::MAX as usize) as u32);
        let mut got = 0;
        for i in 0..n {
            let d = self.rx.read(self.rx.local.wrapping_add(i));
            match self.frame(d.addr, d.len as usize) {
                Some(f) => {
                    batch.push(f);
                    got += 1;
                }
                None => self.bad_descs += 1,
            }
            let fs = u64::from(self.params.frame_size);
            let frame = d.addr - d.addr % fs;
            if frame < self.params.umem_size {
                self.fill_pending.push(frame);
            }
        }
        self.rx.release(n);
        self.refill();
        Ok(got)
    }

    fn rx_each(&mut self, max: usize, f: &mut dyn FnMut(&[u8], Option<XskMeta>) -> bool) -> Option<io::Result<usize>> {
        let n = self.rx.ready(max.min(u32::MAX as usize) as u32);
        let fs = u64::from(self.params.frame_size);
        let mut done = 0u32;
        while done < n {
            let d = self.rx.read(self.rx.local.wrapping_add(done));
            let meta = self.meta(d.addr);
            match self.frame(d.addr, d.len as usize) {
                Some(frame) => {
                    if !f(frame, meta) {
                        break;
                    }
                }
                None => self.bad_descs += 1,
            }
            if meta.is_some() {
                self.clear_meta(d.addr);
            }
            let frame = d.addr - d.addr % fs;
            if frame < self.params.umem_size {
                self.fill_pending.push(frame);
            }
            done += 1;
        }
        self.rx.release(done);
        self.refill();
        Some(Ok(done as usize))
    }

    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        self.tx_lent = 0;
        self.reclaim();
        let want = batch.len().min(self.tx_free.len()).min(u32::MAX as usize) as u32;
        let n = self.tx.free(want).min(want);
        let start = self.tx.local;
        let mut sent = 0u32;
        let room = self.meta_room() as u64;
        for f in batch.iter().take(n as usize) {
            if f.len() > self.tx_cap() {
                break;
            }
            let Some(chunk) = self.tx_free.pop() else { break };
            let addr = chunk + room;
            // SAFETY: chunk is a frame start inside the UMEM and room + f.len() <= frame_size, so
            // the copy stays in the mapping; the kernel does not touch free frames.
            unsafe { std::ptr::copy_nonoverlapping(f.as_ptr(), self.umem.ptr.as_ptr().add(addr as usize), f.len()) };
            self.tx.write(start.wrapping_add(sent), XdpDesc { addr, len: f.len() as u32, options: 0 });
            sent += 1;
        }
        self.publish_tx(sent);
        Ok(sent as usize)
    }

    fn tx_reserve(&mut self, n: usize) -> usize {
        self.reclaim();
        let want = n.min(self.tx_free.len()).min(u32::MAX as usize) as u32;
        self.tx_lent = self.tx.free(want).min(want) as usize;
        self.tx_lent
    }

    fn tx_buf(&mut self, i: usize) -> &mut [u8] {
        if i >= self.tx_lent {
            return &mut [];
        }
        let addr = self.tx_free[self.tx_free.len() - 1 - i] as usize + self.meta_room();
        // SAFETY: the chunk is a frame start taken from `tx_free` (frame-aligned, inside the UMEM,
        // see `reclaim`), so [addr, addr + tx_cap) = [chunk + room, chunk + frame_size) lies in
        // the mapping; free frames are not on any ring, so the kernel does not touch them, and
        // `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().add(addr), self.tx_cap()) }
    }

    fn tx_commit(&mut self, frames: &[TxFrame]) -> io::Result<usize> {
        let n = frames.len().min(self.tx_lent);
        self.tx_lent = 0;
        let (cap, room) = (self.tx_cap(), self.meta_room());
        let start = self.tx.local;
        let mut sent = 0u32;
        for f in &frames[..n] {
            if f.off.checked_add(f.len).is_none_or(|end| end > cap) {
                break;
            }
            let Some(&chunk) = self.tx_free.last() else { break };
            // In aligned mode a descriptor may start anywhere in its chunk (not past its end);
            // with TX metadata it starts at least `room` in, the metadata right before it.
            let at = chunk as usize + room + f.off;
            let mut options = 0;
            if let Some((cs, co)) = f.csum {
                if room == 0 || !f.csum_fits() {
                    // No metadata room (old kernel): the checksum is computed here.
                    // SAFETY: [at, at + len) lies in the chunk (checked above), which is ours.
                    let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().add(at), f.len) };
                    finish_csum(frame, f.csum);
                } else {
                    let m = tx_metadata(cs, co);
                    // SAFETY: [at - room, at - room + 12) lies in the chunk (room >= 16), which
                    // is ours until the descriptor is published.
                    unsafe {
                        std::ptr::copy_nonoverlapping(m.as_ptr(), self.umem.ptr.as_ptr().add(at - room), m.len())
                    };
                    options = XDP_TX_METADATA;
                    self.csum_offloaded += 1;
                }
            }
            self.tx_free.pop();
            let desc = XdpDesc { addr: at as u64, len: f.len as u32, options };
            self.tx.write(start.wrapping_add(sent), desc);
            sent += 1;
        }
        self.publish_tx(sent);
        Ok(sent as usize)
    }

    fn gso_capable(&self) -> bool {
        self.gso.is_some()
    }

    fn send_gso(&mut self, hdr: &[u8; 10], frame: &[u8]) -> io::Result<()> {
        if self.gso.is_none() {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        // The AF_XDP frames published before this packet leave first (same flow, same order):
        // kick once more if the last kicks left some in the TX ring.
        if self.tx.free(self.params.tx_size) != self.params.tx_size {
            self.kick();
        }
        self.gso.as_mut().map_or_else(|| Err(io::Error::from(io::ErrorKind::Unsupported)), |g| g.send(hdr, frame))
    }

    fn rx_kernel(&mut self, max: usize, f: &mut dyn FnMut(TxHdr, &mut [u8]) -> bool) -> Option<io::Result<usize>> {
        self.rx_gso.as_mut().map(|r| r.each(max, f))
    }

    fn fd(&self) -> RawFd {
        // With a packet socket nothing arrives on the AF_XDP socket: wake on the packets.
        self.rx_gso.as_ref().map_or(self.fd.as_raw_fd(), RxGsoSocket::fd)
    }

    fn xsk_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn rx_socket(&self) -> Option<std::sync::Arc<crate::pkt_rx::RxSocketCounters>> {
        self.rx_gso.as_ref().map(RxGsoSocket::counters)
    }

    fn csum_offloaded(&self) -> u64 {
        self.csum_offloaded
    }

    fn describe(&self) -> String {
        format!("xsk queue {}", self.params.queue)
    }
}

#[path = "xsk_ring.rs"]
mod ring;
use ring::{getsockopt_offsets, Mmap, Ring};
pub use ring::{xdp_statistics, XdpStatistics};

#[path = "xsk_create.rs"]
mod create;
pub use create::{bind_copy, create_unbound, ifindex, memfd};

#[cfg(test)]
#[path = "xsk_tests.rs"]
mod tests;
