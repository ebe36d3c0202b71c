//! The packet port: where Ethernet frames leave and enter the backend.
//!
//! One port per virtio queue pair. The virtio side only sees this trait, so it is testable
//! without AF_XDP: [`ChannelPort`] (frames exchanged with a test peer) and [`LoopPort`]
//! (every frame sent comes back as received) implement it in memory; `xsk::XskPort` is the real one.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::offload::TxHdr;
use crate::pkt_rx::RxSocketCounters;
use crate::rss::XskMeta;

/// Frames stored back to back in one reusable buffer (no allocation once warmed up).
#[derive(Debug, Default, Clone)]
pub struct Batch {
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl Batch {
    /// An empty batch with room for `frames` frames of `bytes` bytes in total.
    pub fn with_capacity(frames: usize, bytes: usize) -> Self {
        Batch { data: Vec::with_capacity(bytes), ends: Vec::with_capacity(frames) }
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the batch holds no frame.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Forget every frame, keeping the allocation.
    pub fn clear(&mut self) {
        self.data.clear();
        self.ends.clear();
    }

    /// Append a copy of `frame`.
    pub fn push(&mut self, frame: &[u8]) {
        self.data.extend_from_slice(frame);
        self.ends.push(self.data.len());
    }

    /// Append a frame of `len` bytes written by `fill`; nothing is appended when `fill` fails.
    pub fn push_with<E>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<(), E> {
        let start = self.data.len();
        self.data.resize(start + len, 0);
        match fill(&mut self.data[start..]) {
            Ok(()) => {
                self.ends.push(self.data.len());
                Ok(())
            }
            Err(e) => {
                self.data.truncate(start);
                Err(e)
            }
        }
    }

    /// Frame `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.data[start..end])
    }

    /// All frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

/// One frame of a direct-TX commit: `len` bytes at `off` in its lent buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxFrame {
    /// Offset of the frame in the lent buffer.
    pub off: usize,
    /// Frame length.
    pub len: usize,
    /// A TCP/UDP checksum still to compute: (`csum_start`, `csum_offset`) from the frame's first
    /// byte, the field holding the pseudo-header sum (what a `NEEDS_CSUM` guest leaves). The
    /// caller checked that it is the frame's L4 checksum; the port has the kernel compute it
    /// (AF_XDP TX metadata) or computes it ([`finish_csum`]).
    pub csum: Option<(u16, u16)>,
}

impl TxFrame {
    /// A frame without checksum request.
    pub fn plain(off: usize, len: usize) -> Self {
        TxFrame { off, len, csum: None }
    }

    /// The checksum request lies inside the frame (what the kernel checks before it takes it:
    /// `csum_start + csum_offset + 2 <= len`).
    pub fn csum_fits(&self) -> bool {
        self.csum.is_some_and(|(s, o)| usize::from(s) + usize::from(o) + 2 <= self.len)
    }
}

/// Compute a [`TxFrame::csum`] request in software on the frame itself (nothing when there is
/// none or it does not fit the frame).
pub fn finish_csum(frame: &mut [u8], csum: Option<(u16, u16)>) {
    if let Some((s, o)) = csum {
        if usize::from(s) + usize::from(o) + 2 <= frame.len() {
            crate::offload::fill_csum(frame, usize::from(s), usize::from(o));
        }
    }
}

/// A packet port serving one queue pair.
pub trait Port: Send {
    /// Append up to `max` received frames to `batch`; returns how many were appended
    /// (0 when nothing is pending). Never blocks.
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize>;

    /// Send the frames of `batch` in order; returns how many were accepted. Frames past that
    /// number were not sent (the port is full); the caller counts them as dropped. Never blocks.
    fn send(&mut self, batch: &Batch) -> io::Result<usize>;

    /// Direct TX, step 1: lend up to `n` of the port's own frame buffers so the caller can write
    /// frames in place (no intermediate copy). Returns how many are lent (each at least
    /// [`Port::tx_buf`]`.len()` bytes); 0 when the port has none free or does not lend buffers,
    /// and the caller then uses [`Port::send`]. A new call forgets an earlier, uncommitted loan.
    fn tx_reserve(&mut self, _n: usize) -> usize {
        0
    }

    /// Direct TX, step 2: buffer `i` (`< tx_reserve()`) of the current loan; empty otherwise.
    fn tx_buf(&mut self, _i: usize) -> &mut [u8] {
        &mut []
    }

    /// Direct TX, step 3: send `frames[k]` out of lent buffer `k`, in order, with its checksum
    /// request done, and end the loan (unused buffers go back to the port). Returns how many
    /// were accepted.
    fn tx_commit(&mut self, _frames: &[TxFrame]) -> io::Result<usize> {
        Ok(0)
    }

    /// Guest -> wire GSO by the kernel: the port can send a whole TSO/USO frame as one GSO
    /// packet ([`Port::send_gso`]).
    fn gso_capable(&self) -> bool {
        false
    }

