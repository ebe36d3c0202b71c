//! The backend driven through a real vhost-user connection (`vhost::vhost_user::Frontend`) with
//! memfd guest memory and rings laid out by the test: no VM needed.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{frame, socket_path, Guest, GUEST_FEATURES};
use lanekit_vhost::port::{channel_port, ChannelPeer, Port};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
const T: Duration = Duration::from_secs(5);

fn start(pairs: u16, connections: usize, path: &Path) -> (Arc<NetBackend>, Vec<ChannelPeer>, JoinHandle<()>) {
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    let mut peers = Vec::new();
    for i in 0..usize::from(pairs) {
        let (p, peer) = channel_port(i).unwrap();
        ports.push(Box::new(p));
        peers.push(peer);
    }
    let backend = Arc::new(NetBackend::new(DeviceConfig { mac: MAC, queue_pairs: pairs, mtu: 1500 }, ports).unwrap());
    let (b, p) = (backend.clone(), path.to_path_buf());
    let h = std::thread::spawn(move || serve(b, &p, Some(connections)).unwrap());
    (backend, peers, h)
}

fn exchange(g: &mut Guest, peer: &ChannelPeer, pair: usize, n: usize, seed: u8) {
    let (rxq, txq) = (2 * pair, 2 * pair + 1);
    // Guest -> port.
    let out: Vec<Vec<u8>> = (0..n).map(|i| frame(60 + 97 * i, seed + i as u8)).collect();
    let used_before = g.used_idx(txq);
    g.send(txq, &out);
    assert_eq!(peer.wait_sent(n, T), out, "frames sent by the guest on pair {pair}");
    assert!(g.wait_used(txq, used_before + n as u16, T), "tx chains returned");
    // Port -> guest.
    let rx_before = g.used_idx(rxq);
    g.post_rx(rxq, n as u16);
    let inbound: Vec<Vec<u8>> = (0..n).map(|i| frame(1514 - 50 * i, seed ^ 0x55)).collect();
    for f in &inbound {
        assert!(peer.inject(f));
    }
    assert!(g.wait_used(rxq, rx_before + n as u16, T), "rx frames delivered on pair {pair}");
    assert_eq!(g.rx_frames(rxq, rx_before, rx_before + n as u16), inbound);
}

