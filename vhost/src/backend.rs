//! The `VhostUserBackend` implementation: a virtio-net device with N queue pairs and a control
//! queue, each queue pair served by its own worker thread and its own [`Port`].
//!
//! Queue layout (virtio-net): `2*i` is RX of pair `i`, `2*i+1` its TX, `2*N` the control queue.
//! Worker thread `i` owns pair `i`; thread 0 also owns the control queue. Event ids on a
//! worker's epoll: `0` RX kick, `1` TX kick, `2` control kick (thread 0), `num_queues` reserved by
//! vhost-user-backend (exit / vring enable), [`NetBackend::port_event`] the port fd
//! (edge-triggered), [`NetBackend::resched_event`] a self-wakeup used when a run hit its budget.
//!
//! Adaptive polling (`poll`, default [`DEFAULT_POLL`]): an event starts a serve loop that runs
//! both queues of the pair and keeps polling them (guest kicks stay suppressed, the port fd is
//! taken off the epoll once traffic is sustained) until nothing arrived for `poll`. Before the
//! worker sleeps it re-arms everything and checks again: TX kicks through
//! `enable_notification` (EVENT_IDX `avail_event` / `VRING_USED_F_NO_NOTIFY`), which reports
//! chains that raced with it, and the port fd, which epoll reports at once when frames are
//! already waiting. A zero `poll` is the purely event-driven mode (port fd always registered).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use log::{info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::bitmap::MemRegionBitmap;
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringState, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_ANNOUNCE, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use vm_memory::{
    GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
    MmapRegion,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::dirty::{DirtyBitmap, RegionLog, VHOST_F_LOG_ALL};
use crate::net::{self, NetMode, QueueRun, RxState, Stats, StatsSnapshot, TxState};
use crate::offload::Offloads;
use crate::pkt_rx::RxSocketCounters;
use crate::port::Port;
use crate::rss::{self, RssConfig, RssMap};
use crate::sigbus;
use dirty_log::region_bitmap;

mod dirty_log;
mod notify;
mod serve;

/// Queue size offered to the frontend.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// Most queue pairs: queue masks are 64-bit and need 2 bits per pair plus the control queue.
pub const MAX_QUEUE_PAIRS: u16 = 31;
/// Frames (or chains) one queue run handles before yielding to the other queue of its thread.
pub const BUDGET: usize = 256;
/// Default polling window after the last frame before a worker sleeps (see module docs).
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// The polling window for a process that may use `cpus` CPUs: [`DEFAULT_POLL`] with more than
/// two, else none. On a machine with one or two cores a worker that spins after each burst
/// takes the core the guest's vCPU (or QEMU's I/O thread) needs next, and every
/// request/response pays for it.
pub fn default_poll(cpus: usize) -> Duration {
    if cpus > 2 {
        DEFAULT_POLL
    } else {
        Duration::ZERO
    }
}
/// Default hold of a TX notification (`notify.rs`): above a request/response round trip of a
/// TCG guest, so the next request's RX notification usually makes it moot.
pub const DEFAULT_TX_NOTIFY_DELAY: Duration = Duration::from_millis(1);
/// Largest config space read answered (`virtio_net_config` is 24 bytes today).
const CONFIG_SPACE_MAX: usize = 256;
/// Ethernet header + one VLAN tag: added to the MTU to get the largest frame.
const L2_OVERHEAD: usize = 18;

/// Virtio features always offered. The guest -> wire offloads (`offload.rs`) come on top, as
/// configured ([`NetBackend::with_offloads`]). `GUEST_ANNOUNCE`: after a live migration the VMM
/// (QEMU handles the announce status and its ctrl-queue ack) asks the guest to announce itself,
/// so the guest's first frames leave through the target's backend at once — what tells the
/// target node's agent that the VM runs there.
pub const VIRTIO_FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_NET_F_GUEST_ANNOUNCE
    | 1 << VIRTIO_NET_F_MRG_RXBUF
    | 1 << VIRTIO_RING_F_EVENT_IDX
    | 1 << VIRTIO_RING_F_INDIRECT_DESC
    | 1 << VIRTIO_NET_F_MQ
    | 1 << VIRTIO_NET_F_CTRL_VQ
    | 1 << VIRTIO_NET_F_MAC
    | 1 << VIRTIO_NET_F_STATUS
    | 1 << VIRTIO_NET_F_MTU;

/// Guest memory as the backend maps it: each region with its dirty log (`dirty.rs`).
pub type GuestMem = GuestMemoryMmap<DirtyBitmap>;
/// A vring over [`GuestMem`].
pub type Vring = vhost_user_backend::VringRwLock<GuestMemoryAtomic<GuestMem>>;

/// Static device settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// MAC address reported in config space.
    pub mac: [u8; 6],
    /// Queue pairs (1..=[`MAX_QUEUE_PAIRS`]).
    pub queue_pairs: u16,
    /// MTU reported to the guest; frames up to MTU + 18 bytes are accepted.
    pub mtu: u16,
}

