//! Datapath counters of one queue pair and the classification of malformed guest input.

use std::sync::atomic::{AtomicU64, Ordering};

use log::debug;

use super::ChainError;

/// What kind of malformed guest input an error was (the `kind` label of
/// `lanekit_vhost_guest_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A descriptor chain refused: empty, wrong direction, too short, looping, bad address,
    /// unsupported offload, control command without ack.
    BadChain,
    /// A TX chain longer than the largest frame (MTU + 18 plus the virtio header).
    FrameTooLarge,
    /// An invalid ring: available index or descriptor head out of range, ring memory unreadable.
    InvalidRing,
    /// A TX virtio-net header whose offload request was not negotiated or does not match its
    /// frame (see `offload.rs`).
    BadOffload,
}

impl ErrorKind {
    /// Every kind, in the order of [`Stats::error_kinds`].
    pub const ALL: [ErrorKind; 4] =
        [ErrorKind::BadChain, ErrorKind::FrameTooLarge, ErrorKind::InvalidRing, ErrorKind::BadOffload];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::BadChain => "bad_chain",
            ErrorKind::FrameTooLarge => "frame_too_large",
            ErrorKind::InvalidRing => "invalid_ring",
            ErrorKind::BadOffload => "bad_offload",
        }
    }
}

/// Guest input errors the datapath counts, classified for the metrics.
pub trait GuestError: std::fmt::Display {
    /// The kind counted.
    fn kind(&self) -> ErrorKind;
}

impl GuestError for ChainError {
    fn kind(&self) -> ErrorKind {
        match self {
            ChainError::TooLarge(_) => ErrorKind::FrameTooLarge,
            ChainError::Offload(_) => ErrorKind::BadOffload,
            _ => ErrorKind::BadChain,
        }
    }
}

impl GuestError for virtio_queue::Error {
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidRing
    }
}

impl GuestError for vm_memory::GuestMemoryError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidRing
    }
}

/// Why the backend dropped an RX frame (the `reason` label of `lanekit_vhost_dropped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxDrop {
    /// It did not fit the guest's buffer (no MRG_RXBUF).
    NoRoom,
    /// A guest RX chain turned out invalid while filling it.
    BadChain,
    /// The kernel's header failed the checks (`--rx-gso kernel`).
    Refused,
}

