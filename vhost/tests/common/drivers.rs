//! Helpers of the tests that put real virtio drivers on the backend: a Linux guest under QEMU
//! (the guest image and its serial console) and DPDK testpmd's virtio_user. These tests are
//! `#[ignore]`d and run by `make test-vhost` as root, where a missing prerequisite is a failure
//! (`make deps` installs them), not a silent pass.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanekit_vhost::port::{LoopPort, Port};
use lanekit_vhost::rss::{RssMap, MAP_VALUE_SIZE};
use lanekit_vhost::{serve, DeviceConfig, NetBackend};

/// Where `scripts/guest/build.sh` caches (and locks) the guest image; the Go suites use it too.
pub const GUEST_CACHE: &str = "/var/cache/lanekit/guest";

/// A child process killed (and reaped) when dropped.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Build or find the guest image: (kernel, initrd), from build.sh's `KERNEL=` / `INITRD=` lines.
pub fn guest_image() -> (String, String) {
    let script = std::env::var_os("LANEKIT_GUEST_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest/build.sh"));
    let out = Command::new("bash")
        .arg(&script)
        .arg(GUEST_CACHE)
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

/// Boot the guest image under QEMU (TCG, 256 MiB of shared memfd memory) with one
/// virtio-net-pci device on the vhost-user socket `sock` (2 queue pairs, MAC 52:54:00:12:34:56,
/// `device_opts` appended to the device's options), its console on the serial socket `serial`
/// and QEMU's stderr to `stderr`. The guest's init takes the link-local address 169.254.77.2/24;
/// a loopback backend sends nothing anywhere.
pub fn start_qemu(sock: &Path, serial: &Path, device_opts: &str, kernel: &str, initrd: &str, stderr: Stdio) -> Kill {
    start_qemu_with(sock, serial, device_opts, kernel, initrd, stderr, &[])
}

/// [`start_qemu`] with more QEMU arguments (`-qmp ...`, `-incoming ...`).
pub fn start_qemu_with(
    sock: &Path,
    serial: &Path,
    device_opts: &str,
    kernel: &str,
    initrd: &str,
    stderr: Stdio,
    extra: &[String],
) -> Kill {
    let mut device = "virtio-net-pci,netdev=n0,mq=on,vectors=0".to_string();
    if !device_opts.is_empty() {
        device = format!("{device},{device_opts}");
    }
    Kill(
        Command::new("qemu-system-x86_64")
            .args(["-machine", "pc,accel=tcg", "-m", "256", "-no-reboot", "-display", "none", "-monitor", "none"])
            .args(["-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-numa", "node,memdev=mem"])
            .arg("-chardev")
            .arg(format!("socket,id=c0,path={}", sock.display()))
            .args(["-netdev", "vhost-user,id=n0,chardev=c0,queues=2"])
            .args(["-device", &format!("{device},mac=52:54:00:12:34:56")])
            .args(["-kernel", kernel, "-initrd", initrd])
            .args(["-append", "console=ttyS0 lk.ip=169.254.77.2/24 lk.queues=2"])
            .arg("-serial")
            .arg(format!("unix:{},server=on,wait=off", serial.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start qemu-system-x86_64"),
    )
}

/// Read from the serial socket until a whole line (terminated by `\n`) containing one of
/// `pats` has arrived, and return that line from the pattern on; `None` at the deadline or
/// when the socket closes. A pattern seen on a partial line is not enough: the rest of the line
/// may still be in flight.
pub fn line_with(s: &mut UnixStream, buf: &mut String, pats: &[&str], deadline: Instant) -> Option<String> {
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

/// Connect to QEMU's serial socket (server=on, wait=off) before `deadline`, with a 500 ms read
/// timeout for [`line_with`]; `why` tells what went wrong when it never appears.
pub fn serial_console(path: &Path, deadline: Instant, why: impl Fn() -> String) -> UnixStream {
    let s = loop {
        if let Ok(s) = UnixStream::connect(path) {
            break s;
        }
        assert!(Instant::now() < deadline, "no serial socket from QEMU{}", why());
        std::thread::sleep(Duration::from_millis(50));
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    s
}

/// The testpmd binary (root only).
pub fn testpmd() -> String {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "dpdk-testpmd needs root: run `make test-vhost` as root");
    let found = Command::new("sh").args(["-c", "command -v dpdk-testpmd"]).output().expect("run sh");
    assert!(found.status.success(), "dpdk-testpmd not installed (make deps, or apt-get install dpdk)");
    String::from_utf8_lossy(&found.stdout).trim().to_string()
}

/// An in-process backend with 2 queue pairs on loopback ports and an RSS map (so it offers
/// VIRTIO_NET_F_RSS and F_HASH_REPORT), serving one frontend on `sock`; returns once the socket
/// exists (5 s at most).
pub fn rss_loop_backend(mac: [u8; 6], sock: &Path) -> Arc<NetBackend> {
    let map = lanekit_vhost::xsk::memfd("rss", 4096).unwrap();
    let rss = RssMap::from_fd(map.into(), MAP_VALUE_SIZE).unwrap();
    let ports: Vec<Box<dyn Port>> = (0..2).map(|i| Box::new(LoopPort::new(i).unwrap()) as Box<dyn Port>).collect();
    let cfg = DeviceConfig { mac, queue_pairs: 2, mtu: 1500 };
    let backend = Arc::new(NetBackend::new(cfg, ports).unwrap().with_rss(rss));
    let (b, p) = (backend.clone(), sock.to_path_buf());
    std::thread::spawn(move || serve(b, &p, Some(1)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    backend
}
