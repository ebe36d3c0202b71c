//! AF_XDP port on a veth pair inside a network namespace this test creates (and always deletes):
//! guest TX leaves through the xsk and is captured on the peer; frames sent from the peer are
//! redirected by a tiny XDP program into the xsk and reach the guest. Root only: `#[ignore]`d,
//! run by `make test-vhost` as root.

mod common;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::netns::{packet_collect, packet_send, packet_socket, require_root, Netns, XskRedirect};
use common::{frame, socket_path, Guest, GUEST_FEATURES};
use lanekit_vhost::port::Port;
use lanekit_vhost::xsk::{XskParams, XskPort};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::{VhostBackend, VhostUserDirtyLogRegion};

const ETHERTYPE: u16 = 0x88b5;

#[test]
#[ignore = "needs root: network namespace, AF_XDP, XDP (make test-vhost as root)"]
fn guest_frames_cross_af_xdp_on_a_veth_in_a_namespace() {
    require_root("guest_frames_cross_af_xdp_on_a_veth_in_a_namespace");
    let ns = Netns::new("xsk").expect("create namespace");
    let (port, cap, redirect) = ns
        .run(|| -> io::Result<_> {
            let port = XskPort::create("lkv0", XskParams::standard(0))?;
            let cap = packet_socket("lkv1")?;
            let redirect = XskRedirect::attach("lkv0")?;
            redirect.insert(0, port.fd())?;
            Ok((port, cap, redirect))
        })
        .unwrap()
        .expect("set up AF_XDP socket, capture socket and XDP redirect");
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 1], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, vec![Box::new(port) as Box<dyn Port>]).unwrap());
    let path = socket_path("xsk");
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(1)).unwrap());
    let protocol = common::BASE_PROTOCOL | VhostUserProtocolFeatures::LOG_SHMFD;
    let mut g = Guest::connect_with(&path, 1, GUEST_FEATURES, protocol);

    // Guest -> xsk TX -> lkv0 -> lkv1.
    let out: Vec<Vec<u8>> = (0..10).map(|i| frame(60 + 140 * i, i as u8)).collect();
    g.send(1, &out);
    let got = packet_collect(cap.as_raw_fd(), ETHERTYPE, out.len(), Duration::from_secs(5));
    assert_eq!(got, out, "frames captured on the veth peer");

    // lkv1 -> lkv0 -> XDP redirect -> xsk RX -> guest, while a migration logs dirty pages: the
    // zero-copy RX path (UMEM straight into the guest buffer) marks them too.
    let log = dirty_log(&g);
    g.post_rx(0, 64);
    let inbound: Vec<Vec<u8>> = (0..10).map(|i| frame(1514 - 100 * i, 0x40 + i as u8)).collect();
    for f in &inbound {
        packet_send(cap.as_raw_fd(), f).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut rx = Vec::new();
    while Instant::now() < deadline {
        rx = g
            .rx_frames(0, 0, g.used_idx(0))
            .into_iter()
            .filter(|f| f.len() >= 14 && u16::from_be_bytes([f[12], f[13]]) == ETHERTYPE)
            .collect();
        if rx.len() >= inbound.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rx, inbound, "frames from the veth peer delivered to the guest");
    let dirty = dirty_pages(&log);
    for i in 0..g.used_idx(0) {
        let (head, len) = g.used_elem(0, i);
        let addr = g.queues[0].bufs + u64::from(head) * common::BUF;
        for page in addr / 4096..=(addr + u64::from(len) - 1) / 4096 {
            assert!(dirty.contains(&page), "RX buffer {head} ({len} bytes) written but page {page:#x} not logged");
        }
    }
    assert!(dirty.contains(&(g.used_ring(0) / 4096)), "RX used ring not logged");
    let s = backend.stats();
    assert_eq!((s.tx_frames, s.errors), (10, 0), "{s:?}");
    check_xdp_metrics(&backend);
    drop(g);
    server.join().unwrap();
    drop(redirect);
    let _ = std::fs::remove_file(&path);
}

/// Set a sealed dirty log covering the guest and ack `VHOST_F_LOG_ALL` (what QEMU does when a
/// migration starts).
fn dirty_log(g: &Guest) -> std::fs::File {
    let size = (common::MEM_SIZE as u64 / 4096).div_ceil(8);
    // SAFETY: a valid NUL-terminated name; the result is checked and then owned.
    let raw = unsafe { libc::memfd_create(c"lk-test-log".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: raw is a new fd owned by nobody else.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    f.set_len(size).unwrap();
    // SAFETY: fcntl on an open memfd with an integer argument.
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) }, 0);
    let region = VhostUserDirtyLogRegion { mmap_size: size, mmap_offset: 0, mmap_handle: f.as_raw_fd() };
    g.fe.set_log_base(0, Some(region)).unwrap();
    g.fe.set_features(g.features | 1 << 26).unwrap();
    g.fe.get_features().unwrap(); // ordered after SET_FEATURES
    f
}

