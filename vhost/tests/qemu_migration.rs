//! QEMU-to-QEMU live migration of a Linux guest whose virtio-net device is served by
//! `lanekit-vhost`: a source QEMU on one backend, a destination QEMU (`-incoming`) on a second
//! backend, both on this machine (TCG), migrated over a unix socket while the guest sends
//! frames that the loopback backends return to it; then back to a new QEMU on the first backend.
//!
//! What it proves: QEMU accepts the backend for migration (it refuses a vhost-user device
//! without `VHOST_F_LOG_ALL` and `LOG_SHMFD`: "Migration disabled: vhost lacks
//! VHOST_F_LOG_ALL feature"), the source backend logged while QEMU migrated, the destination
//! backend takes the rings over where the source left them (the guest's frames keep arriving,
//! counted by the guest's driver and by the destination backend), and what the switch-over
//! lost (frames the guest sent minus frames it received back, printed).
//!
//! Root only (QEMU, and the guest image build installs packages): `#[ignore]`d, run by
//! `make test-vhost` as root, where a missing QEMU or guest image is a failure like in
//! `qemu_guest.rs`. Bounded in time (about 80 s under TCG on this machine).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::drivers::{guest_image, line_with, serial_console, start_qemu_with, Kill};

/// A QMP connection (one JSON object per line).
struct Qmp {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Qmp {
    fn connect(path: &Path, deadline: Instant) -> Qmp {
        let s = loop {
            if let Ok(s) = UnixStream::connect(path) {
                break s;
            }
            assert!(Instant::now() < deadline, "no QMP socket {}", path.display());
            std::thread::sleep(Duration::from_millis(50));
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut q = Qmp { w: s.try_clone().unwrap(), r: BufReader::new(s) };
        let greeting = q.line();
        assert!(greeting.get("QMP").is_some(), "not a QMP greeting: {greeting}");
        q.call("qmp_capabilities", serde_json::json!({})).expect("qmp_capabilities");
        q
    }

    fn line(&mut self) -> serde_json::Value {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read QMP");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("QMP said {l:?}: {e}"))
    }

    /// Run `cmd`; the `return` value, or the error as Err.
    fn call(&mut self, cmd: &str, args: serde_json::Value) -> Result<serde_json::Value, String> {
        let msg = serde_json::json!({"execute": cmd, "arguments": args});
        writeln!(self.w, "{msg}").unwrap();
        loop {
            let v = self.line();
            if v.get("event").is_some() {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            return Err(v.get("error").map_or_else(|| v.to_string(), |e| e.to_string()));
        }
    }
}

/// Migrate the VM of `qmp`'s QEMU to `uri` and wait until it completed; QEMU's `query-migrate`.
fn migrate(qmp: &mut Qmp, uri: &str, deadline: Instant, why: impl Fn() -> String) -> serde_json::Value {
    let started = Instant::now();
    qmp.call("migrate", serde_json::json!({ "uri": uri }))
        .unwrap_or_else(|e| panic!("QEMU refused to migrate: {e}\n{}", why()));
    let info = loop {
        let info = qmp.call("query-migrate", serde_json::json!({})).unwrap();
        match info.get("status").and_then(|v| v.as_str()) {
            Some("completed") => break info,
            Some("failed") | Some("cancelled") => panic!("migration {info}\n{}", why()),
            _ => {}
        }
        assert!(Instant::now() < deadline, "migration did not finish: {info}");
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "migration completed in {:?} (QEMU: total {} ms, downtime {} ms, {} bytes of RAM)",
        started.elapsed(),
        info["total-time"],
        info["downtime"],
        info["ram"]["transferred"]
    );
    info
}

/// The `rx_frames` of the stats line the backend logs when connection `n` ends.
fn delivered(log: &str, n: usize) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(&format!("stats after connection {n}:")))?;
    line.split("rx_frames: ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Wait (10 s at most) until the backend logged the end of connection `n`; its `rx_frames`.
fn wait_delivered(log: &Path, n: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(v) = delivered(&text, n) {
            return v;
        }
        assert!(Instant::now() < deadline, "connection {n} did not end:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `cmd` in the guest over its console; its output.
fn guest_cmd(s: &mut UnixStream, id: u32, cmd: &str, deadline: Instant) -> String {
    let mut buf = String::new();
    writeln!(s, "LKCMD {id} {cmd}").unwrap();
    let done = line_with(s, &mut buf, &[&format!("LKOUT {id} ")], deadline);
    assert!(done.is_some(), "guest command {id} did not finish:\n{buf}");
    buf[buf.find(&format!("LKBEGIN {id}")).unwrap_or(0)..buf.find(&format!("LKOUT {id}")).unwrap()].to_string()
}

/// The last `n` numbers printed (one per line).
fn numbers(out: &str, n: usize) -> Vec<u64> {
    let v: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(v.len() >= n, "expected {n} counters in:\n{out}");
    v[v.len() - n..].to_vec()
}

const COUNTERS: &str = "cat /sys/class/net/eth0/statistics/tx_packets /sys/class/net/eth0/statistics/rx_packets";

fn backend(sock: &Path, log: &Path) -> Kill {
    Kill(
        Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
            .env("LANEKIT_LAB", "1") // --loopback is lab-only
            .args(["--loopback", "--queues", "2", "--socket"])
            .arg(sock)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Removes the test's directory, on failure too.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(path.exists(), "{} never appeared", path.display());
}

#[test]
#[ignore = "needs root, QEMU and the guest image (make test-vhost as root)"]
fn qemu_live_migration_to_another_backend_and_back_keeps_the_guest_receiving() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root: run `make test-vhost` as root");
    let qemu = Command::new("sh").args(["-c", "command -v qemu-system-x86_64"]).output().expect("run sh");
    assert!(qemu.status.success(), "qemu-system-x86_64 not installed (make deps)");
    let (kernel, initrd) = guest_image();
    let dir = std::env::temp_dir().join(format!("lk-vhost-mig-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Cleanup(dir.clone());
    let p = |n: &str| dir.join(n);
    let (log_a, log_b) = (p("backend-src.log"), p("backend-dst.log"));
    let read = |f: &Path| std::fs::read_to_string(f).unwrap_or_default();
    let mut backend_a = backend(&p("src.sock"), &log_a);
    let mut backend_b = backend(&p("dst.sock"), &log_b);
    wait_for(&p("src.sock"));
    wait_for(&p("dst.sock"));
    let deadline = Instant::now() + Duration::from_secs(240);
    let qmp_arg = |n: &str| vec!["-qmp".to_string(), format!("unix:{},server=on,wait=off", p(n).display())];

    let src = start_qemu_with(
        &p("src.sock"),
        &p("src-serial.sock"),
        "",
        &kernel,
        &initrd,
        Stdio::from(std::fs::File::create(p("qemu-src.log")).unwrap()),
        &qmp_arg("src-qmp.sock"),
    );
    let mut s = serial_console(&p("src-serial.sock"), deadline, String::new);
    let mut buf = String::new();
    let ready = line_with(&mut s, &mut buf, &["LK-READY", "LK-FAIL"], deadline);
    let ready = ready.unwrap_or_else(|| panic!("guest did not boot:\n{buf}\n--- backend ---\n{}", read(&log_a)));
    assert!(ready.starts_with("LK-READY net=up"), "guest network not up: {ready:?}\n{buf}");

    // Frames to a neighbour whose MAC is the guest's own come back to it through the loopback
    // backend (rx_packets counts them; the IP layer drops them).
    let out = guest_cmd(
        &mut s,
        1,
        &format!("arp -s 169.254.77.9 52:54:00:12:34:56 && ping -q -c 20 -i 0.01 169.254.77.9 >/dev/null; {COUNTERS}"),
        deadline,
    );
    let before = numbers(&out, 2);
    assert!(before[1] >= 20, "looped-back frames before migration: {out}");

    let dst = start_qemu_with(
        &p("dst.sock"),
        &p("dst-serial.sock"),
        "",
        &kernel,
        &initrd,
        Stdio::from(std::fs::File::create(p("qemu-dst.log")).unwrap()),
        &[qmp_arg("dst-qmp.sock"), vec!["-incoming".into(), format!("unix:{}", p("mig.sock").display())]].concat(),
    );
    let mut d = serial_console(&p("dst-serial.sock"), deadline, || read(&p("qemu-dst.log")));
    let mut qmp = Qmp::connect(&p("src-qmp.sock"), deadline);
    wait_for(&p("mig.sock"));

    // Traffic across the migration: 100 frames/s for ~20 s; the command ends on the destination.
    writeln!(s, "LKCMD 2 ping -q -c 2000 -i 0.01 169.254.77.9 >/dev/null; {COUNTERS}").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let uri = format!("unix:{}", p("mig.sock").display());
    migrate(&mut qmp, &uri, deadline, || {
        format!("--- source backend ---\n{}\n--- qemu ---\n{}", read(&log_a), read(&p("qemu-src.log")))
    });
    let src_log = read(&log_a);
    assert!(src_log.contains("dirty page logging on (VHOST_F_LOG_ALL acked)"), "source never logged:\n{src_log}");
    assert!(src_log.contains("dirty log: "), "no SET_LOG_BASE reached the source:\n{src_log}");
    // QEMU switched the running rings' log flag with SET_VRING_ADDR; the relay kept it (see
    // `relay.rs`, `Rings`).
    assert!(
        src_log.contains("SET_VRING_ADDR with the running ring's addresses (VHOST_VRING_F_LOG on)"),
        "QEMU did not re-send the ring addresses:\n{src_log}"
    );

    // The guest now runs on the destination: the command finishes there.
    let mut dbuf = String::new();
    let done = line_with(&mut d, &mut dbuf, &["LKOUT 2 "], deadline);
    assert!(done.is_some(), "traffic command did not finish on the destination:\n{dbuf}\n{}", read(&log_b));
    let during = numbers(&dbuf[..dbuf.find("LKOUT 2").unwrap()], 2);
    let (tx, rx) = (during[0] - before[0], during[1] - before[1]);
    println!("across the migration: guest sent {tx} frames, received {rx} back ({} lost)", tx.saturating_sub(rx));
    assert!(tx >= 2000, "the guest sent {tx} frames");
    assert!(rx + 32 >= tx, "frames lost across the switch-over: sent {tx}, received {rx}");
    // And it keeps going on the destination alone.
    let out = guest_cmd(&mut d, 3, &format!("ping -q -c 50 -i 0.01 169.254.77.9 >/dev/null; {COUNTERS}"), deadline);
    let after = numbers(&out, 2);
    assert!(after[1] >= during[1] + 50, "destination: no frames after the migration:\n{out}");

    // Back again: the source QEMU quits (its backend serves the next frontend), a new QEMU
    // waits on the first backend, and the VM migrates back there under traffic.
    drop(src);
    let a_first = wait_delivered(&log_a, 1);
    let back = start_qemu_with(
        &p("src.sock"),
        &p("back-serial.sock"),
        "",
        &kernel,
        &initrd,
        Stdio::from(std::fs::File::create(p("qemu-back.log")).unwrap()),
        &[qmp_arg("back-qmp.sock"), vec!["-incoming".into(), format!("unix:{}", p("mig-back.sock").display())]]
            .concat(),
    );
    let mut r = serial_console(&p("back-serial.sock"), deadline, || read(&p("qemu-back.log")));
    let mut qmp_dst = Qmp::connect(&p("dst-qmp.sock"), deadline);
    wait_for(&p("mig-back.sock"));
    writeln!(d, "LKCMD 4 ping -q -c 1000 -i 0.01 169.254.77.9 >/dev/null; {COUNTERS}").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let uri = format!("unix:{}", p("mig-back.sock").display());
    migrate(&mut qmp_dst, &uri, deadline, || {
        format!("--- backend ---\n{}\n--- qemu ---\n{}", read(&log_b), read(&p("qemu-dst.log")))
    });
    assert!(read(&log_b).contains("dirty page logging on (VHOST_F_LOG_ALL acked)"), "the destination never logged");
    let mut rbuf = String::new();
    let done = line_with(&mut r, &mut rbuf, &["LKOUT 4 "], deadline);
    assert!(done.is_some(), "traffic command did not finish back on the source:\n{rbuf}\n{}", read(&log_a));
    let home = numbers(&rbuf[..rbuf.find("LKOUT 4").unwrap()], 2);
    let (tx, rx) = (home[0] - after[0], home[1] - after[1]);
    println!("across the migration back: guest sent {tx} frames, received {rx} back ({} lost)", tx.saturating_sub(rx));
    assert!(tx >= 1000 && rx + 32 >= tx, "migration back: sent {tx}, received {rx}");

    // Each backend moved the frames of its time with the VM (its counters, logged when its QEMU
    // disconnects).
    drop(dst);
    let b_delivered = wait_delivered(&log_b, 1);
    drop(back);
    let a_second = wait_delivered(&log_a, 2);
    println!("frames into the guest: first backend {a_first} then {a_second}, second backend {b_delivered}");
    assert!(a_first >= 20 && b_delivered >= 50 && a_second >= 900, "{a_first} / {b_delivered} / {a_second}");
    let _ = backend_a.0.kill();
    let _ = backend_b.0.kill();
}
