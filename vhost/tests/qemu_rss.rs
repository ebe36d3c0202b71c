//! What QEMU 7.2 passes through vhost-user for virtio RSS and hash report, observed: the backend
//! offers VIRTIO_NET_F_RSS and VIRTIO_NET_F_HASH_REPORT (an in-process `NetBackend` with an RSS
//! map standing in for the agent's), QEMU runs a Linux guest with `rss=on,hash=on`, and the
//! test reads the features the guest's driver negotiated (`/sys/bus/virtio/devices/*/features`)
//! and whether any RSS/hash command reached the backend's control queue.
//!
//! Root only (QEMU, the cached guest image): `#[ignore]`d, run by `make test-vhost` as root.
//! It prints its findings; the assertions pin down what the README documents, so a QEMU that
//! starts passing RSS through would fail here and get noticed.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::drivers::{guest_image, line_with, rss_loop_backend, serial_console, start_qemu};
use lanekit_vhost::rss::{VIRTIO_NET_F_HASH_REPORT, VIRTIO_NET_F_RSS};

#[test]
#[ignore = "needs root, QEMU and the cached guest image (make test-vhost as root)"]
fn qemu_passes_hash_report_but_not_rss_and_keeps_the_control_queue() {
    common::netns::require_root("qemu_passes_hash_report_but_not_rss_and_keeps_the_control_queue");
    let (kernel, initrd) = guest_image();
    let dir = std::env::temp_dir().join(format!("lk-vhost-qemu-rss-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, serial) = (dir.join("v.sock"), dir.join("serial.sock"));

    let backend = rss_loop_backend([0x52, 0x54, 0, 0x12, 0x34, 0x56], &sock);
    let qemu_log = dir.join("qemu.log");
    let qemu_err = std::fs::File::create(&qemu_log).unwrap();
    let _qemu = start_qemu(&sock, &serial, "rss=on,hash=on", &kernel, &initrd, qemu_err.into());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut s =
        serial_console(&serial, deadline, || format!(": {}", std::fs::read_to_string(&qemu_log).unwrap_or_default()));
    let mut buf = String::new();
    assert!(line_with(&mut s, &mut buf, &["LK-READY"], deadline).is_some(), "guest did not boot:\n{buf}");
    buf.clear();
    s.write_all(b"LKCMD 1 cat /sys/bus/virtio/devices/*/features\n").unwrap();
    assert!(line_with(&mut s, &mut buf, &["LKOUT 1 "], deadline).is_some(), "command did not finish:\n{buf}");
    // The virtio device's features: one '0'/'1' per bit, bit 0 first (64 or more characters).
    let bits = buf.lines().map(str::trim).find(|l| l.len() >= 64 && l.chars().all(|c| c == '0' || c == '1'));
    let bits = bits.unwrap_or_else(|| panic!("no features line:\n{buf}"));
    let has = |b: u32| bits.as_bytes().get(b as usize) == Some(&b'1');
    let qemu_err = std::fs::read_to_string(&qemu_log).unwrap_or_default();
    println!(
        "QEMU 7.2 + vhost-user, device rss=on,hash=on, backend offering both: guest negotiated RSS={} \
         HASH_REPORT={}; guest hash config reaching the backend: {:?}; QEMU stderr: {}",
        has(VIRTIO_NET_F_RSS),
        has(VIRTIO_NET_F_HASH_REPORT),
        backend.rss_config(),
        qemu_err.trim()
    );
    // What the README documents: F_RSS is withdrawn (QEMU offers it only with its eBPF RSS
    // program attached to a tap), F_HASH_REPORT passes, and the control queue stays in QEMU.
    assert!(!has(VIRTIO_NET_F_RSS), "QEMU now passes VIRTIO_NET_F_RSS through vhost-user: update the docs");
    assert!(has(VIRTIO_NET_F_HASH_REPORT), "QEMU no longer passes VIRTIO_NET_F_HASH_REPORT: update the docs");
    assert_eq!(backend.rss_config(), None, "a hash configuration reached the backend's control queue");
    let _ = std::fs::remove_dir_all(&dir);
}
