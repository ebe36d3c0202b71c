//! DPDK testpmd as a real virtio driver (virtio_user PMD) against the `lanekit-vhost` binary in
//! loopback mode: testpmd's io forwarding with `--tx-first` bounces frames through our TX and
//! RX paths. Root only (DPDK): `#[ignore]`d, run by `make test-vhost` as root. Bounded in time.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::drivers::{testpmd, Kill};

/// Serializes the testpmd runs of this file.
static SERIAL: Mutex<()> = Mutex::new(());

/// Packet counters from testpmd's "Accumulated forward statistics" block.
fn accumulated(out: &str, key: &str) -> Option<u64> {
    let block = &out[out.find("Accumulated forward statistics")?..];
    let rest = &block[block.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn run(queues: u16) {
    let testpmd = testpmd();
    // Each run busy-polls both cores: two at once starve each other's start-up.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sock = std::env::temp_dir().join(format!("lk-vhost-{}-testpmd{queues}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let backend = Kill(
        Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
            .env("LANEKIT_LAB", "1") // --loopback is lab-only
            .args(["--loopback", "--queues", &queues.to_string(), "--socket"])
            .arg(&sock)
            .stderr(Stdio::null())
            .spawn()
            .expect("start lanekit-vhost"),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sock.exists(), "backend socket did not appear");
    let vdev = format!("net_virtio_user0,path={},queues={queues}", sock.display());
    let q = queues.to_string();
    let log_path = sock.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut pmd = Kill(
        Command::new(&testpmd)
            .args(["-l", "0,1", "--no-huge", "-m", "512", "--no-pci"])
            .args(["--file-prefix", &format!("lkv{}q{queues}", std::process::id()), "--vdev", &vdev, "--"])
            .args(["--total-num-mbufs=16384", "--forward-mode=io", "--tx-first", "--stats-period", "0"])
            .args([format!("--rxq={q}"), format!("--txq={q}")])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start dpdk-testpmd"),
    );
    // Forward for ~3 s, then "Press enter to exit"; killed if still running 30 s later.
    std::thread::sleep(Duration::from_secs(3));
    let _ = pmd.0.stdin.take().expect("stdin").write_all(b"\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while pmd.0.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(pmd);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    let rx = accumulated(&text, "RX-packets:");
    let tx = accumulated(&text, "TX-packets:");
    drop(backend);
    let _ = std::fs::remove_file(&sock);
    let (rx, tx) = match (rx, tx) {
        (Some(rx), Some(tx)) => (rx, tx),
        _ => panic!("no forward statistics from testpmd:\n{text}"),
    };
    println!("testpmd over lanekit-vhost loopback, {queues} queue pair(s): rx {rx} tx {tx}");
    assert!(rx > 10_000 && tx > 10_000, "frames must cross the backend both ways: rx {rx} tx {tx}\n{text}");
}

#[test]
#[ignore = "needs root and DPDK (make test-vhost as root)"]
fn testpmd_virtio_user_forwards_through_the_backend() {
    run(1);
}

#[test]
#[ignore = "needs root and DPDK (make test-vhost as root)"]
fn testpmd_virtio_user_with_two_queue_pairs() {
    run(2);
}
