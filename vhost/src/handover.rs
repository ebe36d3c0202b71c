//! Client side of the agent's AF_XDP socket handover (protocol in `xsk.rs`'s module docs).

use std::fs::File;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::pkt_gso::GsoSocket;
use crate::pkt_rx::RxGsoSocket;
use crate::rss::RssMap;
use crate::xsk::{XskParams, XskPort};

/// Protocol version spoken.
pub const VERSION: u32 = 1;
/// Largest reply body.
pub const MAX_BODY: usize = 64 * 1024;
/// Most fds in a reply (31 queue pairs and the RSS map).
pub const MAX_FDS: usize = 63;

/// The backend's request.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    /// [`VERSION`].
    pub version: u32,
    /// VM name the sockets are for.
    pub vm: String,
    /// The backend takes the VM's RSS map (and offers virtio RSS): the agent adds it to the
    /// reply only when asked, so a backend that does not know it gets the old reply.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rss: bool,
    /// The backend writes AF_XDP TX metadata in front of its TX frames: the agent may register
    /// the UMEM with `tx_metadata_len` (and says so per queue); an agent that does not know the
    /// field ignores it and the backend computes checksums itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tx_meta: bool,
    /// The backend sends TSO/USO frames whole through an `AF_PACKET` GSO socket per queue
    /// (`pkt_gso.rs`) when the agent hands one (`"gso":true` in the queue's entry); an agent
    /// that does not know the field hands none and the backend cuts the frames itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tx_gso: bool,
    /// The backend receives whole packets through an `AF_PACKET` socket per queue
    /// (`pkt_rx.rs`, `--rx-gso kernel`) when the agent hands one (`"rx_gso":true` in the queue's
    /// entry); the agent then steers the VM's frames there instead of to the AF_XDP sockets. An
    /// agent that does not know the field hands none: the AF_XDP path, as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rx_gso: bool,
}

/// One queue of the agent's reply.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueueInfo {
    pub queue: u32,
    pub umem_size: u64,
    pub frame_size: u32,
    pub frame_count: u32,
    pub fill_size: u32,
    pub comp_size: u32,
    pub rx_size: u32,
    pub tx_size: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tx_metadata_len: u32,
    /// A third fd follows this queue's pair: its GSO socket.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gso: bool,
    /// One more fd follows (after the GSO socket, if any): the queue's wire -> guest packet
    /// socket (`pkt_rx.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rx_gso: bool,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl From<QueueInfo> for XskParams {
    fn from(q: QueueInfo) -> Self {
        XskParams {
            queue: q.queue,
            umem_size: q.umem_size,
            frame_size: q.frame_size,
            frame_count: q.frame_count,
            fill_size: q.fill_size,
            comp_size: q.comp_size,
            rx_size: q.rx_size,
            tx_size: q.tx_size,
            tx_metadata_len: q.tx_metadata_len,
        }
    }
}

/// The agent's reply body.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u32,
    /// One entry per queue pair, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueInfo>,
    /// Set instead of `queues` when the agent refuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The VM's RSS configuration map, when the agent hands one (its fd is the last one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssInfo>,
}

/// The RSS map entry of the reply: a one-entry `BPF_F_MMAPABLE` array whose value is
/// `struct lk_vm_rss_cfg` (`bpf/lib/vm_rss.h`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RssInfo {
    /// Size of the map's value; must be [`crate::rss::MAP_VALUE_SIZE`].
    pub value_size: u32,
}

/// One queue of a valid reply: its entry, AF_XDP socket, UMEM file, GSO socket and wire -> guest
/// packet socket.
pub type QueueFds = (QueueInfo, OwnedFd, File, Option<OwnedFd>, Option<OwnedFd>);

/// What a valid reply carries.
pub type Handout = (Vec<QueueFds>, Option<(RssInfo, OwnedFd)>);