fn dirty_pages(log: &std::fs::File) -> std::collections::BTreeSet<u64> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; (common::MEM_SIZE / 4096).div_ceil(8)];
    log.read_exact_at(&mut b, 0).unwrap();
    (0..b.len() as u64 * 8).filter(|p| b[(p / 8) as usize] & (1 << (p % 8)) != 0).collect()
}

/// The exporter's `lanekit_vhost_xdp_*` samples are the socket's own `XDP_STATISTICS`: each lies
/// between a direct `getsockopt` on the backend's fd just before the scrape and one just after
/// (the kernel keeps counting meanwhile: the backend's worker still polls the socket), and they
/// are not all zero (copy-mode TX finds the TX ring empty at the end of every kick,
/// `tx_ring_empty_descs`).
fn check_xdp_metrics(backend: &Arc<NetBackend>) {
    use lanekit_vhost::metrics::{render, Exporter};
    use lanekit_vhost::xsk::xdp_statistics;

    let fd = backend.xsk_fds()[0].expect("the port is an AF_XDP socket");
    let before = xdp_statistics(fd).expect("XDP_STATISTICS");
    let text = render(&Exporter::new(backend.clone(), "vm-x").registry());
    let direct = xdp_statistics(fd).expect("XDP_STATISTICS");
    let sample = |name: &str| -> u64 {
        let prefix = format!("lanekit_vhost_xdp_{name}_total{{vm=\"vm-x\",queue=\"0\"}} ");
        let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
        line[prefix.len()..].parse().unwrap()
    };
    let scraped = lanekit_vhost::xsk::XdpStatistics {
        rx_dropped: sample("rx_dropped"),
        rx_invalid_descs: sample("rx_invalid_descs"),
        tx_invalid_descs: sample("tx_invalid_descs"),
        rx_ring_full: sample("rx_ring_full"),
        rx_fill_ring_empty_descs: sample("rx_fill_ring_empty_descs"),
        tx_ring_empty_descs: sample("tx_ring_empty_descs"),
    };
    let fields = |x: &lanekit_vhost::xsk::XdpStatistics| {
        [
            x.rx_dropped,
            x.rx_invalid_descs,
            x.tx_invalid_descs,
            x.rx_ring_full,
            x.rx_fill_ring_empty_descs,
            x.tx_ring_empty_descs,
        ]
    };
    let (lo, got, hi) = (fields(&before), fields(&scraped), fields(&direct));
    for i in 0..got.len() {
        assert!(
            lo[i] <= got[i] && got[i] <= hi[i],
            "exported XDP statistics {scraped:?} not between getsockopt before {before:?} and after {direct:?}"
        );
    }
    assert!(direct.tx_ring_empty_descs > 0, "{direct:?}");
    assert_eq!((direct.rx_invalid_descs, direct.tx_invalid_descs), (0, 0), "{direct:?}");
    assert!(text.contains("lanekit_vhost_tx_packets_total{vm=\"vm-x\",queue=\"0\"} 10\n"), "{text}");
}

