//! A real Linux guest (QEMU under TCG, virtio-net with 2 queue pairs) on the `lanekit-vhost`
//! binary in loopback mode: the guest's ARP requests come back to it, so its RX counter proves
//! both directions through Linux's virtio-net driver (mergeable buffers, EVENT_IDX, multiqueue).
//!
//! Root only (QEMU, and the guest image build installs packages): `#[ignore]`d, run by
//! `make test-vhost` as root. The test builds (or finds up to date) the guest image itself with
//! the same script and cache the Go suites use (`scripts/guest/build.sh`, cached and locked in
//! /var/cache/lanekit/guest), so it does not depend on another suite having run first.
//! Bounded in time.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::drivers::{guest_image, line_with, serial_console, start_qemu, Kill};

#[test]
fn line_with_waits_for_the_whole_line() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buf = String::new();
    a.write_all(b"boot noise\r\nLK-READY net=").unwrap();
    let soon = Instant::now() + Duration::from_millis(100);
    assert_eq!(line_with(&mut b, &mut buf, &["LK-READY", "LK-FAIL"], soon), None, "half a line is not a line");
    a.write_all(b"up if=eth0 ip=169.254.77.2/24 queues=2\r\n").unwrap();
    let later = Instant::now() + Duration::from_secs(5);
    let line = line_with(&mut b, &mut buf, &["LK-READY", "LK-FAIL"], later).unwrap();
    assert_eq!(line, "LK-READY net=up if=eth0 ip=169.254.77.2/24 queues=2");
}

#[test]
#[ignore = "needs root, QEMU and the guest image (make test-vhost as root)"]
fn linux_guest_traffic_crosses_the_backend() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root: run `make test-vhost` as root");
    let qemu = Command::new("sh").args(["-c", "command -v qemu-system-x86_64"]).output().expect("run sh");
    assert!(qemu.status.success(), "qemu-system-x86_64 not installed (make deps)");
    let (kernel, initrd) = guest_image();
    let dir = std::env::temp_dir().join(format!("lk-vhost-qemu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, serial) = (dir.join("v.sock"), dir.join("serial.sock"));
    let log = dir.join("backend.log");
    let _backend = Kill(
        Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
            .env("LANEKIT_LAB", "1") // --loopback is lab-only
            .args(["--loopback", "--queues", "2", "--socket"])
            .arg(&sock)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let backend_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _qemu = start_qemu(&sock, &serial, "", &kernel, &initrd, Stdio::null());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut s = serial_console(&serial, deadline, String::new);
    let mut buf = String::new();
    let ready = line_with(&mut s, &mut buf, &["LK-READY", "LK-FAIL"], deadline);
    let ready = ready.unwrap_or_else(|| panic!("guest did not boot:\n{buf}\n--- backend ---\n{}", backend_log()));
    assert!(ready.starts_with("LK-READY net=up"), "guest network not up: {ready:?}\n{buf}");
    buf.clear();
    s.write_all(b"LKCMD 1 ping -c 3 -W 1 169.254.77.1; cat /sys/class/net/eth0/statistics/rx_packets\n").unwrap();
    let done = line_with(&mut s, &mut buf, &["LKOUT 1 "], deadline);
    assert!(done.is_some(), "command did not finish:\n{buf}");
    let out = &buf[buf.find("LKBEGIN 1").unwrap_or(0)..buf.find("LKOUT 1").unwrap()];
    let rx: u64 = out.lines().rev().find_map(|l| l.trim().parse().ok()).expect("rx_packets");
    assert!(rx >= 3, "the guest's looped-back ARP requests must arrive (rx_packets {rx}):\n{out}\n{}", backend_log());
    // Linux's virtio-net driver takes every offload the backend offers through QEMU.
    let acked = backend_log().lines().find(|l| l.contains("frontend acked features")).map(str::to_string);
    let acked = acked.unwrap_or_else(|| panic!("no features line:\n{}", backend_log()));
    let want = "offloads Offloads { csum: true, tso4: true, tso6: true, ecn: true, uso: false, guest_csum: true, \
                guest_tso4: true, guest_tso6: true }";
    assert!(acked.contains(want), "{acked}");
    // QEMU's memory-backend-memfd seals its memfd against shrinking (seal=on by default).
    for l in backend_log().lines().filter(|l| l.contains("guest memory region")) {
        println!("{l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