/// Datapath counters of one queue pair (the control queue counts with pair 0). Relaxed atomics,
/// written only by the pair's worker and read at scrape time: no lock per frame. Aligned to
/// 128 bytes so that neighbouring pairs' counters never share a cache line (or line pair).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Stats {
    /// Frames delivered to the guest.
    pub rx_frames: AtomicU64,
    /// Bytes (without virtio header) delivered to the guest.
    pub rx_bytes: AtomicU64,
    /// Frames from the port that could not be delivered (sum of the three below).
    pub rx_dropped: AtomicU64,
    /// Frames dropped because they did not fit the guest's buffer (no MRG_RXBUF).
    pub rx_dropped_no_room: AtomicU64,
    /// Frames dropped because a guest RX chain turned out invalid while filling it.
    pub rx_dropped_bad_chain: AtomicU64,
    /// Packets from the kernel's packet socket (`--rx-gso kernel`) whose `virtio_net_hdr` did
    /// not pass the checks (also counted in [`Self::rx_kernel_refused`]).
    pub rx_dropped_refused: AtomicU64,
    /// Frames the port accepted from the guest.
    pub tx_frames: AtomicU64,
    /// Bytes the port accepted from the guest.
    pub tx_bytes: AtomicU64,
    /// Valid frames from the guest that the port refused (full) or failed to send (sum of the
    /// two below).
    pub tx_dropped: AtomicU64,
    /// Frames the port refused or failed to send (ring full, send error).
    pub tx_dropped_port_full: AtomicU64,
    /// Frames larger than the port's frames.
    pub tx_dropped_too_large: AtomicU64,
    /// Malformed input from the guest: bad chains, bad ring indexes, bad control commands.
    pub errors: AtomicU64,
    /// [`Self::errors`] by [`ErrorKind`] (index: position in [`ErrorKind::ALL`]).
    pub error_kinds: [AtomicU64; 4],
    /// TX frames with a checksum request (`NEEDS_CSUM` without GSO): filled in here, or left to
    /// the kernel (then also counted in [`Self::tx_csum_kernel`]).
    pub tx_csum: AtomicU64,
    /// TX GSO chains (validated): cut here into MTU-sized frames, or sent whole to the kernel
    /// (then also counted in [`Self::tx_gso_kernel`]).
    pub tx_gso: AtomicU64,
    /// TX GSO chains sent whole as one GSO packet the kernel segments (`pkt_gso.rs`).
    pub tx_gso_kernel: AtomicU64,
    /// TX GSO chains the kernel's GSO socket refused (full send buffer, ...): cut here instead.
    pub tx_gso_fallback: AtomicU64,
    /// TX frames (checksum requests and GSO segments) whose TCP/UDP checksum was left to the
    /// kernel through AF_XDP TX metadata (`CHECKSUM_PARTIAL`) instead of computed here.
    pub tx_csum_kernel: AtomicU64,
    /// RX frames whose TCP/UDP checksum the backend verified and marked `DATA_VALID`.
    pub rx_csum_valid: AtomicU64,
    /// Segments of two or more frames coalesced for the guest (GUEST_TSO, `gro.rs`) and
    /// delivered as one packet.
    pub rx_gro_segments: AtomicU64,
    /// Frames delivered inside those segments.
    pub rx_gro_merged: AtomicU64,
    /// Frames of coalesced segments the guest's buffers could not take whole, delivered one
    /// by one instead.
    pub rx_gro_split: AtomicU64,
    /// Wire -> guest through the kernel (`--rx-gso kernel`): GSO packets delivered whole.
    pub rx_gso_kernel: AtomicU64,
    /// GSO packets from the kernel cut here into frames (the guest did not ack the GSO type, or
    /// its buffers could not take the packet whole).
    pub rx_gso_kernel_cut: AtomicU64,
    /// GSO packets of a kernel packet larger than 64 KiB (BIG TCP) delivered to a TSO guest, each
    /// at most 64 KiB; the packet itself counts once in `rx_gso_kernel`.
    pub rx_gso_kernel_chunks: AtomicU64,
    /// Packets from the kernel whose `virtio_net_hdr` did not pass the checks: dropped.
    pub rx_kernel_refused: AtomicU64,
    /// Used-buffer notifications (interrupts) sent to the guest, RX queue.
    pub rx_notifications: AtomicU64,
    /// Used-buffer notifications (interrupts) sent to the guest, TX and control queues.
    pub tx_notifications: AtomicU64,
    /// TX notifications the guest asked for and the backend held back (`--tx-notify-delay-us`):
    /// each one the guest did not get is one it showed it no longer needed.
    pub tx_notify_held: AtomicU64,
    /// Held TX notifications sent after all (their delay ran out, or too many entries waited).
    pub tx_notify_late: AtomicU64,
    /// Nanoseconds spent in queue runs that moved frames (or commands): the backend's work
    /// without its sleeping, waking and empty polls (what testpmd's --record-core-cycles counts
    /// for its forwarding loop).
    pub busy_ns: AtomicU64,
}

/// A copy of [`Stats`] at one instant.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_dropped_no_room: u64,
    pub rx_dropped_bad_chain: u64,
    pub rx_dropped_refused: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_dropped_port_full: u64,
    pub tx_dropped_too_large: u64,
    pub errors: u64,
    pub error_kinds: [u64; 4],
    pub tx_csum: u64,
    pub tx_gso: u64,
    pub tx_gso_kernel: u64,
    pub tx_gso_fallback: u64,
    pub tx_csum_kernel: u64,
    pub rx_csum_valid: u64,
    pub rx_gro_segments: u64,
    pub rx_gro_merged: u64,
    pub rx_gro_split: u64,
    pub rx_gso_kernel: u64,
    pub rx_gso_kernel_cut: u64,
    pub rx_gso_kernel_chunks: u64,
    pub rx_kernel_refused: u64,
    pub rx_notifications: u64,
    pub tx_notifications: u64,
    pub tx_notify_held: u64,
    pub tx_notify_late: u64,
    pub busy_ns: u64,
}