fn err(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A connected or listening `SOCK_SEQPACKET` unix socket.
pub fn seqpacket(path: &Path, listen: bool) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before being owned.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let sap = (&raw const sa).cast::<libc::sockaddr>();
    // SAFETY: sap points to an initialised sockaddr_un of `len` bytes.
    let r = unsafe {
        if listen {
            let r = libc::bind(raw, sap, len);
            if r == 0 {
                libc::listen(raw, 8)
            } else {
                r
            }
        } else {
            libc::connect(raw, sap, len)
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Send one message with optional fds.
pub fn send_msg(fd: RawFd, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let r = sendmsg_fds(fd, body, fds)?;
    if r != body.len() {
        return Err(err(format!("short send: {r} of {} bytes", body.len())));
    }
    Ok(())
}

/// One `sendmsg` of `body` with `fds` attached (SCM_RIGHTS; at most [`MAX_FDS`]); returns the
/// bytes sent, which may be fewer than `body` on a stream socket (the fds go with the first).
pub(crate) fn sendmsg_fds(fd: RawFd, body: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut iov = libc::iovec { iov_base: body.as_ptr() as *mut libc::c_void, iov_len: body.len() };
    let mut cbuf = [0u64; 64];
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: msg_control points to cbuf, 512 bytes >= CMSG_SPACE(MAX_FDS * 4); the header
        // and data written below stay inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: msg and everything it points to are valid for the call.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Receive one message (at most [`MAX_BODY`] bytes) and the fds sent with it.
pub fn recv_msg(fd: RawFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut body = vec![0u8; MAX_BODY];
    let mut iov = libc::iovec { iov_base: body.as_mut_ptr().cast(), iov_len: body.len() };
    let mut cbuf = vec![0u64; 64];
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.len() * 8;
    // SAFETY: msg points to valid buffers of the declared sizes.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: msg was just filled by a successful recvmsg and its control buffer is alive.
    let fds = unsafe { take_scm_rights(&msg) };
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(err("reply truncated (body over 64 KiB or more than 62 fds)".into()));
    }
    body.truncate(n as usize);
    Ok((body, fds))
}

/// Parse and check a reply for `pairs` queue pairs; returns the queues paired with their fds.
pub fn check_reply(body: &[u8], fds: Vec<OwnedFd>, pairs: u16) -> io::Result<Handout> {
    let reply: Reply = serde_json::from_slice(body).map_err(|e| err(format!("bad reply json: {e}")))?;
    if reply.version != VERSION {
        return Err(err(format!("agent speaks version {}, we speak {VERSION}", reply.version)));
    }
    if let Some(e) = reply.error {
        return Err(io::Error::other(format!("agent refused: {e}")));
    }
    if reply.queues.len() != usize::from(pairs) {
        return Err(err(format!("agent sent {} queues, {pairs} queue pairs configured", reply.queues.len())));
    }
    let gso = reply.queues.iter().filter(|q| q.gso).count();
    let rx_gso = reply.queues.iter().filter(|q| q.rx_gso).count();
    let want = 2 * reply.queues.len() + gso + rx_gso + usize::from(reply.rss.is_some());
    if fds.len() != want {
        return Err(err(format!(
            "agent sent {} fds for {} queues{}{}{}",
            fds.len(),
            reply.queues.len(),
            if gso > 0 { format!(" ({gso} with a gso socket)") } else { String::new() },
            if rx_gso > 0 { format!(" ({rx_gso} with an rx packet socket)") } else { String::new() },
            if reply.rss.is_some() { " and the rss map" } else { "" }
        )));
    }
    let mut fds = fds.into_iter();
    let mut out = Vec::new();
    for (i, q) in reply.queues.into_iter().enumerate() {
        if q.queue as usize != i {
            return Err(err(format!("queue entry {i} is for queue {}", q.queue)));
        }
        XskParams::from(q).validate()?;
        let (Some(xsk), Some(umem)) = (fds.next(), fds.next()) else {
            return Err(err("missing fds".into()));
        };
        let gso = if q.gso { Some(fds.next().ok_or_else(|| err("missing gso fd".into()))?) } else { None };
        let rx =
            if q.rx_gso { Some(fds.next().ok_or_else(|| err("missing rx packet socket fd".into()))?) } else { None };
        out.push((q, xsk, File::from(umem), gso, rx));
    }
    let rss = match (reply.rss, fds.next()) {
        (Some(info), Some(fd)) => Some((info, fd)),
        _ => None,
    };
    Ok((out, rss))
}

/// Ask the agent at `path` for the sockets of `vm` and take them over as ports; with `tx_gso`
/// also each queue's GSO socket, with `rx_gso` each queue's wire -> guest packet socket, when the
/// agent hands them.
pub fn request_ports(
    path: &Path,
    vm: &str,
    pairs: u16,
    tx_gso: bool,
    rx_gso: bool,
) -> io::Result<(Vec<XskPort>, Option<RssMap>)> {
    let sock = seqpacket(path, false)
        .map_err(|e| io::Error::new(e.kind(), format!("connect to agent at {}: {e}", path.display())))?;
    let req =
        serde_json::to_vec(&Request { version: VERSION, vm: vm.to_string(), rss: true, tx_meta: true, tx_gso, rx_gso })
            .map_err(io::Error::other)?;
    send_msg(sock.as_raw_fd(), &req, &[])?;
    let (body, fds) = recv_msg(sock.as_raw_fd())?;
    if body.is_empty() {
        return Err(err("agent closed the connection without a reply".into()));
    }
    let (queues, rss) = check_reply(&body, fds, pairs)?;
    let ports = queues
        .into_iter()
        .map(|(q, xsk, umem, gso, rx)| {
            let mut port = XskPort::from_fds(xsk, &umem, q.into())
                .map_err(|e| io::Error::new(e.kind(), format!("queue {}: {e}", q.queue)))?;
            if let Some(fd) = gso {
                let g = GsoSocket::from_fd(fd)
                    .map_err(|e| io::Error::new(e.kind(), format!("queue {} gso socket: {e}", q.queue)))?;
                port.set_gso(g);
            }
            if let Some(fd) = rx {
                let r = RxGsoSocket::from_fd(fd)
                    .map_err(|e| io::Error::new(e.kind(), format!("queue {} rx packet socket: {e}", q.queue)))?;
                port.set_rx_gso(r);
            }
            Ok(port)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let rss = rss.map(|(info, fd)| RssMap::from_fd(fd, info.value_size as usize)).transpose()?;
    Ok((ports, rss))
}

/// Takes ownership of the fds carried in the SCM_RIGHTS control messages of
/// `msg`.
///
/// # Safety
/// `msg` must be a msghdr that a successful `recvmsg` call just filled, with
/// its control buffer still alive; each fd is then owned exactly once, here.
pub(crate) unsafe fn take_scm_rights(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: per this function's contract the kernel filled msg_control with well-formed cmsgs
    // within msg_controllen; we only walk them with the CMSG macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    fds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(queue: u32) -> QueueInfo {
        QueueInfo {
            queue,
            umem_size: 4096 * 2048,
            frame_size: 2048,
            frame_count: 4096,
            fill_size: 2048,
            comp_size: 2048,
            rx_size: 2048,
            tx_size: 2048,
            tx_metadata_len: 0,
            gso: false,
            rx_gso: false,
        }
    }

    fn memfds(n: usize) -> Vec<OwnedFd> {
        (0..n).map(|_| OwnedFd::from(crate::xsk::memfd("t", 1).unwrap())).collect()
    }

    #[test]
    fn request_and_reply_wire_format() {
        let req = serde_json::to_string(&Request {
            version: 1,
            vm: "vm-a".into(),
            rss: false,
            tx_meta: false,
            tx_gso: false,
            rx_gso: false,
        })
        .unwrap();
        assert_eq!(req, r#"{"version":1,"vm":"vm-a"}"#);
        let req = serde_json::to_string(&Request {
            version: 1,
            vm: "vm-a".into(),
            rss: true,
            tx_meta: true,
            tx_gso: true,
            rx_gso: true,
        })
        .unwrap();
        assert_eq!(req, r#"{"version":1,"vm":"vm-a","rss":true,"tx_meta":true,"tx_gso":true,"rx_gso":true}"#);
        let body = r#"{"version":1,"queues":[{"queue":0,"umem_size":8388608,"frame_size":2048,"frame_count":4096,"fill_size":2048,"comp_size":2048,"rx_size":2048,"tx_size":2048}]}"#;
        let r: Reply = serde_json::from_str(body).unwrap();
        assert_eq!(r.queues, vec![info(0)]);
        assert_eq!(check_reply(body.as_bytes(), memfds(2), 1).unwrap().0.len(), 1);
        // An agent that registered the UMEM with TX metadata room says how much.
        let meta = body.replace(r#""tx_size":2048}"#, r#""tx_size":2048,"tx_metadata_len":24}"#);
        let r: Reply = serde_json::from_str(&meta).unwrap();
        assert_eq!(XskParams::from(r.queues[0]).tx_metadata_len, 24);
        let odd = body.replace(r#""tx_size":2048}"#, r#""tx_size":2048,"tx_metadata_len":12}"#);
        assert!(check_reply(odd.as_bytes(), memfds(2), 1).is_err(), "tx_metadata_len not a multiple of 8");
        // With the RSS map: its fd comes last.
        let body = body.replace("}]}", r#"}],"rss":{"value_size":312}}"#);
        let (qs, rss) = check_reply(body.as_bytes(), memfds(3), 1).unwrap();
        assert_eq!((qs.len(), rss.map(|r| r.0.value_size)), (1, Some(312)));
        // With a GSO socket: it follows its queue's pair, before the RSS map.
        let gso = body.replace(r#""tx_size":2048}"#, r#""tx_size":2048,"gso":true}"#);
        let (qs, rss) = check_reply(gso.as_bytes(), memfds(4), 1).unwrap();
        assert!(qs[0].0.gso && qs[0].3.is_some() && rss.is_some());
        let e = check_reply(gso.as_bytes(), memfds(3), 1).unwrap_err().to_string();
        assert!(e.contains("3 fds for 1 queues (1 with a gso socket) and the rss map"), "{e}");
        // With an rx packet socket too: it follows the GSO socket; alone, it follows the pair.
        let both = gso.replace(r#""gso":true}"#, r#""gso":true,"rx_gso":true}"#);
        let (qs, _) = check_reply(both.as_bytes(), memfds(5), 1).unwrap();
        assert!(qs[0].0.rx_gso && qs[0].3.is_some() && qs[0].4.is_some());
        let rx = body.replace(r#""tx_size":2048}"#, r#""tx_size":2048,"rx_gso":true}"#);
        let (qs, _) = check_reply(rx.as_bytes(), memfds(4), 1).unwrap();
        assert!(qs[0].3.is_none() && qs[0].4.is_some());
        let e = check_reply(both.as_bytes(), memfds(4), 1).unwrap_err().to_string();
        assert!(e.contains("(1 with a gso socket) (1 with an rx packet socket) and the rss map"), "{e}");
    }

    #[test]
    fn bad_replies_are_clear_errors() {
        let ok =
            |qs: Vec<QueueInfo>| serde_json::to_vec(&Reply { version: 1, queues: qs, error: None, rss: None }).unwrap();
        let with_rss = |qs: Vec<QueueInfo>| {
            serde_json::to_vec(&Reply { version: 1, queues: qs, error: None, rss: Some(RssInfo { value_size: 312 }) })
                .unwrap()
        };
        let cases: Vec<(Vec<u8>, usize, u16, &str)> = vec![
            (b"not json".to_vec(), 0, 1, "bad reply json"),
            (br#"{"version":2,"queues":[]}"#.to_vec(), 0, 1, "version 2"),
            (br#"{"version":1,"error":"no such vm"}"#.to_vec(), 0, 1, "no such vm"),
            (ok(vec![info(0)]), 2, 2, "1 queues, 2 queue pairs"),
            (ok(vec![info(0)]), 1, 1, "1 fds for 1 queues"),
            (ok(vec![info(1)]), 2, 1, "entry 0 is for queue 1"),
            (with_rss(vec![info(0)]), 2, 1, "2 fds for 1 queues and the rss map"),
            (ok(vec![QueueInfo { rx_size: 1000, ..info(0) }]), 2, 1, "rx_size 1000"),
        ];
        for (body, nfds, pairs, want) in cases {
            let e = check_reply(&body, memfds(nfds), pairs).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
    }

    #[test]
    fn fds_travel_with_the_message() {
        let dir = std::env::temp_dir().join(format!("lk-vhost-handover-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let listener = seqpacket(&dir, true).unwrap();
        let client = seqpacket(&dir, false).unwrap();
        // SAFETY: accept on a listening socket; result checked.
        let server = unsafe { libc::accept(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(server >= 0);
        // SAFETY: new fd owned by nobody else.
        let server = unsafe { OwnedFd::from_raw_fd(server) };
        let f = crate::xsk::memfd("payload", 4096).unwrap();
        send_msg(server.as_raw_fd(), b"hello", &[f.as_raw_fd(), f.as_raw_fd()]).unwrap();
        let (body, fds) = recv_msg(client.as_raw_fd()).unwrap();
        assert_eq!(body, b"hello");
        assert_eq!(fds.len(), 2);
        assert_eq!(File::from(fds.into_iter().next().unwrap()).metadata().unwrap().len(), 4096);
        let _ = std::fs::remove_file(&dir);
    }
}