impl DeviceConfig {
    /// `virtio_net_config`: mac, status, max_virtqueue_pairs, mtu (little endian).
    pub fn config_space(&self) -> [u8; 12] {
        let mut c = [0u8; 12];
        c[..6].copy_from_slice(&self.mac);
        c[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        c[8..10].copy_from_slice(&self.queue_pairs.to_le_bytes());
        c[10..12].copy_from_slice(&self.mtu.to_le_bytes());
        c
    }
}

struct Pair {
    port: Box<dyn Port>,
    rx: RxState,
    tx: TxState,
    /// Holds the port fd (edge-triggered) while armed; itself on the worker's epoll
    /// (level-triggered, [`NetBackend::port_event`]), so arming needs no handler reference.
    port_ep: Epoll,
    /// The port fd is on `port_ep`.
    armed: bool,
    /// A TX notification held back (`notify.rs`).
    tx_owed: Option<net::TxOwed>,
    /// Fires when `tx_owed` runs out of delay ([`NetBackend::timer_event`]).
    timer: TimerFd,
    /// `timer` is armed.
    timer_armed: bool,
}

/// What one serve-loop iteration found.
#[derive(Debug, Default, Clone, Copy)]
struct Served {
    handled: usize,
    more: bool,
}

/// The vhost-user-net backend.
pub struct NetBackend {
    config: DeviceConfig,
    pairs: Vec<Mutex<Pair>>,
    resched: Vec<EventFd>,
    /// One exit eventfd per worker thread, kept for the backend's lifetime (see `exit_event`).
    exits: Vec<EventFd>,
    /// Written by the SIGBUS guard when guest memory vanished under us (`sigbus.rs`).
    fault: EventFd,
    mem: RwLock<Option<GuestMemoryAtomic<GuestMem>>>,
    /// The memory table the dirty log was last applied to (its regions' logs carry over to
    /// the next table).
    logged_mem: Mutex<Option<Arc<GuestMem>>>,
    /// `VHOST_F_LOG_ALL` is acked: writes are logged (once a log is set).
    log_all: AtomicBool,
    /// The frontend's `SET_LOG_FD` eventfd, signalled after each queue run that wrote guest
    /// memory while logging.
    log_fd: Mutex<Option<EventFd>>,
    acked: AtomicU64,
    /// The frontend started the device (acked its features) and has stopped no ring since
    /// (`GET_VRING_BASE`) nor gone: the guest runs on this backend. A migration's source sees it
    /// fall at the switch-over, when its QEMU stops the device (`device_running`).
    running: AtomicBool,
    active_pairs: AtomicU16,
    /// One per queue pair (the control queue counts with pair 0).
    stats: Vec<Stats>,
    /// AF_XDP socket fds (per pair, when the port is one) for `XDP_STATISTICS` at scrape time.
    xsk_fds: Vec<Option<std::os::fd::RawFd>>,
    /// Wire -> guest packet sockets (per pair, `--rx-gso kernel`) for `PACKET_STATISTICS`.
    rx_sockets: Vec<Option<Arc<RxSocketCounters>>>,
    connections: AtomicU64,
    refusals: AtomicU64,
    connection_errors: AtomicU64,
    signal_errors: AtomicU64,
    poll: Duration,
    /// How long a TX notification the guest asked for may be held back (zero: never).
    tx_notify_delay: Duration,
    /// The VM's RSS map (from the agent): with it, VIRTIO_NET_F_RSS and F_HASH_REPORT are
    /// offered and the guest's configuration is written there (see `rss.rs`).
    rss: Option<Mutex<RssMap>>,
    /// The guest configuration in force (None: the default steering).
    rss_config: Mutex<Option<RssConfig>>,
    /// Guest -> wire offloads offered.
    offloads: Offloads,
    /// The `VIRTIO_NET_F_GUEST_*` offloads the guest has on (all negotiated ones after feature
    /// negotiation; `CTRL_GUEST_OFFLOADS_SET` switches them at run time).
    guest_offloads: AtomicU64,
}

/// Errors building a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Queue pair count out of range.
    #[error("queue pairs must be 1..={MAX_QUEUE_PAIRS}, got {0}")]
    QueuePairs(u16),
    /// One port per queue pair is required.
    #[error("{ports} ports for {pairs} queue pairs")]
    PortCount {
        /// Ports given.
        ports: usize,
        /// Queue pairs configured.
        pairs: u16,
    },
    /// MTU below the Ethernet minimum.
    #[error("mtu {0} is below 68")]
    Mtu(u16),
    /// An eventfd or epoll fd could not be created.
    #[error("create eventfd/epoll: {0}")]
    EventFd(io::Error),
}

