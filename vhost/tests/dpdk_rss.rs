//! What DPDK 22.11's virtio_user passes through vhost-user for virtio RSS, observed: an
//! in-process backend offers VIRTIO_NET_F_RSS and VIRTIO_NET_F_HASH_REPORT (an RSS map standing
//! in for the agent's), testpmd runs 2 queues with RSS (`--rxq=2`: the virtio PMD asks for
//! F_RSS), and the test reads what virtio_user acked and whether an RSS command reached the
//! backend's control queue. Root only (DPDK): `#[ignore]`d, run by `make test-vhost` as root.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::drivers::{rss_loop_backend, testpmd};
use lanekit_vhost::rss::{VIRTIO_NET_F_HASH_REPORT, VIRTIO_NET_F_RSS};

#[test]
#[ignore = "needs root and DPDK (make test-vhost as root)"]
fn virtio_user_masks_rss_and_hash_report() {
    let testpmd = testpmd();
    let sock = std::env::temp_dir().join(format!("lk-vhost-{}-dpdk-rss.sock", std::process::id()));
    let backend = rss_loop_backend([2, 0, 0, 0, 0, 9], &sock);
    let log_path = sock.with_extension("log");
    let mut pmd = Command::new(&testpmd)
        .args(["-l", "0,1", "--no-huge", "-m", "512", "--no-pci"])
        .args(["--file-prefix", &format!("lkvr{}", std::process::id())])
        .arg("--vdev")
        .arg(format!("net_virtio_user0,path={},queues=2", sock.display()))
        .args(["--", "--total-num-mbufs=16384", "--forward-mode=io", "--rxq=2", "--txq=2", "--stats-period", "0"])
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&log_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dpdk-testpmd");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(&log_path).unwrap_or_default();
        // The port is started (features set) once testpmd checks its link.
        if text.contains("Checking link statuses") || text.contains("Press enter to exit") {
            std::thread::sleep(Duration::from_secs(1));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked = backend.acked_features();
    let _ = pmd.stdin.take().map(|mut i| i.write_all(b"\n"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while pmd.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = pmd.kill();
    let _ = pmd.wait();
    let _ = std::fs::remove_file(&log_path);
    let _ = std::fs::remove_file(&sock);
    assert!(text.contains("Checking link statuses"), "testpmd did not start its port:\n{text}");
    let has = |b: u32| acked & (1 << b) != 0;
    println!(
        "DPDK virtio_user, 2 queues with RSS, backend offering both: acked features {acked:#x}: RSS={} \
         HASH_REPORT={}; configuration reaching the backend: {:?}",
        has(VIRTIO_NET_F_RSS),
        has(VIRTIO_NET_F_HASH_REPORT),
        backend.rss_config()
    );
    assert!(acked != 0, "virtio_user acked no features");
    assert!(!has(VIRTIO_NET_F_RSS) && !has(VIRTIO_NET_F_HASH_REPORT), "virtio_user now passes RSS: update the docs");
    assert_eq!(backend.rss_config(), None, "an RSS command reached the backend's control queue");
}