/// The agent side of the handover, as `xsk.rs` documents it, played by the test: sockets created
/// and bound "by the agent" in the namespace, handed to the backend over SOCK_SEQPACKET.
#[test]
#[ignore = "needs root: network namespace, AF_XDP, XDP (make test-vhost as root)"]
fn sockets_handed_over_by_the_agent_carry_guest_traffic() {
    use lanekit_vhost::handover::{recv_msg, send_msg, seqpacket, QueueInfo, Reply, Request};
    use lanekit_vhost::xsk::{bind_copy, create_unbound};
    use std::os::fd::{FromRawFd, OwnedFd};

    require_root("sockets_handed_over_by_the_agent_carry_guest_traffic");
    let ns = Netns::new("handover").expect("create namespace");
    let params = XskParams::standard(0);
    let (xsk, umem, cap) = ns
        .run(move || -> io::Result<_> {
            let (xsk, umem) = create_unbound(params)?;
            bind_copy(xsk.as_raw_fd(), "lkv0", 0)?;
            Ok((xsk, umem, packet_socket("lkv1")?))
        })
        .unwrap()
        .expect("agent-side socket setup");
    let agent_path = socket_path("agent");
    let _ = std::fs::remove_file(&agent_path);
    let listener = seqpacket(&agent_path, true).unwrap();
    let agent = std::thread::spawn(move || {
        // SAFETY: accept on a listening socket; result checked.
        let c = unsafe { libc::accept(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(c >= 0);
        // SAFETY: new fd owned here.
        let c = unsafe { OwnedFd::from_raw_fd(c) };
        let (body, fds) = recv_msg(c.as_raw_fd()).unwrap();
        assert!(fds.is_empty());
        let req: Request = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            req,
            Request { version: 1, vm: "vm-test".into(), rss: true, tx_meta: true, tx_gso: false, rx_gso: false }
        );
        let q = QueueInfo {
            queue: 0,
            umem_size: params.umem_size,
            frame_size: params.frame_size,
            frame_count: params.frame_count,
            fill_size: params.fill_size,
            comp_size: params.comp_size,
            rx_size: params.rx_size,
            tx_size: params.tx_size,
            tx_metadata_len: params.tx_metadata_len,
            gso: false,
            rx_gso: false,
        };
        let reply = serde_json::to_vec(&Reply { version: 1, queues: vec![q], error: None, rss: None }).unwrap();
        send_msg(c.as_raw_fd(), &reply, &[xsk.as_raw_fd(), umem.as_raw_fd()]).unwrap();
    });
    let source = lanekit_vhost::PortSource::Agent { socket: agent_path.clone(), vm: "vm-test".into() };
    let (ports, rss) =
        lanekit_vhost::open_ports(&source, 1, 1518, lanekit_vhost::TxGso::Software, lanekit_vhost::RxGso::Xdp)
            .expect("handover");
    assert!(rss.is_none());
    agent.join().unwrap();
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 2], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, ports).unwrap());
    let path = socket_path("handover");
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(1)).unwrap());
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);
    let out: Vec<Vec<u8>> = (0..5).map(|i| frame(100 + i, i as u8)).collect();
    g.send(1, &out);
    assert_eq!(packet_collect(cap.as_raw_fd(), ETHERTYPE, 5, Duration::from_secs(5)), out);
    drop(g);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&agent_path);
}

/// Guest checksums through AF_XDP TX metadata (kernel >= 6.8): the backend's UMEM has
/// `tx_metadata_len`; a guest's `NEEDS_CSUM` frame and every segment the backend cuts from a
/// GSO chain leave with the pseudo-header sum only and reach the veth peer `CHECKSUM_PARTIAL`
/// (`TP_STATUS_CSUMNOTREADY` on the capture: the kernel took the request); with the device's TX
/// checksumming off the kernel computes them itself (`validate_xmit_skb`) and they are right.
/// A request aimed at anything but the frame's own L4 checksum (here the IPv4 destination,
/// which the agent's BPF reads before a deferred checksum would be written) is never passed
/// on: the backend computes it and the frame leaves complete.
#[test]
#[ignore = "needs root: network namespace, AF_XDP (make test-vhost as root)"]
fn guest_checksums_are_left_to_the_kernel_through_tx_metadata() {
    use lanekit_vhost::fuzzing::{gso_hdr, l4_check, packet};
    use lanekit_vhost::offload::{fill_csum, TxHdr};
    use lanekit_vhost::xsk::TX_METADATA_LEN;

    require_root("guest_checksums_are_left_to_the_kernel_through_tx_metadata");
    let ns = Netns::new("txmeta").expect("create namespace");
    let (port, cap) = ns
        .run(|| -> io::Result<_> {
            let port = XskPort::create("lkv0", XskParams::standard(0))?;
            let cap = packet_socket("lkv1")?;
            set_auxdata(cap.as_raw_fd())?;
            Ok((port, cap))
        })
        .unwrap()
        .expect("set up AF_XDP socket and capture socket");
    assert_eq!(port.params().tx_metadata_len, TX_METADATA_LEN, "the kernel took the UMEM's TX metadata room");
    let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 1], queue_pairs: 1, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, vec![Box::new(port) as Box<dyn Port>]).unwrap());
    let path = socket_path("txmeta");
    let (b, p) = (backend.clone(), path.clone());
    let server = std::thread::spawn(move || serve(b, &p, Some(1)).unwrap());
    let mut g = Guest::connect(&path, 1, GUEST_FEATURES);

    let hdr = |h: TxHdr| {
        let mut b = [0u8; 12];
        b[..10].copy_from_slice(&h.bytes());
        b
    };
    let csum = |f: &[u8]| TxHdr { gso_type: 0, gso_size: 0, ..gso_hdr(f, 0, 0) };
    let (tcp4, udp4, tcp6) =
        (packet(true, true, 700, 0x18), packet(true, false, 300, 0), packet(false, true, 500, 0x18));
    let big = packet(true, true, 4000, 0x18);
    let mut aimed = tcp4.clone();
    aimed[35] = 0x77; // its own source port, to tell it apart on the capture
    let chains = [
        (hdr(csum(&tcp4)), tcp4.clone()),
        (hdr(csum(&udp4)), udp4.clone()),
        (hdr(csum(&tcp6)), tcp6.clone()),
        (hdr(TxHdr { csum_start: 30, csum_offset: 0, ..csum(&aimed) }), aimed.clone()),
        (hdr(gso_hdr(&big, 1, 1448)), big.clone()),
    ];
    let mut filled = aimed.clone();
    fill_csum(&mut filled, 30, 0);
    for tx_off in [false, true] {
        if tx_off {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns.name, "ethtool", "-K", "lkv0", "tx", "off"])
                .output()
                .unwrap();
            assert!(out.status.success(), "ethtool: {}", String::from_utf8_lossy(&out.stderr));
        }
        let before = backend.stats();
        send_with_hdr(&mut g, &chains);
        // 4 single frames and 3 segments of 1448, 1448 and 1104 bytes.
        let got = collect_aux(cap.as_raw_fd(), 7, Duration::from_secs(5));
        assert_eq!(got.len(), 7, "tx off {tx_off}: frames captured {got:?}");
        for (f, partial) in &got {
            let v4 = f[12..14] == [8, 0];
            let aimed_frame = v4 && f[35] == 0x77;
            // Partial only where the backend asked the kernel, and only while lkv0 offloads.
            assert_eq!(*partial, !aimed_frame && !tx_off, "tx off {tx_off}: CSUMNOTREADY of {:?}", &f[..54]);
            if aimed_frame {
                assert_eq!(f, &filled, "a checksum aimed elsewhere leaves computed by the backend");
                continue;
            }
            let mut done = f.clone();
            if *partial {
                assert_ne!(l4_check(f, v4), 0, "left to the kernel: the field holds the pseudo-header sum");
                let l4 = if v4 { 34 } else { 54 };
                fill_csum(&mut done, l4, if f[if v4 { 23 } else { 20 }] == 6 { 16 } else { 6 });
            }
            assert_eq!(l4_check(&done, v4), 0, "tx off {tx_off}: checksum of {:?}", &f[..54]);
        }
        let s = backend.stats();
        assert_eq!(s.tx_csum_kernel - before.tx_csum_kernel, 6, "tx off {tx_off}: {s:?}");
        assert_eq!((s.tx_csum - before.tx_csum, s.tx_gso - before.tx_gso, s.errors), (4, 1, 0), "{s:?}");
    }
    let fd = backend.xsk_fds()[0].unwrap();
    let st = lanekit_vhost::xsk::xdp_statistics(fd).unwrap();
    assert_eq!(st.tx_invalid_descs, 0, "{st:?}");
    drop(g);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// Send (virtio-net header, frame) chains on TX queue 1, frames from a scratch area of guest