impl NetBackend {
    /// A backend with one port per queue pair, in queue pair order.
    pub fn new(config: DeviceConfig, ports: Vec<Box<dyn Port>>) -> Result<Self, BackendError> {
        if config.queue_pairs == 0 || config.queue_pairs > MAX_QUEUE_PAIRS {
            return Err(BackendError::QueuePairs(config.queue_pairs));
        }
        if ports.len() != usize::from(config.queue_pairs) {
            return Err(BackendError::PortCount { ports: ports.len(), pairs: config.queue_pairs });
        }
        if config.mtu < 68 {
            return Err(BackendError::Mtu(config.mtu));
        }
        let eventfds = |n: usize| {
            (0..n).map(|_| EventFd::new(EFD_NONBLOCK)).collect::<io::Result<Vec<_>>>().map_err(BackendError::EventFd)
        };
        let resched = eventfds(ports.len())?;
        let exits = eventfds(ports.len())?;
        let fault = EventFd::new(EFD_NONBLOCK).map_err(BackendError::EventFd)?;
        let xsk_fds = ports.iter().map(|p| p.xsk_fd()).collect();
        let rx_sockets = ports.iter().map(|p| p.rx_socket()).collect();
        let pairs = ports
            .into_iter()
            .map(|port| {
                let (rx, tx) = (RxState::default(), TxState::default());
                let port_ep = Epoll::new()?;
                let timer = notify::nonblocking_timer()?;
                Ok(Mutex::new(Pair { port, rx, tx, port_ep, armed: false, tx_owed: None, timer, timer_armed: false }))
            })
            .collect::<io::Result<_>>()
            .map_err(BackendError::EventFd)?;
        Ok(NetBackend {
            config,
            pairs,
            resched,
            exits,
            fault,
            mem: RwLock::new(None),
            logged_mem: Mutex::new(None),
            log_all: AtomicBool::new(false),
            log_fd: Mutex::new(None),
            acked: AtomicU64::new(0),
            running: AtomicBool::new(false),
            active_pairs: AtomicU16::new(1),
            stats: (0..usize::from(config.queue_pairs)).map(|_| Stats::default()).collect(),
            xsk_fds,
            rx_sockets,
            connections: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            connection_errors: AtomicU64::new(0),
            signal_errors: AtomicU64::new(0),
            poll: DEFAULT_POLL,
            tx_notify_delay: DEFAULT_TX_NOTIFY_DELAY,
            rss: None,
            rss_config: Mutex::new(None),
            offloads: Offloads::ALL,
            guest_offloads: AtomicU64::new(u64::MAX),
        })
    }

    /// Offer virtio RSS and hash report, writing the guest's configuration into `map`.
    pub fn with_rss(mut self, mut map: RssMap) -> Self {
        map.write(None);
        self.rss = Some(Mutex::new(map));
        self
    }

