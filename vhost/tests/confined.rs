//! The binary as the agent runs it (`--run-as`, root): after startup the process has the VM's
//! uid, no capabilities in any set (bounding included), `no_new_privs`, a seccomp filter, and is
//! not dumpable; the agent can still read its command line (adoption by pid file + cmdline).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

fn status_field(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string()).unwrap_or_default()
}

#[test]
fn run_as_confines_the_backend() {
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (--run-as switches uid)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("lk-confined-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = dir.join("vhost.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
        .env("LANEKIT_LAB", "1") // --loopback is lab-only
        .args(["--loopback", "--run-as", "200201:200201", "--frontend-uid", "107", "--socket"])
        .arg(&sock)
        .spawn()
        .expect("start lanekit-vhost");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_field(pid, "Seccomp:") != "2" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let fields: Vec<(&str, String)> =
        ["Uid:", "Gid:", "NoNewPrivs:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:", "Seccomp:"]
            .iter()
            .map(|k| (*k, status_field(pid, k)))
            .collect();
    let meta = std::fs::metadata(format!("/proc/{pid}/environ")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let sock_meta = std::fs::metadata(&sock);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let zero = "0000000000000000".to_string();
    let want = [
        ("Uid:", "200201\t200201\t200201\t200201".to_string()),
        ("Gid:", "200201\t200201\t200201\t200201".to_string()),
        ("NoNewPrivs:", "1".to_string()),
        ("CapInh:", zero.clone()),
        ("CapPrm:", zero.clone()),
        ("CapEff:", zero.clone()),
        ("CapBnd:", zero.clone()),
        ("CapAmb:", zero),
        ("Seccomp:", "2".to_string()),
    ];
    for ((k, got), (_, w)) in fields.iter().zip(want.iter()) {
        assert_eq!(got, w, "{k} in /proc/{pid}/status");
    }
    assert_eq!(meta.uid(), 0, "not dumpable: /proc/{pid}/environ belongs to root");
    assert!(cmdline.windows(8).any(|w| w == b"--run-as"), "cmdline readable for adoption");
    let m = sock_meta.expect("vhost-user socket");
    assert_eq!((m.uid(), m.mode() & 0o777), (200201, 0o660), "socket: the backend's, ACL mask rw");
}