/// memory (they may exceed one ring buffer), and wait until the backend returned them.
fn send_with_hdr(g: &mut Guest, chains: &[([u8; 12], Vec<u8>)]) {
    use vm_memory::{Bytes, GuestAddress};
    let want = g.used_idx(1).wrapping_add(chains.len() as u16);
    for (i, (h, f)) in chains.iter().enumerate() {
        let addr = 0x80_0000 + 0x1_0000 * i as u64;
        g.mem.write_slice(h, GuestAddress(addr)).unwrap();
        g.mem.write_slice(f, GuestAddress(addr + 16)).unwrap();
        g.add_chain(1, &[(addr, 12, false), (addr + 16, f.len() as u32, false)]);
    }
    g.kick(1);
    assert!(g.wait_used(1, want, Duration::from_secs(5)), "TX chains returned");
}

fn set_auxdata(fd: std::os::fd::RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a valid int of its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_AUXDATA,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receive `n` IPv4/IPv6 frames from source port 12345 (0x3039) or 0x3077, each with whether
/// the kernel marked it `TP_STATUS_CSUMNOTREADY` (its skb is `CHECKSUM_PARTIAL`).
fn collect_aux(fd: std::os::fd::RawFd, n: usize, timeout: Duration) -> Vec<(Vec<u8>, bool)> {
    const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut ctl = [0u64; 16];
    while got.len() < n && Instant::now() < deadline {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: msghdr is plain data; the pointers set below stay valid during recvmsg.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&ctl);
        // SAFETY: msg describes writable buffers of the given lengths.
        let r = unsafe { libc::recvmsg(fd, &raw mut msg, 0) };
        if r < 0 {
            continue;
        }
        let f = buf[..r as usize].to_vec();
        let l4 = match f.get(12..14) {
            Some([8, 0]) => 34,
            Some([0x86, 0xdd]) => 54,
            _ => continue,
        };
        if f.len() < l4 + 2 || f[l4] != 0x30 || (f[l4 + 1] != 0x39 && f[l4 + 1] != 0x77) {
            continue;
        }
        let mut status = 0u32;
        // SAFETY: CMSG_* walk the control buffer the kernel filled (msg_controllen bytes).
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    status = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>());
                }
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        got.push((f, status & TP_STATUS_CSUMNOTREADY != 0));
    }
    got
}
