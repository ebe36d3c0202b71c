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

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanekit_vhost::port::{LoopPort, Port};
use lanekit_vhost::rss::{RssMap, MAP_VALUE_SIZE, VIRTIO_NET_F_HASH_REPORT, VIRTIO_NET_F_RSS};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};

const CACHE: &str = "/var/cache/lanekit/guest";

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The guest image (kernel, initrd) from `scripts/guest/build.sh` (cached), as qemu_guest.rs.
fn guest_image() -> (String, String) {
    let script = std::env::var_os("LANEKIT_GUEST_BUILD")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest/build.sh"));
    let out = Command::new("bash").arg(&script).arg(CACHE).stderr(Stdio::inherit()).output().expect("run build.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} failed:\n{stdout}", script.display());
    let field = |k: &str| stdout.lines().find_map(|l| l.strip_prefix(k)).map(str::to_string);
    (field("KERNEL=").expect("KERNEL= line"), field("INITRD=").expect("INITRD= line"))
}

fn read_until(s: &mut UnixStream, buf: &mut String, pat: &str, deadline: Instant) -> bool {
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        if buf.contains(pat) && buf[buf.find(pat).unwrap_or(0)..].contains('\n') {
            return true;
        }
        match s.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
            Err(_) => {}
        }
    }
    false
}

#[test]
#[ignore = "needs root, QEMU and the cached guest image (make test-vhost as root)"]
fn qemu_passes_hash_report_but_not_rss_and_keeps_the_control_queue() {
    common::netns::require_root("qemu_passes_hash_report_but_not_rss_and_keeps_the_control_queue");
    let (kernel, initrd) = guest_image();
    let dir = std::env::temp_dir().join(format!("lk-vhost-qemu-rss-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, serial) = (dir.join("v.sock"), dir.join("serial.sock"));

    let map = lanekit_vhost::xsk::memfd("rss", 4096).unwrap();
    let rss = RssMap::from_fd(map.into(), MAP_VALUE_SIZE).unwrap();
    let ports: Vec<Box<dyn Port>> = (0..2).map(|i| Box::new(LoopPort::new(i).unwrap()) as Box<dyn Port>).collect();
    let cfg = DeviceConfig { mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56], queue_pairs: 2, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, ports).unwrap().with_rss(rss));
    let (b, p) = (backend.clone(), sock.clone());
    std::thread::spawn(move || serve(b, &p, Some(1)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let qemu_log = dir.join("qemu.log");
    let _qemu = Kill(
        Command::new("qemu-system-x86_64")
            .args(["-machine", "pc,accel=tcg", "-m", "256", "-no-reboot", "-display", "none", "-monitor", "none"])
            .args(["-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-numa", "node,memdev=mem"])
            .arg("-chardev")
            .arg(format!("socket,id=c0,path={}", sock.display()))
            .args(["-netdev", "vhost-user,id=n0,chardev=c0,queues=2"])
            .args(["-device", "virtio-net-pci,netdev=n0,mq=on,vectors=0,rss=on,hash=on,mac=52:54:00:12:34:56"])
            .args(["-kernel", &kernel, "-initrd", &initrd])
            .args(["-append", "console=ttyS0 lk.ip=169.254.77.2/24 lk.queues=2"])
            .arg("-serial")
            .arg(format!("unix:{},server=on,wait=off", serial.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&qemu_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut s = loop {
        if let Ok(s) = UnixStream::connect(&serial) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no serial socket from QEMU: {}",
            std::fs::read_to_string(&qemu_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = String::new();
    assert!(read_until(&mut s, &mut buf, "LK-READY", deadline), "guest did not boot:\n{buf}");
    buf.clear();
    s.write_all(b"LKCMD 1 cat /sys/bus/virtio/devices/*/features\n").unwrap();
    assert!(read_until(&mut s, &mut buf, "LKOUT 1 ", deadline), "command did not finish:\n{buf}");
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
