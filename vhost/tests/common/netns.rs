//! Root-only helpers: a network namespace that is always deleted, raw AF_PACKET sockets and a
//! tiny XDP program (XSKMAP redirect) loaded with raw bpf(2) calls.
#![allow(dead_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// Root-only tests are `#[ignore]`d (reported as ignored, never as passed) and run by
/// `make test-vhost` as root (`cargo test -- --ignored`); run without root they fail.
pub fn require_root(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "{test} needs root (network namespaces, AF_XDP, BPF): run `make test-vhost` as root");
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A network namespace `lk-vhost-test-<pid>-<tag>` holding a veth pair `lkv0`/`lkv1` (both up);
/// deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> io::Result<Netns> {
        let name = format!("lk-vhost-test-{}-{tag}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        // No IPv6 autoconfiguration chatter on the test links.
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
            .args(["net.ipv6.conf.default.disable_ipv6=1"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()));
        }
        ip(&["-n", &ns.name, "link", "add", "lkv0", "type", "veth", "peer", "name", "lkv1"])?;
        for dev in ["lkv0", "lkv1", "lo"] {
            ip(&["-n", &ns.name, "link", "set", dev, "up"])?;
        }
        Ok(ns)
    }

    /// Run `f` on a thread that entered this namespace; sockets it creates stay in it.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || -> io::Result<T> {
            let ns = File::open(&path)?;
            // SAFETY: setns on this thread only, with a valid namespace fd.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("netns thread panicked"))?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

pub fn ifindex(name: &str) -> u32 {
    let c = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated string.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// An AF_PACKET socket bound to `ifname` (all protocols), with a 50 ms receive timeout.
pub fn packet_socket(ifname: &str) -> io::Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); checked.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(proto)) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_ll is plain data.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = ifindex(ifname) as i32;
    // SAFETY: sa is a valid sockaddr_ll.
    if unsafe { libc::bind(raw, (&raw const sa).cast(), size_of::<libc::sockaddr_ll>() as u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let tv = libc::timeval { tv_sec: 0, tv_usec: 50_000 };
    // SAFETY: tv is a valid timeval.
    unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    Ok(fd)
}

pub fn packet_send(fd: RawFd, frame: &[u8]) -> io::Result<()> {
    // SAFETY: frame is a valid buffer.
    if unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receive frames with `ethertype` until `n` arrived or `timeout`.
pub fn packet_collect(fd: RawFd, ethertype: u16, n: usize, timeout: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while got.len() < n && Instant::now() < deadline {
        // SAFETY: buf is a writable buffer of its length.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r >= 14 && u16::from_be_bytes([buf[12], buf[13]]) == ethertype {
            got.push(buf[..r as usize].to_vec());
        }
    }
    got
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<RawFd> {
    // SAFETY: attr is a zero-padded 128-byte bpf_attr for this command.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as RawFd)
}

/// An XSKMAP plus an XDP program `return bpf_redirect_map(&map, ctx->rx_queue_index, XDP_PASS)`
/// attached (generic mode, through a BPF link) to `ifname`; detached when dropped.
pub struct XskRedirect {
    pub map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl XskRedirect {
    pub fn attach(ifname: &str) -> io::Result<XskRedirect> {
        let mut a = [0u64; 16];
        // BPF_MAP_CREATE: map_type XSKMAP (17), key 4, value 4, 4 entries.
        a[0] = 17 | 4 << 32;
        a[1] = 4 | 4 << 32;
        // SAFETY: the fd returned by the kernel is new and owned here.
        let map = unsafe { OwnedFd::from_raw_fd(bpf(0, &mut a)?) };
        let insn = |code: u8, dst: u8, src: u8, off: i16, imm: i32| -> u64 {
            u64::from(code) | u64::from(dst | src << 4) << 8 | u64::from(off as u16) << 16 | u64::from(imm as u32) << 32
        };
        let prog = [
            insn(0x61, 2, 1, 16, 0),              // r2 = ctx->rx_queue_index
            insn(0x18, 1, 1, 0, map.as_raw_fd()), // r1 = map (ld_imm64, pseudo map fd)
            0,
            insn(0xb7, 3, 0, 0, 2),  // r3 = XDP_PASS
            insn(0x85, 0, 0, 0, 51), // call bpf_redirect_map
            insn(0x95, 0, 0, 0, 0),  // exit
        ];
        let license = c"GPL";
        let mut log = vec![0u8; 4096];
        let mut a = [0u64; 16];
        a[0] = 6 | (prog.len() as u64) << 32; // BPF_PROG_TYPE_XDP
        a[1] = prog.as_ptr() as u64;
        a[2] = license.as_ptr() as u64;
        a[3] = 1 | (log.len() as u64) << 32; // log_level 1
        a[4] = log.as_mut_ptr() as u64;
        let prog_fd = bpf(5, &mut a).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            io::Error::other(format!("load xdp program: {e}: {}", String::from_utf8_lossy(&log[..end])))
        })?;
        // SAFETY: new fd owned here.
        let prog = unsafe { OwnedFd::from_raw_fd(prog_fd) };
        let mut a = [0u64; 16];
        // BPF_LINK_CREATE: prog_fd, target_ifindex, attach_type BPF_XDP (37), flags SKB mode.
        a[0] = prog.as_raw_fd() as u64 | u64::from(ifindex(ifname)) << 32;
        a[1] = 37 | 2 << 32;
        // SAFETY: new fd owned here.
        let link = unsafe { OwnedFd::from_raw_fd(bpf(28, &mut a)?) };
        Ok(XskRedirect { map, _prog: prog, _link: link })
    }

    /// Point queue `queue` of the map at AF_XDP socket `xsk`.
    pub fn insert(&self, queue: u32, xsk: RawFd) -> io::Result<()> {
        let key = queue;
        let value = xsk as u32;
        let mut a = [0u64; 16];
        a[0] = self.map.as_raw_fd() as u64;
        a[1] = (&raw const key) as u64;
        a[2] = (&raw const value) as u64;
        bpf(2, &mut a).map(|_| ())
    }
}
