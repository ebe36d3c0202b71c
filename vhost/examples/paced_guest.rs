//! paced_guest: a virtio-net guest driver over vhost-user that transmits at a fixed rate, or
//! receives what arrives, the way a VM's driver does and not as a busy-polling DPDK frontend:
//! it sleeps between rounds, kicks the device only when the device asked for it (EVENT_IDX's
//! avail_event, else the used ring's NO_NOTIFY flag) and leaves interrupts off (used_event is
//! never moved, so a backend that honours EVENT_IDX does not signal).
//!
//! Used by lanekit's CPU-per-frame comparison (pkg/bench, `lab bench --vm-backend`): the same
//! offered load for lanekit-vhost and testpmd's vhost PMD, below what either carries.
//!
//! `paced_guest --socket PATH --mode tx --rate PPS [--size N] [--duration SECS]`: frames of N
//! bytes (one descriptor each: 12-byte virtio header, then the frame), paced in rounds of about
//! 50 µs (the frames due since the start, at most a ring's worth of free slots).
//! `paced_guest --socket PATH --mode rx`: posts 2048-byte buffers, counts what the backend used.
//! Both print "ready" on stderr once the queues are set up, then "frames N" on stdout every
//! `--report-ms` (frames posted for tx, received for rx), and stop after `--duration` or on a line
//! (or end of file) on stdin.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use common::{Guest, BUF, GUEST_FEATURES, QSIZE};
use vm_memory::{Bytes, GuestAddress};

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Mode {
    Tx,
    Rx,
}

#[derive(Parser, Debug)]
struct Args {
    /// vhost-user socket of the backend.
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, value_enum)]
    mode: Mode,
    /// Frames per second to transmit (tx).
    #[arg(long, default_value_t = 50_000)]
    rate: u64,
    /// Frame size in bytes without the virtio header (tx), 60..=1514.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(60..=1514))]
    size: u16,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Print the frame count this often.
    #[arg(long, default_value_t = 10)]
    report_ms: u64,
    /// Also stop when a line (or end of file) arrives on stdin.
    #[arg(long)]
    stdin_stop: bool,
}

const HDR: usize = 12;
const EVENT_IDX: u64 = 1 << 29;
const VRING_USED_F_NO_NOTIFY: u16 = 1;
/// Sleep between rounds (plus the kernel's timer slack).
const ROUND: Duration = Duration::from_micros(50);

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("paced_guest: {e}");
        std::process::exit(1);
    }
}

/// The ring addresses of queue `q` as `Guest::connect` laid them out.
struct Ring {
    avail: u64,
    used: u64,
}

fn ring(g: &Guest, q: usize) -> Ring {
    let avail = g.queues[q].base + 16 * u64::from(QSIZE);
    Ring { avail, used: (avail + 6 + 2 * u64::from(QSIZE) + 3) & !3 }
}

/// vring_need_event: kick when the device's event index lies in (old, new].
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Kick queue `q` after its avail index moved from `old` to `new`, if the device wants it.
fn maybe_kick(g: &Guest, r: &Ring, q: usize, old: u16, new: u16) -> Result<bool, String> {
    // The avail index store must be visible before the device's suppression state is read.
    fence(Ordering::SeqCst);
    let kick = if g.features & EVENT_IDX != 0 {
        let ev: u16 = g
            .mem
            .load(GuestAddress(r.used + 4 + 8 * u64::from(QSIZE)), Ordering::Acquire)
            .map_err(|e| e.to_string())?;
        need_event(ev, new, old)
    } else {
        let flags: u16 = g.mem.load(GuestAddress(r.used), Ordering::Acquire).map_err(|e| e.to_string())?;
        flags & VRING_USED_F_NO_NOTIFY == 0
    };
    if kick {
        g.kick(q);
    }
    Ok(kick)
}

fn avail_idx(g: &Guest, r: &Ring) -> Result<u16, String> {
    g.mem.load(GuestAddress(r.avail + 2), Ordering::Relaxed).map_err(|e| e.to_string())
}

