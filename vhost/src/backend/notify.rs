//! Holding back TX used-buffer notifications (`--tx-notify-delay-us`, default
//! [`DEFAULT_TX_NOTIFY_DELAY`]): interrupt moderation for the guest's transmit completions.
//!
//! A Linux guest asks for a notification after almost every TX chain it posts (napi_tx re-arms
//! `used_event` at the next entry when few are outstanding): one interrupt per pure ACK or small
//! response, and under TCG each costs QEMU's main loop a wake-up (it reads the call eventfd and
//! injects the interrupt) besides the guest's own interrupt handling. The same guest frees its
//! finished TX buffers whenever it polls the pair's RX queue (`virtnet_poll_cleantx`), so while
//! frames flow towards it, most of those interrupts tell it nothing new.
//!
//! So, with EVENT_IDX and no dirty logging (a migration gets every notification at once):
//! - a TX run whose `used_event` asks for a notification holds it instead ([`net::moderate_tx`],
//!   counted `tx_notify_held`), and the pair's timer is armed (for ten delays) unless it is;
//! - after every event of the pair ([`NetBackend::settle_tx`]) a held notification is dropped
//!   when the guest shows it consumed those entries (it moved `used_event` to or past them,
//!   [`net::tx_consumed`]), else sent once its delay ran out, counted `tx_notify_late`; on a pair
//!   that goes quiet the timer's event sends it, at most ten delays after it was held;
//! - it goes at once when [`net::TX_NOTIFY_MAX_FRAMES`] entries wait unconsumed, so a guest that
//!   frees TX buffers only on their interrupt (or one that sends without receiving) is delayed
//!   by at most the delay per that many chains, never stalled.
//!
//! A guest that never consumes gets every notification, each at most the delay late while its
//! pair has traffic (ten delays when it has none); a guest writing odd `used_event` values only
//! changes when it is told, as without moderation.

use super::*;

/// A held notification of a pair with no events waits for the timer: at most this many times
/// the delay.
const IDLE_FACTOR: u32 = 10;

/// Which queue a run serves (the notification rules differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Rx,
    Tx,
    Ctrl,
}

impl NetBackend {
    /// Whether TX notifications on queue `q` may be held: a delay is set, EVENT_IDX is on (the
    /// only way to see the guest consume) and no migration is logging.
    pub(super) fn holds_tx(&self, q: &virtio_queue::Queue) -> bool {
        !self.tx_notify_delay.is_zero() && q.event_idx_enabled() && !self.log_all.load(Ordering::Relaxed)
    }

    /// Notify the guest of used buffers on the queue of `vs`, counted in `sent`.
    pub(super) fn signal(&self, pair: usize, vs: &VringState<GuestMemoryAtomic<GuestMem>>, sent: &AtomicU64) {
        if let Err(e) = vs.signal_used_queue() {
            // A call eventfd at its maximum count (the frontend never reads it) fails every time:
            // log the 1st, 2nd, 4th, 8th... failure only.
            let n = self.signal_errors.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                warn!("queue pair {pair}: signal guest: {e} ({n} failed signals)");
            }
        } else {
            Stats::add(sent, 1);
        }
    }

    /// Settle pair `pair`'s held TX notification: drop it when the guest consumed its entries,
    /// send it when its delay ran out (or holding stopped), else make sure the timer will look
    /// again. The timer is the fallback for a pair that goes quiet: armed only when it is not
    /// armed, for [`IDLE_FACTOR`] times the delay (a later episode is left to its expiry, which
    /// re-arms for what remains). While events come, this check at each of them enforces the
    /// delay itself; so a steady stream of held notifications costs a timer syscall and wake-up
    /// per ten delays, not one per notification (each costs about what a notification saves).
    pub(super) fn settle_tx(&self, pair: usize, tx: &Vring) {
        let (Some(p), Some(stats)) = (self.pairs.get(pair), self.stats.get(pair)) else { return };
        let mut p = lock(p);
        let Some(owed) = p.tx_owed else { return };
        let Some(atomic) = self.memory() else {
            p.tx_owed = None;
            return;
        };
        let mem = atomic.memory();
        let vs = tx.get_mut();
        let q = vs.get_queue();
        if !q.ready() || !vs.is_enabled() || net::tx_consumed(q, &*mem, owed.used) {
            p.tx_owed = None;
            return;
        }
        let age = owed.since.elapsed();
        let mut due = age >= self.tx_notify_delay || !self.holds_tx(q);
        if !due && !p.timer_armed {
            match p.timer.reset(self.tx_notify_delay * IDLE_FACTOR - age, None) {
                Ok(()) => p.timer_armed = true,
                Err(e) => {
                    // Without its timer a held notification could wait for the next event: send it.
                    warn!("queue pair {pair}: arm the TX notification timer: {e}");
                    due = true;
                }
            }
        }
        if due {
            p.tx_owed = None;
            drop(p);
            self.signal(pair, &vs, &stats.tx_notifications);
            Stats::add(&stats.tx_notify_late, 1);
        }
    }

    /// The pair's timer fired: consume the expiry; `settle_tx`, which runs after every event,
    /// then sends, drops or re-arms for the episode held now.
    pub(super) fn timer_fired(&self, pair: usize) {
        let Some(p) = self.pairs.get(pair) else { return };
        let mut p = lock(p);
        if p.timer.wait().is_ok() {
            p.timer_armed = false;
        }
    }
}

/// A timerfd that reads without blocking (an expiry discarded by re-arming must not block the
/// worker in `read`).
pub(super) fn nonblocking_timer() -> io::Result<TimerFd> {
    // SAFETY: timerfd_create takes no pointers; the result is checked before use.
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new timerfd this function owns.
    Ok(unsafe { TimerFd::from_raw_fd(fd) })
}
