//! The lab-only flags as a user meets them: `--help` does not list `--loopback` or `--no-seccomp`,
//! and without `LANEKIT_LAB=1` the binary refuses them, naming the flag and the switch, before it
//! creates its socket.

use std::process::Command;

fn vhost(args: &[&str], lab: bool) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lanekit-vhost"));
    c.args(args).env("RUST_LOG", "off");
    if lab {
        c.env("LANEKIT_LAB", "1");
    } else {
        c.env_remove("LANEKIT_LAB");
    }
    c.output().expect("run lanekit-vhost")
}

#[test]
fn lab_flags_refused_without_the_switch() {
    let help = vhost(&["--help"], false);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--xsk-socket"), "{help}");
    for flag in ["--loopback", "--no-seccomp"] {
        assert!(!help.contains(flag), "--help lists {flag}:\n{help}");
    }
    let dir = std::env::temp_dir().join(format!("lk-labflags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let sock = sock.to_str().unwrap();
    // Each case also has a bad MAC, so that a binary that let the flag through exits on it
    // instead of serving.
    for (args, flag) in [
        (vec!["--loopback", "--mac", "zz", "--socket", sock], "--loopback"),
        (vec!["--ifname", "lo", "--no-seccomp", "--mac", "zz", "--socket", sock], "--no-seccomp"),
        (vec!["--loopback", "--no-seccomp", "--mac", "zz", "--socket", sock], "--loopback"),
    ] {
        let out = vhost(&args, false);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted without LANEKIT_LAB=1");
        assert!(err.contains(flag) && err.contains("LANEKIT_LAB=1"), "{args:?}: {err}");
        assert!(!std::path::Path::new(sock).exists(), "{args:?}: the socket was created");
    }
    // With the switch a bad MAC is what fails: the flags themselves pass.
    let out = vhost(&["--loopback", "--no-seccomp", "--mac", "zz", "--socket", sock], true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bad mac address"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
