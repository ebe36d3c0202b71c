//! Wire -> guest through the kernel's packet socket (`--rx-gso kernel`, `pkt_rx.rs`) on a veth
//! pair inside a network namespace this test creates (and always deletes), driving the real
//! backend and its metrics: where a frame for a guest that posted no buffers dies, and that the
//! kernel's `PACKET_STATISTICS` (which reset on every read) are accumulated. Root only:
//! `#[ignore]`d, run by `make test-vhost` as root.

mod common;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::netns::{ifindex, packet_send, packet_socket, require_root, Netns};
use common::{frame, socket_path, Guest, GUEST_FEATURES};
use lanekit_vhost::metrics::{render, Exporter};
use lanekit_vhost::pkt_rx::RxGsoSocket;
use lanekit_vhost::port::Port;
use lanekit_vhost::xsk::{XskParams, XskPort};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};

/// Frames sent while the guest has no RX buffers.
const BURST: u64 = 200;
/// SO_RCVBUF asked for the packet socket (the kernel doubles it): a few dozen frames.
const RCVBUF: i32 = 32 << 10;

/// One sample of the backend's metrics text for queue 0 (`extra`: more labels, in order).
fn sample(text: &str, name: &str, extra: &str) -> u64 {
    let prefix = format!("{name}{{vm=\"vm-k\",queue=\"0\"{extra}}} ");
    let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

/// The kernel's own drop count of a socket (`SO_MEMINFO` `SK_MEMINFO_DROPS`: `sk_drops`, which
/// `packet_rcv` bumps with `tp_drops` and which no read resets).
fn sk_drops(fd: RawFd) -> u64 {
    let mut mem = [0u32; 9];
    let mut len = std::mem::size_of_val(&mem) as libc::socklen_t;
    // SAFETY: mem and len are valid for writes of their sizes for the duration of the call.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, 55, mem.as_mut_ptr().cast(), &mut len) };
    assert_eq!(r, 0, "SO_MEMINFO: {}", io::Error::last_os_error());
    u64::from(mem[libc::SK_MEMINFO_DROPS as usize])
}

/// A guest with no RX buffers: the backend holds the one packet it read and reads no more, so
/// the packet socket's queue fills and the kernel drops the rest of a burst. The scrape shows
/// them as `dropped{reason="socket_full"}` (equal to the kernel's own never-reset `sk_drops`),
/// `rx_socket_packets` counts the whole burst, the queue's bytes and limit are exported; once the
/// guest posts buffers it receives exactly the frames that were not dropped, and a second scrape
/// (the kernel's counters are zero again after the first) still shows the same totals.
#[test]
#[ignore = "needs root: network namespace, AF_XDP, AF_PACKET (make test-vhost as root)"]
fn a_full_packet_socket_drops_are_read_and_accumulated() {
    require_root("a_full_packet_socket_drops_are_read_and_accumulated");
    let ns = Netns::new("krx").expect("create namespace");
    let (port, tx, rx_fd) = ns
        .run(|| -> io::Result<_> {
            let mut port = XskPort::create("lkv0", XskParams::standard(0))?;
            let rx = RxGsoSocket::open(ifindex("lkv0"))?;
            let fd = rx.fd();
            let v: libc::c_int = RCVBUF;
            // SAFETY: v is a readable c_int for the duration of the call.
            let r = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw const v).cast(), 4) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            port.set_rx_gso(rx);
            Ok((port, packet_socket("lkv1")?, fd))
        })
        .unwrap()
        .expect("set up AF_XDP port, packet socket and sender");
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 1], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, vec![Box::new(port) as Box<dyn Port>]).unwrap());
    let path = socket_path("krx");
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(1)).unwrap());
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    let scrape = || render(&Exporter::new(backend.clone(), "vm-k").registry());

    for i in 0..BURST {
        packet_send(tx.as_raw_fd(), &frame(1514, i as u8)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200)); // the backend wakes, reads one, holds it
    let text = scrape();
    let drops = sample(&text, "lanekit_vhost_dropped_total", ",direction=\"rx\",reason=\"socket_full\"");
    assert!(drops > BURST / 2, "a burst into a few dozen frames of buffer drops most of it: {drops}\n{text}");
    assert_eq!(drops, sk_drops(rx_fd), "exported drops are the kernel's");
    assert_eq!(sample(&text, "lanekit_vhost_rx_socket_packets_total", ""), BURST, "every frame reached the socket");
    assert_eq!(sample(&text, "lanekit_vhost_rx_socket_rcvbuf_bytes", ""), 2 * RCVBUF as u64);
    assert!(sample(&text, "lanekit_vhost_rx_socket_queued_bytes", "") > 0, "frames wait in the queue\n{text}");
    assert_eq!(sample(&text, "lanekit_vhost_dropped_total", ",direction=\"rx\",reason=\"too_big\""), 0);
    assert_eq!(sample(&text, "lanekit_vhost_rx_packets_total", ""), 0, "no buffers, nothing delivered");

    // The guest posts buffers: it gets every frame the kernel did not drop, the held one first.
    let want = (BURST - drops) as u16;
    g.post_rx(0, common::QSIZE);
    assert!(g.wait_used(0, want, Duration::from_secs(5)), "{} of {want} delivered", g.used_idx(0));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(g.used_idx(0), want, "nothing but the frames not dropped");
    assert!(g.rx_frames(0, 0, want).iter().all(|f| f.len() == 1514 && f[12..14] == [0x88, 0xb5]));

    let deadline = Instant::now() + Duration::from_secs(2);
    let text = loop {
        let t = scrape();
        if sample(&t, "lanekit_vhost_rx_socket_queued_bytes", "") == 0 || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(
        sample(&text, "lanekit_vhost_dropped_total", ",direction=\"rx\",reason=\"socket_full\""),
        drops,
        "the second read adds nothing and loses nothing\n{text}"
    );
    assert_eq!(sample(&text, "lanekit_vhost_rx_socket_packets_total", ""), BURST);
    assert_eq!(sample(&text, "lanekit_vhost_rx_socket_queued_bytes", ""), 0);
    assert_eq!(sample(&text, "lanekit_vhost_rx_packets_total", ""), u64::from(want));
    drop(g);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}