    /// Offer these guest -> wire offloads (default: every one, [`Offloads::ALL`]).
    pub fn with_offloads(mut self, off: Offloads) -> Self {
        self.offloads = off;
        self
    }

    /// The virtio features the frontend acked (0 before it set any).
    pub fn acked_features(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// The guest's hashing configuration in force (None: the agent's default steering).
    pub fn rss_config(&self) -> Option<RssConfig> {
        lock(&self.rss_config).clone()
    }

    fn set_rss(&self, cfg: Option<RssConfig>) {
        if let Some(map) = &self.rss {
            lock(map).write(cfg.as_ref());
        }
        *lock(&self.rss_config) = cfg;
    }

    /// Set the polling window (zero: purely event-driven). See the module docs.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Hold a TX used-buffer notification the guest asked for up to `delay` (zero: send each at
    /// once), see `notify.rs`.
    pub fn with_tx_notify_delay(mut self, delay: Duration) -> Self {
        self.tx_notify_delay = delay;
        self
    }

    /// Device settings.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Datapath counters, summed over the queue pairs.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.iter().fold(StatsSnapshot::default(), |a, s| a.sum(s.snapshot()))
    }

    /// Datapath counters of each queue pair.
    pub fn pair_stats(&self) -> Vec<StatsSnapshot> {
        self.stats.iter().map(Stats::snapshot).collect()
    }

    /// The AF_XDP socket fd of each queue pair's port (None for other ports). The fds stay
    /// open for the backend's lifetime (the ports are owned by it).
    pub fn xsk_fds(&self) -> &[Option<std::os::fd::RawFd>] {
        &self.xsk_fds
    }

    /// The wire -> guest packet socket of each queue pair (None for ports without one).
    pub fn rx_sockets(&self) -> &[Option<Arc<RxSocketCounters>>] {
        &self.rx_sockets
    }

    /// Frames received from the port and waiting for guest RX buffers, per queue pair (takes
    /// each pair's lock briefly: for scrapes, not the datapath).
    pub fn rx_backlog(&self) -> Vec<usize> {
        self.pairs.iter().map(|p| lock(p).rx.backlog()).collect()
    }

    /// Frontend connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Frontend connections refused by the hostile-frontend checks (`validate.rs`); also
    /// counted in [`Self::connection_errors`].
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    pub(crate) fn count_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_refusal(&self) {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        self.count_connection_error();
    }