#[test]
fn frames_flow_both_ways_on_every_queue_pair_with_config_and_ctrl() {
    let path = socket_path("flow");
    let (backend, peers, h) = start(2, 1, &path);
    let mut g = Guest::connect(&path, 2, GUEST_FEATURES);
    let cfg = g.config();
    assert_eq!(&cfg[..6], &MAC);
    assert_eq!(u16::from_le_bytes([cfg[6], cfg[7]]), 1, "link up");
    assert_eq!(u16::from_le_bytes([cfg[8], cfg[9]]), 2, "max queue pairs");
    assert_eq!(u16::from_le_bytes([cfg[10], cfg[11]]), 1500, "mtu");
    // The whole virtio_net_config (24 bytes): fields of features not offered read as zero.
    let full = g.config_bytes(24);
    assert_eq!((&full[..12], &full[12..]), (&cfg[..], &[0u8; 12][..]));
    assert_eq!(g.ctrl(&[4, 0, 2, 0]), 0, "VQ_PAIRS_SET 2 is accepted");
    assert_eq!(backend.active_pairs(), 2);
    assert_eq!(g.ctrl(&[4, 0, 3, 0]), 1, "more pairs than offered is refused");
    assert_eq!(g.ctrl(&[1, 1, 0, 0, 0, 0, 0, 0]), 1, "MAC_ADDR_SET is not offered");
    exchange(&mut g, &peers[0], 0, 8, 1);
    exchange(&mut g, &peers[1], 1, 8, 2);
    // EVENT_IDX: the guest left used_event at 0, so the first completions were signalled (TX's
    // after the hold of backend/notify.rs: this guest never shows it consumed them).
    assert!(g.queues[0].call.read().is_ok(), "rx call eventfd signalled");
    let deadline = std::time::Instant::now() + T;
    while g.queues[1].call.read().is_err() {
        assert!(std::time::Instant::now() < deadline, "tx call eventfd never signalled");
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = backend.stats();
    assert_eq!((s.tx_frames, s.rx_frames, s.errors), (16, 16, 0), "{s:?}");
    // Busy time: the runs that moved these frames count, idle ones (polling included) do not.
    assert!(s.busy_ns > 0, "{s:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(backend.stats().busy_ns, s.busy_ns, "busy time grew with nothing to move");
    drop(g);
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn frames_wait_in_the_port_until_the_guest_posts_buffers() {
    let path = socket_path("backlog");
    let (backend, peers, h) = start(1, 1, &path);
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    for i in 0..20 {
        assert!(peers[0].inject(&frame(100, i)));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(g.used_idx(0), 0);
    g.post_rx(0, 5);
    assert!(g.wait_used(0, 5, T));
    g.post_rx(0, 15);
    assert!(g.wait_used(0, 20, T));
    let got = g.rx_frames(0, 0, 20);
    assert_eq!(got, (0..20).map(|i| frame(100, i)).collect::<Vec<_>>());
    assert_eq!(backend.stats().rx_dropped, 0);
    drop(g);
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn legacy_guest_without_protocol_features_or_mergeable_buffers() {
    let path = socket_path("legacy");
    let (_backend, peers, h) = start(1, 1, &path);
    // VERSION_1 only: 12-byte header, num_buffers = 1, rings enabled by SET_FEATURES.
    let mut g = Guest::connect(&path, 1, 1 << 32);
    exchange(&mut g, &peers[0], 0, 4, 9);
    drop(g);
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn traffic_flows_again_after_the_frontend_reconnects() {
    let path = socket_path("reconnect");
    let (backend, peers, h) = start(1, 3, &path);
    for round in 0..3u8 {
        let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
        exchange(&mut g, &peers[0], 0, 5, round * 10);
        // Frames left in the port when the guest goes away are not delivered to the next one
        // with stale rings; the next guest sees only what arrives for it.
        drop(g);
    }
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
    let s = backend.stats();
    assert_eq!((s.tx_frames, s.rx_frames), (15, 15));
}

/// QEMU (virtio-net realize) sends SET_VRING_ENABLE before SET_FEATURES; the connection must
/// survive it (vhost-user-backend alone drops it with "inactive feature").
#[test]
fn set_vring_enable_before_set_features_keeps_the_connection() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    let msg = |req: u32, flags: u32, payload: &[u8]| -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(req.to_le_bytes());
        m.extend(flags.to_le_bytes());
        m.extend((payload.len() as u32).to_le_bytes());
        m.extend(payload);
        m
    };
    let reply = |s: &mut UnixStream| -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 12];
        s.read_exact(&mut h).expect("reply header");
        let f = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let mut p = vec![0u8; f(8) as usize];
        s.read_exact(&mut p).expect("reply payload");
        (f(0), f(4), p)
    };
    let path = socket_path("early-enable");
    let (_backend, _peers, h) = start(1, 1, &path);
    // The path appears at bind(), before listen(): connect until it answers.
    let deadline = std::time::Instant::now() + T;
    let mut s = loop {
        match UnixStream::connect(&path) {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() >= deadline => panic!("connect {}: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&msg(3, 1, &[])).unwrap(); // SET_OWNER
    let enable = [0u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
    s.write_all(&msg(18, 1 | 8, &enable)).unwrap(); // SET_VRING_ENABLE, NEED_REPLY
    let (req, flags, payload) = reply(&mut s);
    assert_eq!((req, flags & 0x4, payload), (18, 0x4, vec![0u8; 8]), "acked");
    s.write_all(&msg(1, 1, &[])).unwrap(); // GET_FEATURES
    let (req, _, payload) = reply(&mut s);
    assert_eq!(req, 1);
    let features = u64::from_le_bytes(payload.try_into().unwrap());
    assert_ne!(features & (1 << 30), 0, "connection still alive and offering protocol features");
    s.write_all(&msg(2, 1, &features.to_le_bytes())).unwrap(); // SET_FEATURES: replays the enable
    s.write_all(&msg(1, 1, &[])).unwrap();
    assert_eq!(reply(&mut s).0, 1, "still alive after the replay");
    drop(s);
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// `VIRTIO_NET_F_CTRL_GUEST_OFFLOADS`: the guest switches wire -> guest offloads at run time
/// (`ethtool -K eth0 rx off` / `lro off` in a Linux guest send `GUEST_OFFLOADS_SET`). One flow's
/// frames are coalesced and marked DATA_VALID only while the guest has those offloads on; a set
/// with a bit that is no guest offload or was not negotiated is refused and changes nothing.
#[test]
fn guest_switches_its_rx_offloads_with_ctrl_guest_offloads() {
    const CSUM: u64 = 1 << 1;
    const TSO: u64 = 1 << 7 | 1 << 8;
    let path = socket_path("guest-offloads");
    let (backend, peers, h) = start(1, 1, &path);
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES | TSO | 1 << 2);
    assert_eq!(backend.guest_offloads(), CSUM | TSO, "negotiation turns every guest offload on");
    let set = |g: &mut Guest, bits: u64| g.ctrl(&[&[5u8, 0][..], &bits.to_le_bytes()].concat());
    let mut seq = 1u32;
    // Inject 4 frames of one flow at once (one batch) with buffers posted: returns (segments
    // coalesced, frames marked DATA_VALID), the frames and the used entries they took.
    let mut round = |g: &mut Guest| {
        let frames = lanekit_vhost::fuzzing::wire(true, 4 * 1448, 1448, 40000, seq);
        seq = seq.wrapping_add(4 * 1448);
        let (before, from) = (backend.stats(), g.used_idx(0));
        g.post_rx(0, 4);
        assert!(peers[0].inject_all(&frames));
        let deadline = std::time::Instant::now() + T;
        while backend.stats().rx_frames < before.rx_frames + 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(20));
        let s = backend.stats();
        assert_eq!(s.rx_frames - before.rx_frames, 4, "{s:?}");
        let counts = (s.rx_gro_segments - before.rx_gro_segments, s.rx_csum_valid - before.rx_csum_valid);
        (counts, frames, from, g.used_idx(0))
    };
    let ((gro, _), ..) = round(&mut g);
    assert_eq!(gro, 1, "all on: coalesced");
    assert_eq!(set(&mut g, 0), 0, "all off is accepted");
    assert_eq!(backend.guest_offloads(), 0);
    let (counts, frames, from, to) = round(&mut g);
    assert_eq!(counts, (0, 0), "all off: neither coalesced nor marked");
    assert_eq!(g.rx_frames(0, from, to), frames, "plain frames, header flags 0");
    assert_eq!(set(&mut g, CSUM), 0, "rx checksumming back on");
    let (counts, ..) = round(&mut g);
    assert_eq!(counts, (0, 4), "checksum only: marked, not coalesced");
    assert_eq!(set(&mut g, 1 << 11), 1, "HOST_TSO4 is no guest offload");
    assert_eq!(set(&mut g, 1 << 9), 1, "GUEST_ECN was not negotiated");
    assert_eq!(g.ctrl(&[5, 0, 0, 0, 0, 0]), 1, "not a le64");
    assert_eq!(backend.guest_offloads(), CSUM, "refused sets change nothing");
    // GUEST_TSO without GUEST_CSUM (what `ethtool -K rx off` sends): accepted, no coalescing.
    assert_eq!(set(&mut g, TSO), 0);
    let (counts, ..) = round(&mut g);
    assert_eq!(counts, (0, 0), "TSO without checksum offload: nothing");
    assert_eq!(set(&mut g, CSUM | TSO), 0);
    let ((gro, _), ..) = round(&mut g);
    assert_eq!(gro, 1, "back on: coalesced again");
    assert_eq!(backend.stats().errors, 0);
    drop(g);
    h.join().unwrap();
    let _ = std::fs::remove_file(&path);
}
