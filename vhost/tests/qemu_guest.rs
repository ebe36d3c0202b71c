//! A real Linux guest (QEMU under TCG, virtio-net with 2 queue pairs) on the `lanekit-vhost`
//! binary in loopback mode: the guest's ARP requests come back to it, so its RX counter proves
//! both directions through Linux's virtio-net driver (mergeable buffers, EVENT_IDX, multiqueue).
//!
//! Root only (QEMU, and the guest image build installs packages): `#[ignore]`d, run by
//! `make test-vhost` as root. The test builds (or finds up to date) the guest image itself with
//! the same script and cache the Go suites use (`scripts/guest/build.sh`, cached and locked in
//! /var/cache/lanekit/guest), so it does not depend on another suite having run first.
//! Bounded in time.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CACHE: &str = "/var/cache/lanekit/guest";

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Build or find the guest image: (kernel, initrd), from build.sh's `KERNEL=` / `INITRD=` lines.
fn guest_image() -> (String, String) {
    let script = std::env::var_os("LANEKIT_GUEST_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest/build.sh"));
    let out = Command::new("bash")
        .arg(&script)
        .arg(CACHE)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} failed ({}):\n{stdout}", script.display(), out.status);
    let field = |k: &str| stdout.lines().find_map(|l| l.strip_prefix(k)).map(str::to_string);
    match (field("KERNEL="), field("INITRD=")) {
        (Some(k), Some(i)) => (k, i),
        _ => panic!("{}: no KERNEL=/INITRD= lines in its output:\n{stdout}", script.display()),
    }
}

/// Read from the serial socket until a whole line (terminated by `\n`) containing one of
/// `pats` has arrived, and return that line from the pattern on; `None` at the deadline or
/// when the socket closes. A pattern seen on a partial line is not enough: the rest of the line
/// may still be in flight.
fn line_with(s: &mut UnixStream, buf: &mut String, pats: &[&str], deadline: Instant) -> Option<String> {
    let mut chunk = [0u8; 4096];
    loop {
        for line in buf.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            if let Some(at) = pats.iter().find_map(|p| line.find(p)) {
                return Some(line[at..].trim_end().to_string());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        match s.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
            Err(_) => {} // read timeout: check the deadline again
        }
    }
}

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
    let _qemu = Kill(
        Command::new("qemu-system-x86_64")
            .args(["-machine", "pc,accel=tcg", "-m", "256", "-no-reboot", "-display", "none", "-monitor", "none"])
            .args(["-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-numa", "node,memdev=mem"])
            .arg("-chardev")
            .arg(format!("socket,id=c0,path={}", sock.display()))
            .args(["-netdev", "vhost-user,id=n0,chardev=c0,queues=2"])
            .args(["-device", "virtio-net-pci,netdev=n0,mq=on,vectors=0,mac=52:54:00:12:34:56"])
            .args(["-kernel", &kernel, "-initrd", &initrd])
            // Link-local address; the loopback backend sends nothing anywhere.
            .args(["-append", "console=ttyS0 lk.ip=169.254.77.2/24 lk.queues=2"])
            .arg("-serial")
            .arg(format!("unix:{},server=on,wait=off", serial.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut s = loop {
        if let Ok(s) = UnixStream::connect(&serial) {
            break s;
        }
        assert!(Instant::now() < deadline, "no serial socket from QEMU");
        std::thread::sleep(Duration::from_millis(50));
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
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
    // QEMU's memory-backend-memfd seals its memfd against shrinking (seal=on by default).
    for l in backend_log().lines().filter(|l| l.contains("guest memory region")) {
        println!("{l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