    /// Frontend connections that ended with a protocol error (malformed messages).
    pub fn connection_errors(&self) -> u64 {
        self.connection_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn count_connection_error(&self) {
        self.connection_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the device runs: its frontend acked the features (which QEMU sends at every
    /// device start, and while running only to switch the dirty log) and has stopped no ring
    /// since, nor disconnected. A live migration's source QEMU stops the device at the
    /// switch-over (and starts it again if the migration fails): the agent reads this to
    /// route the VM's address to the target at that moment.
    pub fn device_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Queue pairs the guest enabled with `VQ_PAIRS_SET` (1 until it does).
    pub fn active_pairs(&self) -> u16 {
        self.active_pairs.load(Ordering::Relaxed)
    }

    /// Event id of the port fd on a worker's epoll.
    pub fn port_event(&self) -> u64 {
        self.num_queues() as u64 + 1
    }

    /// Event id of the budget self-wakeup on a worker's epoll.
    pub fn resched_event(&self) -> u64 {
        self.num_queues() as u64 + 2
    }

    /// Event id of the held TX notification's timer on a worker's epoll.
    pub fn timer_event(&self) -> u64 {
        self.num_queues() as u64 + 3
    }

    /// Forget per-connection state: pending frames, negotiated features, active pairs.
    pub fn reset(&self) {
        for p in &self.pairs {
            let mut p = lock(p);
            p.rx.reset();
            p.tx_owed = None;
        }
        self.acked.store(0, Ordering::Relaxed);
        self.running.store(false, Ordering::SeqCst);
        self.guest_offloads.store(u64::MAX, Ordering::Relaxed);
        self.active_pairs.store(1, Ordering::Relaxed);
        if self.rss.is_some() && self.rss_config().is_some() {
            // A new guest (or a reset one) starts with the default steering.
            self.set_rss(None);
        }
    }

    /// Release everything a frontend connection held once its daemon is gone (workers joined):
    /// the guest memory (and its SIGBUS guard entries), a pending fault report and the exit
    /// events sent to the old workers (the next daemon's workers would otherwise exit at once).
    pub fn end_connection(&self) {
        if let Some(m) = self.memory() {
            for r in m.memory().iter() {
                region_bitmap(r).clear();
            }
        }
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = None;
        *lock(&self.logged_mem) = None;
        *lock(&self.log_fd) = None;
        self.log_all.store(false, Ordering::SeqCst);
        sigbus::unregister(self.owner());
        let _ = self.fault.read();
        for e in &self.exits {
            let _ = e.read();
        }
        self.reset();
    }

    /// A duplicate of the eventfd the SIGBUS guard writes when this backend's guest memory
    /// faulted (the relay polls it and ends the connection).
    pub fn fault_fd(&self) -> io::Result<EventFd> {
        self.fault.try_clone()
    }

    /// Identity of this backend in the SIGBUS guard's table.
    fn owner(&self) -> usize {
        self as *const NetBackend as usize
    }

    /// Register each pair's port fd, wakeup fd and timer on the worker thread that owns the pair.
    pub fn register_listeners(&self, handlers: &[Arc<VringEpollHandler<Arc<NetBackend>>>]) -> io::Result<()> {
        if handlers.len() != self.pairs.len() {
            return Err(io::Error::other(format!(
                "{} worker threads for {} queue pairs",
                handlers.len(),
                self.pairs.len()
            )));
        }
        for (i, h) in handlers.iter().enumerate() {
            let mut p = lock(&self.pairs[i]);
            // Edge-triggered: each port event reaches the worker once, with nothing to drain. The
            // port's own edge-triggered entry in port_ep wakes port_ep's waiters on every arrival,
            // already-reported or not, so each arrival is a new edge here too; port_ep itself
            // drops an entry that is no longer ready whenever it is polled.
            h.register_listener(p.port_ep.as_raw_fd(), EventSet::IN | EventSet::EDGE_TRIGGERED, self.port_event())?;
            self.arm_port(&mut p, true)?;
            h.register_listener(self.resched[i].as_raw_fd(), EventSet::IN, self.resched_event())?;
            h.register_listener(p.timer.as_raw_fd(), EventSet::IN, self.timer_event())?;
        }
        Ok(())
    }

    /// Put the port fd on (or take it off) the worker's epoll. Off, the port costs no wakeups
    /// (with AF_XDP every frame sent or received wakes the socket's waiters).
    /// Arming reports frames already waiting at once (epoll checks readiness on insertion).
    fn arm_port(&self, p: &mut Pair, on: bool) -> io::Result<()> {
        if p.armed == on {
            return Ok(());
        }
        let op = if on { ControlOperation::Add } else { ControlOperation::Delete };
        let ev = EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, 0);
        p.port_ep.ctl(op, p.port.fd(), ev)?;
        p.armed = on;
        Ok(())
    }

    fn set_port_armed(&self, pair: usize, on: bool) {
        let Some(p) = self.pairs.get(pair) else { return };
        if let Err(e) = self.arm_port(&mut lock(p), on) {
            warn!("queue pair {pair}: {} port fd: {e}", if on { "arm" } else { "disarm" });
        }
    }

    fn mode(&self) -> NetMode {
        let acked = self.acked.load(Ordering::Relaxed);
        let has = |bit: u32| acked & (1 << bit) != 0;
        NetMode {
            hdr_len: if has(VIRTIO_F_VERSION_1) || has(VIRTIO_NET_F_MRG_RXBUF) {
                net::HDR_LEN
            } else {
                net::LEGACY_HDR_LEN
            },
            mergeable: has(VIRTIO_NET_F_MRG_RXBUF),
            max_frame: usize::from(self.config.mtu) + L2_OVERHEAD,
            hash_report: false,
            offloads: Offloads::NONE,
            rx_hash: None,
        }
        .with_hash_report(has(rss::VIRTIO_NET_F_HASH_REPORT) && has(VIRTIO_F_VERSION_1))
        .with_rx_hash(lock(&self.rss_config).as_ref().map(|c| net::RxHash { types: c.hash_types, key: c.key }))
        .with_offloads(Offloads::from_features(self.offload_features(acked)))
    }

    /// The negotiated offload feature bits, minus the guest offloads the guest switched off.
    fn offload_features(&self, acked: u64) -> u64 {
        let on = self.guest_offloads.load(Ordering::Relaxed) | !net::GUEST_OFFLOAD_BITS;
        acked & self.offloads.features() & on
    }

    /// The guest offloads on (feature bits), as `CTRL_GUEST_OFFLOADS_SET` left them.
    pub fn guest_offloads(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
            & self.offloads.features()
            & net::GUEST_OFFLOAD_BITS
            & self.guest_offloads.load(Ordering::Relaxed)
    }

    fn ctrl_features(&self) -> net::CtrlFeatures {
        let acked = self.acked.load(Ordering::Relaxed);
        net::CtrlFeatures {
            rss: acked & (1 << rss::VIRTIO_NET_F_RSS) != 0,
            hash_report: acked & (1 << rss::VIRTIO_NET_F_HASH_REPORT) != 0,
            guest_offloads: if acked & (1 << net::VIRTIO_NET_F_CTRL_GUEST_OFFLOADS) != 0 {
                acked & self.offloads.features() & net::GUEST_OFFLOAD_BITS
            } else {
                0
            },
        }
    }

    fn memory(&self) -> Option<GuestMemoryAtomic<GuestMem>> {
        self.mem.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for NetBackend {
    fn drop(&mut self) {
        sigbus::unregister(self.owner());
    }
}

/// The file's I/O block size: the page size of its mapping (huge page size on hugetlbfs).
fn block_size(f: &std::fs::File) -> usize {
    use std::os::unix::fs::MetadataExt;
    f.metadata().map_or(0, |m| m.blksize() as usize).next_power_of_two()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock would be a bug; the state stays usable either way.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VhostUserBackend for NetBackend {
    type Bitmap = DirtyBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        2 * self.pairs.len() + 1
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let rss = if self.rss.is_some() { 1 << rss::VIRTIO_NET_F_RSS | 1 << rss::VIRTIO_NET_F_HASH_REPORT } else { 0 };
        // The guest may switch wire -> guest offloads at run time (`ethtool -K` in the guest).
        let ctrl_offloads = if self.offloads.guest_csum { 1 << net::VIRTIO_NET_F_CTRL_GUEST_OFFLOADS } else { 0 };
        VIRTIO_FEATURES
            | self.offloads.features()
            | ctrl_offloads
            | rss
            | 1 << VHOST_F_LOG_ALL
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.acked.store(features, Ordering::Relaxed);
        self.running.store(true, Ordering::SeqCst);
        // Feature negotiation turns every negotiated guest offload on.
        self.guest_offloads.store(u64::MAX, Ordering::Relaxed);
        let off = Offloads::from_features(features & self.offloads.features());
        info!("frontend acked features {features:#x}, offloads {off:?}");
        self.set_log_all(features & (1 << VHOST_F_LOG_ALL) != 0);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::LOG_SHMFD
    }

    fn reset_device(&self) {
        self.reset();
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // GET_VRING_BASE: the frontend stops the device (a ring of it at a time).
        if self.running.swap(false, Ordering::SeqCst) {
            info!("frontend stopped the device (ring {queue_index})");
        }
        Ok(())
    }

    fn set_event_idx(&self, _enabled: bool) {
        // The vrings already know (vhost-user-backend sets it on each queue); nothing else
        // depends on it here.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // Fields past `mtu` (speed, duplex, RSS) belong to features we do not offer and read as
        // zero, so a frontend asking for the full struct still gets an answer.
        let mut space = [0u8; CONFIG_SPACE_MAX];
        space[..12].copy_from_slice(&self.config.config_space());
        if self.rss.is_some() {
            // speed, duplex (12..17) stay zero; then rss_max_key_size,
            // rss_max_indirection_table_length, supported_hash_types.
            space[17] = rss::KEY_SIZE as u8;
            space[18..20].copy_from_slice(&(rss::TABLE_SIZE as u16).to_le_bytes());
            space[20..24].copy_from_slice(&rss::SUPPORTED_HASH_TYPES.to_le_bytes());
        }
        let (start, len) = (offset as usize, size as usize);
        match start.checked_add(len) {
            Some(end) if end <= space.len() => space[start..end].to_vec(),
            _ => Vec::new(),
        }
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::PermissionDenied, "virtio-net config space is read-only"))
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMem>) -> io::Result<()> {
        // Guard the new mappings against the file shrinking under them (see `sigbus.rs`).
        let maps: Vec<sigbus::Mapping> = mem
            .memory()
            .iter()
            .map(|r| sigbus::Mapping {
                start: r.as_ptr() as usize,
                len: r.len() as usize,
                align: r.file_offset().map_or(0, |f| block_size(f.file())),
            })
            .collect();
        sigbus::register(self.owner(), self.fault.as_raw_fd(), &maps)?;
        self.carry_log(&mem.memory().into_inner());
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        let n = self.pairs.len();
        (0..n)
            .map(|i| {
                let mask = 0b11u64 << (2 * i);
                if i == 0 {
                    mask | 1 << (2 * n)
                } else {
                    mask
                }
            })
            .collect()
    }

    /// vhost-user-backend 0.24 registers the consumer's fd on the worker's epoll with
    /// `consumer.into_raw_fd()` and never closes it: a fresh eventfd per daemon (one per
    /// connection) would leak one fd per worker per connection. So the consumer is this
    /// backend's own long-lived eventfd for the thread (drained in `end_connection`), and only
    /// the notifier, which upstream owns and closes, is a duplicate.
    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let Some(exit) = self.exits.get(thread_index) else {
            warn!("no exit eventfd for worker {thread_index}");
            return None;
        };
        let notifier = match exit.try_clone() {
            // SAFETY: a fresh duplicate, owned by nobody else; upstream owns and closes it.
            Ok(dup) => unsafe { EventNotifier::from_raw_fd(dup.into_raw_fd()) },
            Err(e) => {
                warn!("duplicate exit eventfd: {e}");
                return None;
            }
        };
        // SAFETY: the fd stays open for the backend's lifetime (`self.exits`). Upstream turns
        // this consumer straight back into a raw fd (`into_raw_fd`, no close) to put it on the
        // worker's epoll, so it is never closed through the consumer. Re-check this when
        // upgrading vhost-user-backend (`VringEpollHandler::new`).
        let consumer = unsafe { EventConsumer::from_raw_fd(exit.as_raw_fd()) };
        Some((consumer, notifier))
    }

    fn handle_event(&self, device_event: u16, _evset: EventSet, vrings: &[Vring], thread_id: usize) -> io::Result<()> {
        let pair = thread_id;
        let event = u64::from(device_event);
        let (Some(rx), Some(tx)) = (vrings.first(), vrings.get(1)) else {
            warn!("worker {thread_id} has {} vrings, expected 2 or 3", vrings.len());
            return Ok(());
        };
        match device_event {
            0 | 1 if !self.poll.is_zero() => self.serve(pair, rx, tx),
            0 => {
                self.run_rx(pair, rx);
            }
            1 => {
                if self.run_tx(pair, tx, false).more {
                    self.resched(pair)
                }
            }
            2 if pair == 0 => {
                if let Some(ctrl) = vrings.get(2) {
                    self.run_ctrl(ctrl);
                }
                return Ok(());
            }
            _ if event == self.port_event() => self.serve(pair, rx, tx),
            _ if event == self.resched_event() => {
                if let Some(r) = self.resched.get(pair) {
                    let _ = r.read();
                }
                self.serve(pair, rx, tx);
            }
            _ if event == self.timer_event() => self.timer_fired(pair),
            _ => {
                warn!("worker {thread_id}: unknown event {device_event}");
                return Ok(());
            }
        }
        // After every event of the pair: a held TX notification is sent, dropped or timed.
        self.settle_tx(pair, tx);
        Ok(())
    }
}
