//! The binary as the agent runs it (`--run-as`, root): after startup the process has the VM's
//! uid, no capabilities in any set (bounding included), `no_new_privs`, a seccomp filter, and is
//! not dumpable; the agent can still read its command line (adoption by pid file + cmdline).

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
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

/// KubeVirt's socket volume lies inside kubelet's pods directory (mode 0750, root): the backend
/// binds its socket while still root, then the socket is the backend user's (`lchown`) with the
/// frontend's ACL. A link the pod left at the socket's path is replaced, not followed: the file
/// it pointed to keeps its owner. (A link swapped in between bind and chown is not followed
/// either — `lchown`, `lsetxattr` — but that race is not exercised here.)
#[test]
fn run_as_binds_beneath_a_root_only_directory() {
    // SAFETY: geteuid has no arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (--run-as switches uid)");
        return;
    }
    let top = std::env::temp_dir().join(format!("lk-confined-pods-{}", std::process::id()));
    let vol = top.join("uid").join("volumes").join("kubernetes.io~empty-dir").join("sockets");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o2777)).unwrap();
    let victim = top.join("victim");
    std::fs::write(&victim, b"root's").unwrap();
    let sock = vol.join("lanekit-pod1.sock");
    std::os::unix::fs::symlink(&victim, &sock).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"))
        .env("LANEKIT_LAB", "1") // --loopback is lab-only
        .args(["--loopback", "--run-as", "200202:200202", "--frontend-uid", "107", "--socket"])
        .arg(&sock)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start lanekit-vhost");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_field(pid, "Seccomp:") != "2" && Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sock_meta = std::fs::symlink_metadata(&sock);
    let victim_meta = std::fs::metadata(&victim).unwrap();
    let exited = child.try_wait().ok().flatten();
    let _ = child.kill();
    let out = child.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&top);
    assert!(exited.is_none(), "the backend exited ({exited:?}): {out}");
    let m = sock_meta.expect("vhost-user socket");
    assert!(m.file_type().is_socket(), "{} is a {:?}, want the socket", sock.display(), m.file_type());
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (200202, 200202, 0o660), "socket: the backend's, ACL mask rw");
    assert_eq!((victim_meta.uid(), victim_meta.mode() & 0o777), (0, 0o644), "the linked file kept its owner");
}
