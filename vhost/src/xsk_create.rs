//! Sockets the backend creates itself (`--ifname`, tests): step 4 of the handover without the
//! agent, and the bind.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{
    setsockopt, Mmap, SockaddrXdp, UmemReg, UmemRegMeta, XskParams, AF_XDP, XDP_COPY, XDP_RX_RING, XDP_TX_RING,
    XDP_UMEM_COMPLETION_RING, XDP_UMEM_FILL_RING, XDP_UMEM_REG, XDP_UMEM_TX_METADATA_LEN,
};

/// Steps 4 of the handover without the bind: an AF_XDP socket with a memfd UMEM registered
/// (aligned, headroom 0, chunk = frame size, `tx_metadata_len` when not 0: the kernel refuses
/// it with EINVAL before 6.8) and its four rings created. Needs `CAP_NET_RAW`.
pub fn create_unbound(params: XskParams) -> io::Result<(OwnedFd, File)> {
    params.validate()?;
    let umem = memfd("lanekit-umem", params.umem_size)?;
    // SAFETY: plain socket(2) call; the result is checked before being owned.
    let raw = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a new fd that nothing else owns.
    let xsk = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = usize::try_from(params.umem_size).map_err(io::Error::other)?;
    // The registration mapping may go away after XDP_UMEM_REG: the kernel pins the pages, which
    // are the memfd's, and whoever uses the socket maps the same memfd again.
    let reg_map = Mmap::map(umem.as_raw_fd(), size, 0)?;
    let reg = UmemReg {
        addr: reg_map.ptr.as_ptr() as u64,
        len: params.umem_size,
        chunk_size: params.frame_size,
        headroom: 0,
    };
    if params.tx_metadata_len > 0 {
        let meta = UmemRegMeta { v1: reg, flags: XDP_UMEM_TX_METADATA_LEN, tx_metadata_len: params.tx_metadata_len };
        setsockopt(raw, XDP_UMEM_REG, &meta)?;
    } else {
        setsockopt(raw, XDP_UMEM_REG, &reg)?;
    }
    setsockopt(raw, XDP_UMEM_FILL_RING, &params.fill_size)?;
    setsockopt(raw, XDP_UMEM_COMPLETION_RING, &params.comp_size)?;
    setsockopt(raw, XDP_RX_RING, &params.rx_size)?;
    setsockopt(raw, XDP_TX_RING, &params.tx_size)?;
    Ok((xsk, umem))
}

/// The index of interface `ifname` in the current network namespace.
pub fn ifindex(ifname: &str) -> io::Result<u32> {
    let name = CString::new(ifname).map_err(io::Error::other)?;
    // SAFETY: name is a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifname}")));
    }
    Ok(ifindex)
}

/// Bind an AF_XDP socket to (`ifname`, `queue`) in copy mode. Needs `CAP_NET_RAW`.
pub fn bind_copy(fd: RawFd, ifname: &str, queue: u32) -> io::Result<()> {
    let ifindex = ifindex(ifname)?;
    let sa = SockaddrXdp { family: AF_XDP as u16, flags: XDP_COPY, ifindex, queue_id: queue, shared_umem_fd: 0 };
    // SAFETY: sa is a valid sockaddr_xdp of the given length.
    let r = unsafe { libc::bind(fd, (&raw const sa).cast(), size_of::<SockaddrXdp>() as libc::socklen_t) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bind AF_XDP to {ifname} queue {queue}: {e}")));
    }
    Ok(())
}

/// A memfd of `size` bytes.
pub fn memfd(name: &str, size: u64) -> io::Result<File> {
    let name = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: name is a valid NUL-terminated string.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}
