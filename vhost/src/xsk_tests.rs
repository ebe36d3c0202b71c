//! Unit tests of `xsk.rs` (no socket needs privileges).

use super::*;
use std::os::fd::FromRawFd;

#[test]
fn params_validation() {
    assert!(XskParams::standard(0).validate().is_ok());
    let mut p = XskParams::standard(0);
    p.rx_size = 1000;
    assert!(p.validate().is_err());
    let mut p = XskParams::standard(0);
    p.umem_size += 1;
    assert!(p.validate().is_err());
    let mut p = XskParams::standard(0);
    p.frame_size = 1024;
    p.umem_size = 1024 * 4096;
    assert!(p.validate().is_err());
    assert_eq!(XskParams::standard(0).fill_frames(), 2048);
}

#[test]
fn tx_metadata_is_struct_xsk_tx_metadata_asking_for_a_checksum() {
    // struct xsk_tx_metadata { __u64 flags; union { struct { __u16 csum_start;
    // __u16 csum_offset; __u64 launch_time; } request; ... } } (include/uapi/linux/if_xdp.h).
    let m = tx_metadata(34, 16);
    assert_eq!(u64::from_ne_bytes(m[..8].try_into().unwrap()), 2, "XDP_TXMD_FLAGS_CHECKSUM only");
    assert_eq!(u16::from_ne_bytes([m[8], m[9]]), 34);
    assert_eq!(u16::from_ne_bytes([m[10], m[11]]), 16);
    assert_eq!(size_of::<UmemRegMeta>(), 32, "struct xdp_umem_reg with tx_metadata_len");
    let mut p = XskParams::standard(0);
    for (len, ok) in [(0, true), (16, true), (24, true), (248, true), (8, false), (12, false), (256, false)] {
        p.tx_metadata_len = len;
        assert_eq!(p.validate().is_ok(), ok, "tx_metadata_len {len}");
    }
}

#[test]
fn from_fds_refuses_a_non_xsk_socket() {
    let umem = memfd("t", XskParams::standard(0).umem_size).unwrap();
    // SAFETY: plain socket(2); result checked.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
    assert!(raw >= 0);
    // SAFETY: new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    assert!(XskPort::from_fds(fd, &umem, XskParams::standard(0)).is_err());
}
