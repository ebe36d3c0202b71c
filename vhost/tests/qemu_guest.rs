//! A real Linux guest (QEMU 7.2 under TCG, virtio-net with 2 queue pairs) on the
//! `lanekit-vhost` binary in loopback mode: the guest's ARP requests come back to it, so its
//! RX counter proves both directions through Linux's virtio-net driver (mergeable buffers,
//! EVENT_IDX, multiqueue). Root only; skipped without QEMU or without the lab's guest image
//! (`scripts/guest/build.sh` → /var/cache/lanekit/guest). Bounded in time.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IMAGE: &str = "/var/cache/lanekit/guest";

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".into());
    }
    let qemu = Command::new("sh").args(["-c", "command -v qemu-system-x86_64"]).output();
    if !qemu.map(|o| o.status.success()).unwrap_or(false) {
        return Some("qemu-system-x86_64 not installed".into());
    }
    for f in ["vmlinuz", "initrd.img"] {
        if !Path::new(IMAGE).join(f).exists() {
            return Some(format!("no guest image {IMAGE}/{f} (scripts/guest/build.sh builds it)"));
        }
    }
    None
}

/// Read from the serial socket until `pat` appears or the deadline passes.
fn until(s: &mut UnixStream, buf: &mut String, pat: &str, deadline: Instant) -> bool {
    let mut chunk = [0u8; 4096];
    while !buf.contains(pat) && Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
            Err(_) => {}
        }
    }
    buf.contains(pat)
}

#[test]
fn linux_guest_traffic_crosses_the_backend() {
    if let Some(why) = skip_reason() {
        println!("skipping linux_guest_traffic_crosses_the_backend: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("lk-vhost-qemu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, serial) = (dir.join("v.sock"), dir.join("serial.sock"));
    let _backend = Kill(
        Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
            .args(["--loopback", "--queues", "2", "--socket"])
            .arg(&sock)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
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
            .args(["-kernel", &format!("{IMAGE}/vmlinuz"), "-initrd", &format!("{IMAGE}/initrd.img")])
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
    assert!(until(&mut s, &mut buf, "LK-READY", deadline), "guest did not boot:\n{buf}");
    assert!(buf.contains("LK-READY net=up"), "guest network not up:\n{buf}");
    buf.clear();
    s.write_all(b"LKCMD 1 ping -c 3 -W 1 169.254.77.1; cat /sys/class/net/eth0/statistics/rx_packets\n").unwrap();
    assert!(until(&mut s, &mut buf, "LKOUT 1", deadline), "command did not finish:\n{buf}");
    let out = &buf[buf.find("LKBEGIN 1").unwrap_or(0)..buf.find("LKOUT 1").unwrap()];
    let rx: u64 = out.lines().rev().find_map(|l| l.trim().parse().ok()).expect("rx_packets");
    assert!(rx >= 3, "the guest's looped-back ARP requests must arrive (rx_packets {rx}):\n{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