    /// Send `frame` whole as ONE GSO packet described by `hdr` (a `virtio_net_hdr` the caller
    /// built from its validated plan, `offload::Gso::kernel_hdr`), after every frame sent
    /// before it. An error (or a port that cannot) leaves the frame to the caller, which cuts
    /// it itself.
    fn send_gso(&mut self, _hdr: &[u8; 10], _frame: &[u8]) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    /// Frames whose checksum this port left to the kernel (AF_XDP TX metadata), ever.
    fn csum_offloaded(&self) -> u64 {
        0
    }

    /// Direct RX: hand up to `max` received frames, in order, to `f` straight from the port's
    /// own buffers (no copy out), with the hash metadata `steer_vm` put in front of each. `f`
    /// returns false when it could not take the frame: that frame and the ones after it stay in
    /// the port for the next call. Returns how many frames `f` took; None when the port does not
    /// lend its frames (the caller then uses [`Port::recv`]).
    fn rx_each(
        &mut self,
        _max: usize,
        _f: &mut dyn FnMut(&[u8], Option<XskMeta>) -> bool,
    ) -> Option<io::Result<usize>> {
        None
    }

    /// Wire -> guest through the kernel (`pkt_rx.rs`): hand up to `max` whole packets, in order,
    /// to `f` as (the kernel's `virtio_net_hdr`, the frame, which `f` may rewrite: it is the
    /// port's copy). `f` returns false when the guest could not take the packet: it stays in the
    /// port for the next call. Returns how many packets `f` took; None when the port receives
    /// through AF_XDP instead (the caller then uses [`Port::rx_each`] / [`Port::recv`]).
    fn rx_kernel(&mut self, _max: usize, _f: &mut dyn FnMut(TxHdr, &mut [u8]) -> bool) -> Option<io::Result<usize>> {
        None
    }

    /// A file descriptor that becomes readable (edge: on each arrival) when `recv` may return
    /// frames. The backend registers it edge-triggered on its epoll loop.
    fn fd(&self) -> RawFd;

    /// The AF_XDP socket behind this port, if it is one (for `XDP_STATISTICS` at scrape time).
    fn xsk_fd(&self) -> Option<RawFd> {
        None
    }

    /// The wire -> guest packet socket's counters (`pkt_rx.rs`), if the port receives through
    /// one (for `PACKET_STATISTICS` at scrape time).
    fn rx_socket(&self) -> Option<Arc<RxSocketCounters>> {
        None
    }

    /// Short description for logs.
    fn describe(&self) -> String;
}

/// Shared state of a channel port and its peer.
#[derive(Debug, Default)]
struct Queues {
    /// Frames waiting to be received by the backend (peer -> backend -> guest).
    to_backend: VecDeque<Vec<u8>>,
    /// Frames the backend sent (guest -> backend -> peer).
    from_backend: VecDeque<Vec<u8>>,
}

/// Capacity of each direction of a channel port; more frames are dropped, like a full NIC ring.
pub const CHANNEL_CAPACITY: usize = 4096;

/// An in-memory port whose other end is a [`ChannelPeer`] held by a test.
#[derive(Debug)]
pub struct ChannelPort {
    shared: Arc<(Mutex<Queues>, Condvar)>,
    event: Arc<EventFd>,
    index: usize,
}

/// The test's end of a [`ChannelPort`].
#[derive(Debug, Clone)]
pub struct ChannelPeer {
    shared: Arc<(Mutex<Queues>, Condvar)>,
    event: Arc<EventFd>,
}

/// Create a connected port/peer pair for queue pair `index`.
pub fn channel_port(index: usize) -> io::Result<(ChannelPort, ChannelPeer)> {
    let shared = Arc::new((Mutex::new(Queues::default()), Condvar::new()));
    let event = Arc::new(EventFd::new(EFD_NONBLOCK)?);
    Ok((ChannelPort { shared: shared.clone(), event: event.clone(), index }, ChannelPeer { shared, event }))
}

fn lock(shared: &(Mutex<Queues>, Condvar)) -> std::sync::MutexGuard<'_, Queues> {
    // A poisoned lock only means a test thread panicked; the queues are still consistent.
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

impl ChannelPeer {
    /// Queue a frame for the guest; false when the port is full (frame dropped).
    pub fn inject(&self, frame: &[u8]) -> bool {
        {
            let mut q = lock(&self.shared);
            if q.to_backend.len() >= CHANNEL_CAPACITY {
                return false;
            }
            q.to_backend.push_back(frame.to_vec());
        }
        // An eventfd write only fails when the counter would overflow, which the
        // backend's reads prevent; a lost wakeup is still covered by the next inject.
        let _ = self.event.write(1);
        true
    }

    /// Queue `frames` for the guest at once (one wakeup: the backend takes them as one batch
    /// unless it is already running); false, and nothing queued, when they do not all fit.
    pub fn inject_all(&self, frames: &[Vec<u8>]) -> bool {
        {
            let mut q = lock(&self.shared);
            if q.to_backend.len() + frames.len() > CHANNEL_CAPACITY {
                return false;
            }
            q.to_backend.extend(frames.iter().cloned());
        }
        let _ = self.event.write(1);
        true
    }