impl StatsSnapshot {
    /// Sum of two snapshots (device totals from per-pair counters).
    pub fn sum(self, o: StatsSnapshot) -> StatsSnapshot {
        let mut kinds = self.error_kinds;
        for (k, v) in kinds.iter_mut().zip(o.error_kinds) {
            *k += v;
        }
        StatsSnapshot {
            rx_frames: self.rx_frames + o.rx_frames,
            rx_bytes: self.rx_bytes + o.rx_bytes,
            rx_dropped: self.rx_dropped + o.rx_dropped,
            rx_dropped_no_room: self.rx_dropped_no_room + o.rx_dropped_no_room,
            rx_dropped_bad_chain: self.rx_dropped_bad_chain + o.rx_dropped_bad_chain,
            rx_dropped_refused: self.rx_dropped_refused + o.rx_dropped_refused,
            tx_frames: self.tx_frames + o.tx_frames,
            tx_bytes: self.tx_bytes + o.tx_bytes,
            tx_dropped: self.tx_dropped + o.tx_dropped,
            tx_dropped_port_full: self.tx_dropped_port_full + o.tx_dropped_port_full,
            tx_dropped_too_large: self.tx_dropped_too_large + o.tx_dropped_too_large,
            errors: self.errors + o.errors,
            error_kinds: kinds,
            tx_csum: self.tx_csum + o.tx_csum,
            tx_gso: self.tx_gso + o.tx_gso,
            tx_gso_kernel: self.tx_gso_kernel + o.tx_gso_kernel,
            tx_gso_fallback: self.tx_gso_fallback + o.tx_gso_fallback,
            tx_csum_kernel: self.tx_csum_kernel + o.tx_csum_kernel,
            rx_csum_valid: self.rx_csum_valid + o.rx_csum_valid,
            rx_gro_segments: self.rx_gro_segments + o.rx_gro_segments,
            rx_gro_merged: self.rx_gro_merged + o.rx_gro_merged,
            rx_gro_split: self.rx_gro_split + o.rx_gro_split,
            rx_gso_kernel: self.rx_gso_kernel + o.rx_gso_kernel,
            rx_gso_kernel_cut: self.rx_gso_kernel_cut + o.rx_gso_kernel_cut,
            rx_gso_kernel_chunks: self.rx_gso_kernel_chunks + o.rx_gso_kernel_chunks,
            rx_kernel_refused: self.rx_kernel_refused + o.rx_kernel_refused,
            rx_notifications: self.rx_notifications + o.rx_notifications,
            tx_notifications: self.tx_notifications + o.tx_notifications,
            tx_notify_held: self.tx_notify_held + o.tx_notify_held,
            tx_notify_late: self.tx_notify_late + o.tx_notify_late,
            busy_ns: self.busy_ns + o.busy_ns,
        }
    }
}

impl Stats {
    /// Add `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Count one malformed input.
    pub fn error<E: GuestError + ?Sized>(&self, what: &E) {
        debug!("dropping guest input: {what}");
        Self::add(&self.errors, 1);
        let i = ErrorKind::ALL.iter().position(|k| *k == what.kind()).unwrap_or(0);
        Self::add(&self.error_kinds[i], 1);
    }

    /// Count one RX frame dropped, and why.
    pub(crate) fn rx_drop(&self, why: RxDrop) {
        Self::add(&self.rx_dropped, 1);
        let c = match why {
            RxDrop::NoRoom => &self.rx_dropped_no_room,
            RxDrop::BadChain => &self.rx_dropped_bad_chain,
            RxDrop::Refused => &self.rx_dropped_refused,
        };
        Self::add(c, 1);
    }

    /// Count TX frames dropped: refused by the port, or larger than its frames.
    pub(crate) fn tx_drop(&self, port_full: u64, too_large: u64) {
        Self::add(&self.tx_dropped, port_full + too_large);
        Self::add(&self.tx_dropped_port_full, port_full);
        Self::add(&self.tx_dropped_too_large, too_large);
    }

    /// Read every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            rx_frames: l(&self.rx_frames),
            rx_bytes: l(&self.rx_bytes),
            rx_dropped: l(&self.rx_dropped),
            rx_dropped_no_room: l(&self.rx_dropped_no_room),
            rx_dropped_bad_chain: l(&self.rx_dropped_bad_chain),
            rx_dropped_refused: l(&self.rx_dropped_refused),
            tx_frames: l(&self.tx_frames),
            tx_bytes: l(&self.tx_bytes),
            tx_dropped: l(&self.tx_dropped),
            tx_dropped_port_full: l(&self.tx_dropped_port_full),
            tx_dropped_too_large: l(&self.tx_dropped_too_large),
            errors: l(&self.errors),
            error_kinds: self.error_kinds.each_ref().map(l),
            tx_csum: l(&self.tx_csum),
            tx_gso: l(&self.tx_gso),
            tx_gso_kernel: l(&self.tx_gso_kernel),
            tx_gso_fallback: l(&self.tx_gso_fallback),
            tx_csum_kernel: l(&self.tx_csum_kernel),
            rx_csum_valid: l(&self.rx_csum_valid),
            rx_gro_segments: l(&self.rx_gro_segments),
            rx_gro_merged: l(&self.rx_gro_merged),
            rx_gro_split: l(&self.rx_gro_split),
            rx_gso_kernel: l(&self.rx_gso_kernel),
            rx_gso_kernel_cut: l(&self.rx_gso_kernel_cut),
            rx_gso_kernel_chunks: l(&self.rx_gso_kernel_chunks),
            rx_kernel_refused: l(&self.rx_kernel_refused),
            rx_notifications: l(&self.rx_notifications),
            tx_notifications: l(&self.tx_notifications),
            tx_notify_held: l(&self.tx_notify_held),
            tx_notify_late: l(&self.tx_notify_late),
            busy_ns: l(&self.busy_ns),
        }
    }
}