fn run(a: Args) -> Result<(), String> {
    if a.mode == Mode::Tx && a.rate == 0 {
        return Err("--rate must be positive".into());
    }
    let mut g = Guest::connect(&a.socket, 1, GUEST_FEATURES);
    let (rxq, txq) = (0usize, 1usize);
    let (rr, tr) = (ring(&g, rxq), ring(&g, txq));
    let size = usize::from(a.size);
    if a.mode == Mode::Tx {
        // Every slot holds a zero header and a frame once: a round only posts descriptors.
        let mut f = vec![0u8; HDR + size];
        f[HDR..HDR + 14].copy_from_slice(&[0x02, 0x6c, 0x6b, 0, 0, 0x02, 0x02, 0x6c, 0x6b, 0, 0, 0x01, 0x88, 0xb5]);
        for slot in 0..u64::from(QSIZE) {
            g.mem.write_slice(&f, GuestAddress(g.queues[txq].bufs + slot * BUF)).map_err(|e| e.to_string())?;
        }
    } else {
        for _ in 0..QSIZE {
            let slot = u64::from(avail_idx(&g, &rr)? % QSIZE);
            let addr = g.queues[rxq].bufs + slot * BUF;
            g.add_chain(rxq, &[(addr, BUF as u32, true)]);
        }
        g.kick(rxq);
    }
    let stop = Arc::new(AtomicBool::new(false));
    if a.stdin_stop {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            stop.store(true, Ordering::Relaxed);
        });
    }
    eprintln!("ready");
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.duration);
    let every = Duration::from_millis(a.report_ms.max(1));
    let mut next_report = start;
    let mut out = std::io::stdout().lock();
    let (mut frames, mut kicks) = (0u64, 0u64);
    let mut seen = 0u16; // used entries consumed (tx: completed; rx: received)
    loop {
        let now = Instant::now();
        if now >= next_report {
            writeln!(out, "frames {frames}").map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
            next_report += every;
        }
        if now >= end || stop.load(Ordering::Relaxed) {
            break;
        }
        match a.mode {
            Mode::Tx => {
                seen = g.used_idx(txq);
                let posted = avail_idx(&g, &tr)?;
                let free = QSIZE - posted.wrapping_sub(seen);
                let due = (now.duration_since(start).as_secs_f64() * a.rate as f64) as u64;
                let n = due.saturating_sub(frames).min(u64::from(free)) as u16;
                if n > 0 {
                    for i in 0..n {
                        let slot = u64::from(posted.wrapping_add(i) % QSIZE);
                        let addr = g.queues[txq].bufs + slot * BUF;
                        g.add_chain(txq, &[(addr, (HDR + size) as u32, false)]);
                    }
                    frames += u64::from(n);
                    kicks += u64::from(maybe_kick(&g, &tr, txq, posted, posted.wrapping_add(n))?);
                }
            }
            Mode::Rx => {
                let used = g.used_idx(rxq);
                if used != seen {
                    let old = avail_idx(&g, &rr)?;
                    while seen != used {
                        let (head, _len) = g.used_elem(rxq, seen);
                        seen = seen.wrapping_add(1);
                        let addr = g.queues[rxq].bufs + u64::from(head) * BUF;
                        g.add_chain(rxq, &[(addr, BUF as u32, true)]);
                        frames += 1;
                    }
                    let new = avail_idx(&g, &rr)?;
                    kicks += u64::from(maybe_kick(&g, &rr, rxq, old, new)?);
                }
            }
        }
        std::thread::sleep(ROUND);
    }
    writeln!(out, "frames {frames}").map_err(|e| e.to_string())?;
    eprintln!("done: {frames} frames, {kicks} kicks, {:.3}s", start.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn need_event_window() {
        assert!(need_event(5, 6, 5)); // the device waits for index 5: moving 5 -> 6 passes it
        assert!(!need_event(7, 6, 5));
        assert!(need_event(0, 2, 65535)); // across the wrap
        assert!(!need_event(4, 6, 5));
    }
}
