//! Guest -> wire GSO through the kernel: an `AF_PACKET` socket with `PACKET_VNET_HDR`, bound to
//! the same device as the queue's AF_XDP socket with protocol 0 (it receives nothing), takes a
//! validated TSO/USO frame whole with a `virtio_net_hdr` in front. The kernel builds ONE GSO,
//! `CHECKSUM_PARTIAL` skb from it (`virtio_net_hdr_to_skb`, marked `SKB_GSO_DODGY`: its headers
//! are checked again before segmentation) that crosses the veth like a pod's TSO traffic: the
//! agent's tcx programs see one packet, and it is cut (if at all) where the route leaves.
//!
//! The header handed to the kernel is never the guest's: `offload::Gso::kernel_hdr` rebuilds it
//! from the frame the backend parsed and validated (its own copy), the guest's is only a
//! request. The kernel's own checks are a second line.
//!
//! Ordering: a queue's AF_XDP frames and its GSO packets are sent by the same thread, and both
//! sends end synchronously in the device's `ndo_start_xmit` (the veth's peer backlog on this
//! CPU), so one flow's frames keep their order; the caller sends the AF_XDP frames queued
//! before a GSO packet first.
//!
//! The agent creates the socket (`CAP_NET_RAW`) and hands it over with the AF_XDP socket
//! (`xsk.rs`, handover protocol); with `--ifname` the backend opens it itself.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const SOL_PACKET: libc::c_int = 263;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;

/// An `AF_PACKET` socket that sends GSO frames behind a `virtio_net_hdr`.
#[derive(Debug)]
pub struct GsoSocket {
    fd: OwnedFd,
    /// GSO packets the kernel took.
    pub sent: u64,
    /// Sends the kernel refused (the frame was then cut by the backend).
    pub failed: u64,
}

impl GsoSocket {
    /// Take over a socket from the agent; it must be an `AF_PACKET` socket with
    /// `PACKET_VNET_HDR` on (checked: a socket without it would put the header on the wire).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let dom = getsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN)?;
        if dom != libc::AF_PACKET {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("gso fd is not AF_PACKET (domain {dom})")));
        }
        if getsockopt_int(fd.as_raw_fd(), SOL_PACKET, PACKET_VNET_HDR)? != 1 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "gso socket without PACKET_VNET_HDR"));
        }
        Ok(GsoSocket { fd, sent: 0, failed: 0 })
    }

    /// Open one on `ifindex` in the current network namespace (needs `CAP_NET_RAW`).
    pub fn open(ifindex: u32) -> io::Result<Self> {
        // SAFETY: plain socket(2); the result is checked before being owned.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt_int(raw, SOL_PACKET, PACKET_VNET_HDR, 1)?;
        // Best effort: without it the packet only passes the device's (noqueue) qdisc.
        let _ = setsockopt_int(raw, SOL_PACKET, PACKET_QDISC_BYPASS, 1);
        // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = 0; // receive nothing
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: sa is an initialised sockaddr_ll of the given size.
        let r = unsafe { libc::bind(raw, (&raw const sa).cast(), size_of::<libc::sockaddr_ll>() as libc::socklen_t) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        GsoSocket::from_fd(fd)
    }

    /// Send `frame` as one GSO packet described by `hdr` (from `Gso::kernel_hdr`). Never blocks:
    /// a full send buffer is an error (`WouldBlock`) and the caller cuts the frame itself.
    pub fn send(&mut self, hdr: &[u8; 10], frame: &[u8]) -> io::Result<()> {
        let iov = [
            libc::iovec { iov_base: hdr.as_ptr() as *mut libc::c_void, iov_len: hdr.len() },
            libc::iovec { iov_base: frame.as_ptr() as *mut libc::c_void, iov_len: frame.len() },
        ];
        // SAFETY: msghdr is plain data; all zeroes is a valid value.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len();
        // SAFETY: msg and the two buffers it points to are valid for the call; the kernel only
        // reads them.
        let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            self.failed += 1;
            return Err(io::Error::last_os_error());
        }
        if r as usize != hdr.len() + frame.len() {
            self.failed += 1;
            return Err(io::Error::other(format!("short gso send: {r} of {} bytes", hdr.len() + frame.len())));
        }
        self.sent += 1;
        Ok(())
    }

    /// The socket.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

pub(crate) fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of their sizes for the duration of the call.
    let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

pub(crate) fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: v is a readable c_int for the duration of the call.
    let r = unsafe {
        libc::setsockopt(fd, level, name, (&raw const v).cast(), size_of::<libc::c_int>() as libc::socklen_t)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_that_is_not_af_packet_with_vnet_hdr_is_refused() {
        let f = crate::xsk::memfd("not-a-socket", 1).unwrap();
        let e = GsoSocket::from_fd(OwnedFd::from(f)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        // SAFETY: plain socket(2); checked.
        let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
        assert!(raw >= 0);
        // SAFETY: new fd owned by nobody else.
        let e = GsoSocket::from_fd(unsafe { OwnedFd::from_raw_fd(raw) }).unwrap_err();
        assert!(e.to_string().contains("not AF_PACKET"), "{e}");
    }
}
