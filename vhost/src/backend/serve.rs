//! The serve loop of a queue pair's worker: one run of a queue under its locks, the adaptive
//! polling loop over both queues of a pair, re-arming the guest's kicks and the port before the
//! worker sleeps, and the control queue (module docs of `backend.rs`).

use super::notify::Side;
use super::*;

impl NetBackend {
    /// Run one queue of `pair` with the pair state and the vring locked.
    pub(super) fn run(
        &self,
        pair: usize,
        side: Side,
        vring: &Vring,
        f: impl FnOnce(&mut Pair, &mut virtio_queue::Queue, &GuestMem, NetMode, &Stats) -> QueueRun,
    ) -> Served {
        let start = Instant::now();
        let Some(atomic) = self.memory() else { return Served::default() };
        let mem = atomic.memory();
        let (Some(p), Some(stats)) = (self.pairs.get(pair), self.stats.get(pair)) else {
            return Served::default();
        };
        let mut p = lock(p);
        let mut vs = vring.get_mut();
        if !vs.get_queue().ready() || !vs.is_enabled() {
            return Served::default();
        }
        let old_used = vs.get_queue().next_used();
        let run = f(&mut p, vs.get_queue_mut(), &mem, self.mode(), stats);
        // One notification decision per run (not per frame), from the used index before it.
        if run.used {
            let q = vs.get_queue();
            let asked = net::needs_signal(q, &*mem, old_used, stats);
            let signal = if side == Side::Tx && self.holds_tx(q) {
                let now = net::moderate_tx(&mut p.tx_owed, asked, old_used, q.next_used(), start);
                if asked && !now {
                    Stats::add(&stats.tx_notify_held, 1);
                } else if now && !asked {
                    Stats::add(&stats.tx_notify_late, 1);
                }
                now
            } else {
                asked
            };
            drop(p);
            if signal {
                self.signal(
                    pair,
                    &vs,
                    if side == Side::Rx { &stats.rx_notifications } else { &stats.tx_notifications },
                );
            }
            if self.log_all.load(Ordering::Relaxed) {
                self.signal_log();
            }
        }
        if run.handled > 0 {
            // Busy time: runs that moved something, their notification included.
            Stats::add(&stats.busy_ns, start.elapsed().as_nanos() as u64);
        }
        Served { handled: run.handled, more: run.more }
    }

    pub(super) fn resched(&self, pair: usize) {
        if let Err(e) = self.resched[pair].write(1) {
            warn!("queue pair {pair}: reschedule: {e}");
        }
    }

    pub(super) fn run_rx(&self, pair: usize, vring: &Vring) -> Served {
        self.run(pair, Side::Rx, vring, |p, q, mem, mode, stats| {
            net::rx_queue(q, mem, p.port.as_mut(), &mut p.rx, mode, stats, BUDGET)
        })
    }

    /// Run TX; with `poll` guest kicks stay disabled when the queue runs empty.
    pub(super) fn run_tx(&self, pair: usize, vring: &Vring, poll: bool) -> Served {
        self.run(pair, Side::Tx, vring, |p, q, mem, mode, stats| {
            let (port, st) = (p.port.as_mut(), &mut p.tx);
            if poll {
                net::tx_poll(q, mem, port, st, mode, stats, BUDGET)
            } else {
                net::tx_queue(q, mem, port, st, mode, stats, BUDGET)
            }
        })
    }

    /// Re-enable TX kicks before sleeping; true when chains arrived meanwhile.
    pub(super) fn arm_tx(&self, pair: usize, vring: &Vring) -> bool {
        let (Some(atomic), Some(stats)) = (self.memory(), self.stats.get(pair)) else { return false };
        let mut vs = vring.get_mut();
        if !vs.get_queue().ready() || !vs.is_enabled() {
            return false;
        }
        net::arm_tx(vs.get_queue_mut(), &*atomic.memory(), stats)
    }

    /// Serve pair `pair` after an event: both queues, then (with polling) keep polling until
    /// nothing arrived for `self.poll`, re-arm notifications and re-check before returning.
    /// Returns early, with a self-wakeup queued, when a run hits its budget (other events of
    /// the worker, e.g. exit, get their turn).
    pub(super) fn serve(&self, pair: usize, rx: &Vring, tx: &Vring) {
        if self.poll.is_zero() {
            let (t, r) = (self.run_tx(pair, tx, false), self.run_rx(pair, rx));
            if t.more || r.more {
                self.resched(pair);
            }
            return;
        }
        let mut last_work = Instant::now();
        let (mut busy_rounds, mut rechecked) = (0u32, false);
        loop {
            let (t, r) = (self.run_tx(pair, tx, true), self.run_rx(pair, rx));
            if t.more || r.more {
                self.set_port_armed(pair, false);
                self.resched(pair);
                return;
            }
            if t.handled + r.handled > 0 {
                self.settle_tx(pair, tx);
                last_work = Instant::now();
                rechecked = false;
                busy_rounds += 1;
                if busy_rounds == 2 {
                    // Sustained traffic: poll the port instead of taking its wakeups.
                    self.set_port_armed(pair, false);
                }
                continue;
            }
            if last_work.elapsed() < self.poll {
                std::hint::spin_loop();
                continue;
            }
            if rechecked {
                // Armed, and the recheck found nothing to do (or a corrupt ring): sleep.
                return;
            }
            // Going to sleep: re-arm, then look once more (work that raced with the arming).
            self.set_port_armed(pair, true);
            rechecked = true;
            if self.arm_tx(pair, tx) {
                continue;
            }
            return;
        }
    }

    pub(super) fn run_ctrl(&self, vring: &Vring) {
        let run = self.run(0, Side::Ctrl, vring, |_, q, mem, _, stats| {
            let (run, changes) = net::ctrl_queue(q, mem, self.config.queue_pairs, self.ctrl_features(), stats, BUDGET);
            if let Some(n) = changes.pairs {
                info!("guest enabled {n} queue pair(s)");
                self.active_pairs.store(n, Ordering::Relaxed);
            }
            if let Some(c) = changes.rss {
                info!(
                    "guest {} hash types {:#x}, {} table entries",
                    if c.steer { "set RSS:" } else { "set hash report:" },
                    c.hash_types,
                    c.table.len()
                );
                self.set_rss(Some(c).filter(|c| c.hash_types != 0));
            }
            if let Some(on) = changes.guest_offloads {
                info!("guest set its offloads to {on:#x}");
                self.guest_offloads.store(on, Ordering::Relaxed);
            }
            run
        });
        if run.more {
            self.resched(0);
        }
    }
}