    /// Wait until at least `n` frames were sent by the backend or `timeout` passed; returns and
    /// removes every frame sent so far.
    pub fn wait_sent(&self, n: usize, timeout: Duration) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.shared);
        while q.from_backend.len() < n {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            q = match self.shared.1.wait_timeout(q, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        q.from_backend.drain(..).collect()
    }

    /// Frames injected but not yet taken by the backend.
    pub fn pending(&self) -> usize {
        lock(&self.shared).to_backend.len()
    }
}

impl Port for ChannelPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        // Reset the counter first so a frame injected after the drain below re-arms the edge.
        let _ = self.event.read();
        let mut q = lock(&self.shared);
        let mut n = 0;
        while n < max {
            let Some(frame) = q.to_backend.pop_front() else { break };
            batch.push(&frame);
            n += 1;
        }
        if !q.to_backend.is_empty() {
            self.event.write(1)?;
        }
        Ok(n)
    }

    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        let mut q = lock(&self.shared);
        let room = CHANNEL_CAPACITY.saturating_sub(q.from_backend.len());
        let n = batch.len().min(room);
        for frame in batch.iter().take(n) {
            q.from_backend.push_back(frame.to_vec());
        }
        self.shared.1.notify_all();
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    fn describe(&self) -> String {
        format!("channel port {}", self.index)
    }
}

/// A port that hands every frame it sends back as received: the guest's TX comes back on its RX.
/// Used for standalone runs and the DPDK test (no network needed).
#[derive(Debug)]
pub struct LoopPort {
    frames: VecDeque<Vec<u8>>,
    free: Vec<Vec<u8>>,
    event: EventFd,
    index: usize,
}

impl LoopPort {
    /// A loop port for queue pair `index`.
    pub fn new(index: usize) -> io::Result<Self> {
        Ok(LoopPort {
            frames: VecDeque::with_capacity(CHANNEL_CAPACITY),
            free: Vec::new(),
            event: EventFd::new(EFD_NONBLOCK)?,
            index,
        })
    }
}

impl Port for LoopPort {
    fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
        let _ = self.event.read();
        let mut n = 0;
        while n < max {
            let Some(frame) = self.frames.pop_front() else { break };
            batch.push(&frame);
            self.free.push(frame);
            n += 1;
        }
        if !self.frames.is_empty() {
            self.event.write(1)?;
        }
        Ok(n)
    }

    fn send(&mut self, batch: &Batch) -> io::Result<usize> {
        let room = CHANNEL_CAPACITY.saturating_sub(self.frames.len());
        let n = batch.len().min(room);
        for frame in batch.iter().take(n) {
            let mut buf = self.free.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(frame);
            self.frames.push_back(buf);
        }
        if n > 0 {
            self.event.write(1)?;
        }
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    fn describe(&self) -> String {
        format!("loop port {}", self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_push_get_and_failed_fill() {
        let mut b = Batch::default();
        b.push(b"abc");
        assert!(b.push_with(4, |_| Err::<(), _>("no")).is_err());
        b.push_with(2, |buf| {
            buf.copy_from_slice(b"de");
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.get(0), Some(&b"abc"[..]));
        assert_eq!(b.get(1), Some(&b"de"[..]));
        assert_eq!(b.get(2), None);
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn channel_port_moves_frames_both_ways_and_bounds_them() {
        let (mut port, peer) = channel_port(0).unwrap();
        assert!(peer.inject(b"one"));
        assert!(peer.inject(b"two"));
        let mut b = Batch::default();
        assert_eq!(port.recv(&mut b, 1).unwrap(), 1);
        // One frame is still pending, so the fd is re-armed.
        assert_eq!(port.event.read().unwrap(), 1);
        assert_eq!(port.recv(&mut b, 8).unwrap(), 1);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![&b"one"[..], &b"two"[..]]);
        assert_eq!(port.send(&b).unwrap(), 2);
        let sent = peer.wait_sent(2, Duration::from_secs(1));
        assert_eq!(sent, vec![b"one".to_vec(), b"two".to_vec()]);
        for _ in 0..CHANNEL_CAPACITY {
            assert!(peer.inject(b"x"));
        }
        assert!(!peer.inject(b"x"), "a full port must refuse frames");
    }

    #[test]
    fn loop_port_returns_what_it_sends() {
        let mut port = LoopPort::new(0).unwrap();
        let mut b = Batch::default();
        assert_eq!(port.recv(&mut b, 4).unwrap(), 0);
        b.push(b"ping");
        assert_eq!(port.send(&b).unwrap(), 1);
        let mut got = Batch::default();
        assert_eq!(port.recv(&mut got, 4).unwrap(), 1);
        assert_eq!(got.get(0), Some(&b"ping"[..]));
    }
}
