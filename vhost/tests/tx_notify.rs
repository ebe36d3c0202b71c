//! Held TX notifications (`--tx-notify-delay-us`, `backend/notify.rs`) through a real vhost-user
//! connection: a notification the guest asked for is held, dropped when the guest shows it
//! consumed the buffers, sent when its delay runs out or when 32 buffers wait, and never held
//! with the delay at zero.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{frame, socket_path, Guest, GUEST_FEATURES, QSIZE};
use lanekit_vhost::port::{channel_port, ChannelPeer, Port};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};
use vm_memory::{Bytes, GuestAddress};

const T: Duration = Duration::from_secs(5);
const RX: usize = 0;
const TX: usize = 1;

fn start(name: &str, delay: Duration) -> (Arc<NetBackend>, ChannelPeer, JoinHandle<()>, std::path::PathBuf) {
    let path = socket_path(name);
    let (port, peer) = channel_port(0).unwrap();
    let ports: Vec<Box<dyn Port>> = vec![Box::new(port)];
    let cfg = DeviceConfig { mac: [0x52, 0x54, 0, 1, 2, 3], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, ports).unwrap().with_tx_notify_delay(delay));
    let (b, p) = (backend.clone(), path.clone());
    let h = std::thread::spawn(move || serve(b, &p, Some(1)).unwrap());
    (backend, peer, h, path)
}

fn end(g: Guest, h: JoinHandle<()>, path: &Path) {
    drop(g);
    h.join().unwrap();
    let _ = std::fs::remove_file(path);
}

/// Where the driver writes a queue's `used_event` (after the avail ring's entries).
fn used_event(g: &Guest, q: usize) -> GuestAddress {
    GuestAddress(g.queues[q].base + 16 * u64::from(QSIZE) + 4 + 2 * u64::from(QSIZE))
}

/// Notifications the guest got on queue `q` since the last read.
fn calls(g: &Guest, q: usize) -> u64 {
    g.queues[q].call.read().unwrap_or(0)
}

/// Wait (up to [`T`]) for a notification on queue `q`; `what` names it in the failure.
fn wait_call(g: &Guest, q: usize, what: &str) {
    let deadline = Instant::now() + T;
    while calls(g, q) == 0 {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Send one frame on TX and wait until the backend returned the chain.
fn send_one(g: &mut Guest, peer: &ChannelPeer, seed: u8) {
    let used = g.used_idx(TX);
    g.send(TX, &[frame(100, seed)]);
    assert_eq!(peer.wait_sent(1, T).len(), 1);
    assert!(g.wait_used(TX, used.wrapping_add(1), T), "the TX chain was not returned");
}

#[test]
fn a_held_tx_notification_is_dropped_once_the_guest_consumed_its_buffers() {
    // A delay the steps below take far less than, then a wait beyond it: a notification still
    // held (not dropped) would be sent by then.
    let delay = Duration::from_secs(1);
    let (backend, peer, h, path) = start("notify-consumed", delay);
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    // used_event 0: the guest asks to be told when entry 0 is used.
    send_one(&mut g, &peer, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls(&g, TX), 0, "the notification is held");
    // The guest frees its TX buffers while it polls RX (Linux's virtnet_poll_cleantx) and re-arms
    // used_event at the next entry; then a frame arrives for it: that event settles the held one.
    g.mem.write_obj(1u16.to_le(), used_event(&g, TX)).unwrap();
    g.post_rx(RX, 4);
    assert!(peer.inject(&frame(200, 2)));
    assert!(g.wait_used(RX, 1, T), "the frame was not delivered");
    // Past the delay, another event on the pair (a held notification would go now).
    std::thread::sleep(delay + delay / 2);
    assert!(peer.inject(&frame(200, 3)));
    assert!(g.wait_used(RX, 2, T), "the second frame was not delivered");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls(&g, TX), 0, "a notification the guest no longer needed was sent");
    assert!(calls(&g, RX) >= 1, "the RX notification was held too");
    let s = backend.stats();
    assert_eq!((s.tx_notify_held, s.tx_notify_late, s.tx_notifications), (1, 0, 0), "{s:?}");
    end(g, h, &path);
}

#[test]
fn a_held_tx_notification_is_sent_when_its_delay_runs_out() {
    let delay = Duration::from_millis(30);
    let (backend, peer, h, path) = start("notify-late", delay);
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    let sent = Instant::now();
    send_one(&mut g, &peer, 1);
    // Nothing else happens on the pair: the timer sends it, not before the delay.
    wait_call(&g, TX, "the held notification was never sent");
    assert!(sent.elapsed() >= delay, "sent after {:?}, before the delay", sent.elapsed());
    let s = backend.stats();
    assert_eq!((s.tx_notify_held, s.tx_notify_late, s.tx_notifications), (1, 1, 1), "{s:?}");
    end(g, h, &path);
}

#[test]
fn a_held_tx_notification_is_sent_once_32_buffers_wait() {
    let (backend, peer, h, path) = start("notify-limit", Duration::from_secs(5));
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    // A guest that frees TX buffers only on their notification and never receives.
    for i in 0..31u8 {
        send_one(&mut g, &peer, i);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(calls(&g, TX), 0, "held while fewer than 32 wait");
    send_one(&mut g, &peer, 31);
    wait_call(&g, TX, "32 buffers wait and the guest was not told");
    let s = backend.stats();
    assert_eq!((s.tx_frames, s.tx_notify_held, s.tx_notify_late), (32, 1, 1), "{s:?}");
    end(g, h, &path);
}

#[test]
fn no_delay_sends_every_tx_notification_at_once() {
    let (backend, peer, h, path) = start("notify-off", Duration::ZERO);
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    send_one(&mut g, &peer, 1);
    wait_call(&g, TX, "the notification was not sent");
    let s = backend.stats();
    assert_eq!((s.tx_notify_held, s.tx_notify_late, s.tx_notifications), (0, 0, 1), "{s:?}");
    end(g, h, &path);
}
