//! Virtio RSS and hash report: the guest's configuration (control queue commands
//! `VIRTIO_NET_CTRL_MQ_RSS_CONFIG` and `VIRTIO_NET_CTRL_MQ_HASH_CONFIG`), the BPF map the
//! backend writes it into, and the XDP metadata that brings each frame's hash back.
//!
//! The backend is unprivileged, so it computes nothing itself: the agent hands it (with the
//! AF_XDP sockets) the fd of a one-entry `BPF_F_MMAPABLE` array that only this VM's steering
//! reads (`bpf/lib/vm_rss.h`, `struct lk_vm_rss_cfg`). The backend maps it and writes the
//! guest's hash types, key and indirection table there. The tc programs that deliver to the
//! VM pick the rx queue from the table; `steer_vm` (XDP) puts the Toeplitz hash and its report
//! type in front of the frame ([`XskMeta`]); the backend copies them into
//! `virtio_net_hdr_v1_hash` when `VIRTIO_NET_F_HASH_REPORT` was negotiated.
//!
//! Everything parsed here comes from the guest: every length and index is checked, a bad
//! command changes nothing and is answered `VIRTIO_NET_ERR`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// `VIRTIO_NET_F_HASH_REPORT`.
pub const VIRTIO_NET_F_HASH_REPORT: u32 = 57;
/// `VIRTIO_NET_F_RSS`.
pub const VIRTIO_NET_F_RSS: u32 = 60;
/// Control command `VIRTIO_NET_CTRL_MQ_RSS_CONFIG` (class `VIRTIO_NET_CTRL_MQ`).
pub const CTRL_MQ_RSS_CONFIG: u8 = 1;
/// Control command `VIRTIO_NET_CTRL_MQ_HASH_CONFIG` (class `VIRTIO_NET_CTRL_MQ`).
pub const CTRL_MQ_HASH_CONFIG: u8 = 2;
/// Toeplitz key length: the device reports `rss_max_key_size` 40 and takes exactly 40.
pub const KEY_SIZE: usize = 40;
/// `rss_max_indirection_table_length`.
pub const TABLE_SIZE: usize = 128;

/// `VIRTIO_NET_RSS_HASH_TYPE_*` bits.
pub mod hash_type {
    /// IPv4 addresses.
    pub const IPV4: u32 = 1 << 0;
    /// IPv4 addresses and TCP ports.
    pub const TCPV4: u32 = 1 << 1;
    /// IPv4 addresses and UDP ports.
    pub const UDPV4: u32 = 1 << 2;
    /// IPv6 addresses.
    pub const IPV6: u32 = 1 << 3;
    /// IPv6 addresses and TCP ports.
    pub const TCPV6: u32 = 1 << 4;
    /// IPv6 addresses and UDP ports.
    pub const UDPV6: u32 = 1 << 5;
}

/// Hash types the device reports in `supported_hash_types` (not the `_EX` ones: the BPF
/// hash does not follow IPv6 home address / routing header addresses).
pub const SUPPORTED_HASH_TYPES: u32 =
    hash_type::IPV4 | hash_type::TCPV4 | hash_type::UDPV4 | hash_type::IPV6 | hash_type::TCPV6 | hash_type::UDPV6;

/// `VIRTIO_NET_HASH_REPORT_UDPv6_EX`: the largest report type.
pub const MAX_REPORT: u16 = 9;

/// A guest's hashing configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssConfig {
    /// `VIRTIO_NET_RSS_HASH_TYPE_*` bits; 0 turns hashing off.
    pub hash_types: u32,
    /// RSS_CONFIG (the table picks the queue) rather than HASH_CONFIG (hash only).
    pub steer: bool,
    /// The indirection table (power-of-two length, 1..=128); empty for HASH_CONFIG.
    pub table: Vec<u16>,
    /// Queue of packets without a hash.
    pub unclassified_queue: u16,
    /// Toeplitz key (all zero when hashing is off).
    pub key: [u8; KEY_SIZE],
    /// RSS_CONFIG's `max_tx_vq`: the queue pairs the guest uses (None for HASH_CONFIG).
    pub pairs: Option<u16>,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RssError {
    /// The command is shorter or longer than its fields say.
    #[error("{what}: {got} bytes, expected {want}")]
    Length {
        /// Command.
        what: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes the fields call for.
        want: usize,
    },
    /// `indirection_table_mask + 1` is not a power of two up to 128.
    #[error("indirection table length {0} is not a power of two in 1..=128")]
    TableLength(u32),
    /// A queue index beyond the device's queue pairs.
    #[error("{what} {queue} is not below the {pairs} queue pairs")]
    Queue {
        /// Field.
        what: &'static str,
        /// Value.
        queue: u16,
        /// Queue pairs of the device.
        pairs: u16,
    },
    /// `max_tx_vq` out of range.
    #[error("max_tx_vq {0} is not in 1..={1}")]
    TxQueues(u16, u16),
    /// Hash types the device does not support.
    #[error("hash types {0:#x} include unsupported bits {1:#x}")]
    HashTypes(u32, u32),
    /// The key is not 40 bytes (or missing while hashing is on).
    #[error("hash key length {0}, the device takes {KEY_SIZE} (or 0 with hash types 0)")]
    KeyLength(u8),
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn check_types(types: u32) -> Result<(), RssError> {
    let bad = types & !SUPPORTED_HASH_TYPES;
    if bad != 0 {
        return Err(RssError::HashTypes(types, bad));
    }
    Ok(())
}

/// Read `hash_key_length` + key at `at`, which must end the command exactly.
fn key_at(what: &'static str, data: &[u8], at: usize, types: u32) -> Result<[u8; KEY_SIZE], RssError> {
    let short = |want| RssError::Length { what, got: data.len(), want };
    let len = *data.get(at).ok_or(short(at + 1))?;
    let want = at + 1 + usize::from(len);
    if data.len() != want {
        return Err(short(want));
    }
    let mut key = [0u8; KEY_SIZE];
    match usize::from(len) {
        KEY_SIZE => key.copy_from_slice(&data[at + 1..]),
        0 if types == 0 => {}
        _ => return Err(RssError::KeyLength(len)),
    }
    Ok(key)
}

/// Parse `struct virtio_net_rss_config` (the command data after class and command):
/// `le32 hash_types; le16 indirection_table_mask; le16 unclassified_queue;
/// le16 indirection_table[mask + 1]; le16 max_tx_vq; u8 hash_key_length; u8 key[]`.
/// Queue indexes must be below `max_pairs`.
pub fn parse_rss_config(data: &[u8], max_pairs: u16) -> Result<RssConfig, RssError> {
    const WHAT: &str = "RSS_CONFIG";
    let short = |want| RssError::Length { what: WHAT, got: data.len(), want };
    if data.len() < 8 {
        return Err(short(8));
    }
    let hash_types = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    check_types(hash_types)?;
    let entries = u32::from(le16(data, 4)) + 1;
    if !entries.is_power_of_two() || entries as usize > TABLE_SIZE {
        return Err(RssError::TableLength(entries));
    }
    let unclassified_queue = le16(data, 6);
    let table_end = 8 + 2 * entries as usize;
    if data.len() < table_end + 3 {
        return Err(short(table_end + 3));
    }
    let table: Vec<u16> = (0..entries as usize).map(|i| le16(data, 8 + 2 * i)).collect();
    let max_tx_vq = le16(data, table_end);
    let key = key_at(WHAT, data, table_end + 2, hash_types)?;
    if unclassified_queue >= max_pairs {
        return Err(RssError::Queue { what: "unclassified_queue", queue: unclassified_queue, pairs: max_pairs });
    }
    if let Some(&q) = table.iter().find(|&&q| q >= max_pairs) {
        return Err(RssError::Queue { what: "indirection table entry", queue: q, pairs: max_pairs });
    }
    if !(1..=max_pairs).contains(&max_tx_vq) {
        return Err(RssError::TxQueues(max_tx_vq, max_pairs));
    }
    Ok(RssConfig { hash_types, steer: true, table, unclassified_queue, key, pairs: Some(max_tx_vq) })
}

/// Parse `struct virtio_net_hash_config`: `le32 hash_types; le16 reserved[4];
/// u8 hash_key_length; u8 key[]`.
pub fn parse_hash_config(data: &[u8]) -> Result<RssConfig, RssError> {
    const WHAT: &str = "HASH_CONFIG";
    if data.len() < 13 {
        return Err(RssError::Length { what: WHAT, got: data.len(), want: 13 });
    }
    let hash_types = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    check_types(hash_types)?;
    let key = key_at(WHAT, data, 12, hash_types)?;
    Ok(RssConfig { hash_types, steer: false, table: Vec::new(), unclassified_queue: 0, key, pairs: None })
}

/// Size of `struct lk_vm_rss_cfg` (`bpf/lib/vm_rss.h`).
pub const MAP_VALUE_SIZE: usize = 312;
const OFF_HASH_TYPES: usize = 0;
const OFF_STEER: usize = 4;
const OFF_MASK: usize = 6;
const OFF_UNCLASSIFIED: usize = 8;
const OFF_SEQ: usize = 12;
const OFF_KEY: usize = 16;
const OFF_TABLE: usize = 56;

/// Encode `cfg` as `struct lk_vm_rss_cfg` (without `seq`, which [`RssMap::write`] manages).
/// The key goes in QEMU's `rss.bpf.c` layout: bytes 0..4 as one native-endian u32 of their
/// big-endian value, then bytes 4..40.
pub fn encode(cfg: &RssConfig) -> [u8; MAP_VALUE_SIZE] {
    let mut v = [0u8; MAP_VALUE_SIZE];
    v[OFF_HASH_TYPES..OFF_HASH_TYPES + 4].copy_from_slice(&cfg.hash_types.to_ne_bytes());
    v[OFF_STEER..OFF_STEER + 2].copy_from_slice(&u16::from(cfg.steer).to_ne_bytes());
    let mask = (cfg.table.len().max(1) - 1) as u16;
    v[OFF_MASK..OFF_MASK + 2].copy_from_slice(&mask.to_ne_bytes());
    v[OFF_UNCLASSIFIED..OFF_UNCLASSIFIED + 2].copy_from_slice(&cfg.unclassified_queue.to_ne_bytes());
    let first = u32::from_be_bytes([cfg.key[0], cfg.key[1], cfg.key[2], cfg.key[3]]);
    v[OFF_KEY..OFF_KEY + 4].copy_from_slice(&first.to_ne_bytes());
    v[OFF_KEY + 4..OFF_KEY + KEY_SIZE].copy_from_slice(&cfg.key[4..]);
    for (i, q) in cfg.table.iter().take(TABLE_SIZE).enumerate() {
        v[OFF_TABLE + 2 * i..OFF_TABLE + 2 * i + 2].copy_from_slice(&q.to_ne_bytes());
    }
    v
}

/// The VM's configuration map, mapped into this process.
#[derive(Debug)]
pub struct RssMap {
    ptr: NonNull<u8>,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: the mapping is owned by this value and written only through `&mut self`.
unsafe impl Send for RssMap {}
// SAFETY: shared references only read the mapping's address (no access through `&self`).
unsafe impl Sync for RssMap {}

impl RssMap {
    /// Map the array map `fd` (one entry of `value_size` bytes, `BPF_F_MMAPABLE`).
    pub fn from_fd(fd: OwnedFd, value_size: usize) -> io::Result<Self> {
        if value_size != MAP_VALUE_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("rss map value is {value_size} bytes, this backend writes {MAP_VALUE_SIZE}"),
            ));
        }
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = MAP_VALUE_SIZE.div_ceil(page) * page;
        // SAFETY: a fresh shared mapping chosen by the kernel; the kernel checks fd and length
        // (an array map refuses mappings beyond its value area) and the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("map the rss map: {e}")));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(RssMap { ptr, len, _fd: fd })
    }

    fn seq(&self) -> &AtomicU32 {
        // SAFETY: OFF_SEQ is 4-aligned inside the (page-aligned) mapping of at least 312 bytes.
        unsafe { &*self.ptr.as_ptr().add(OFF_SEQ).cast::<AtomicU32>() }
    }

    /// Publish `cfg` (None: no guest configuration, the default steering). `seq` is odd while
    /// the entry is rewritten; the BPF readers ignore an entry with an odd `seq`.
    pub fn write(&mut self, cfg: Option<&RssConfig>) {
        let v = cfg.map(encode).unwrap_or([0u8; MAP_VALUE_SIZE]);
        let seq = self.seq().load(Ordering::Relaxed);
        self.seq().store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, b) in v.iter().enumerate() {
            if (OFF_SEQ..OFF_SEQ + 4).contains(&i) {
                continue;
            }
            // SAFETY: i < MAP_VALUE_SIZE <= len; volatile: the kernel reads it concurrently.
            unsafe { self.ptr.as_ptr().add(i).write_volatile(*b) };
        }
        fence(Ordering::Release);
        self.seq().store((seq | 1).wrapping_add(1), Ordering::Release);
    }

    /// The entry as it is now (tests).
    pub fn read(&self) -> [u8; MAP_VALUE_SIZE] {
        let mut v = [0u8; MAP_VALUE_SIZE];
        for (i, b) in v.iter_mut().enumerate() {
            // SAFETY: i < MAP_VALUE_SIZE <= len.
            *b = unsafe { self.ptr.as_ptr().add(i).read_volatile() };
        }
        v
    }
}

impl Drop for RssMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe the mapping made in `from_fd`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `struct lk_xsk_meta` size: `le32 hash; u16 report; u16 magic`, native endian, right in
/// front of the frame.
pub const META_LEN: usize = 8;
/// `LK_XSK_META_MAGIC`.
pub const META_MAGIC: u16 = 0x4c4b;

/// A frame's hash as `steer_vm` reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XskMeta {
    /// Toeplitz hash.
    pub hash: u32,
    /// `VIRTIO_NET_HASH_REPORT_*` (0: none).
    pub report: u16,
}

impl XskMeta {
    /// Decode the 8 bytes in front of a frame; None unless steer_vm wrote them (magic) with a
    /// valid report type.
    pub fn decode(b: &[u8; META_LEN]) -> Option<XskMeta> {
        let magic = u16::from_ne_bytes([b[6], b[7]]);
        let report = u16::from_ne_bytes([b[4], b[5]]);
        if magic != META_MAGIC || report > MAX_REPORT {
            return None;
        }
        Some(XskMeta { hash: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]), report })
    }

    /// Encode (tests, in-memory ports).
    pub fn encode(&self) -> [u8; META_LEN] {
        let mut b = [0u8; META_LEN];
        b[..4].copy_from_slice(&self.hash.to_ne_bytes());
        b[4..6].copy_from_slice(&self.report.to_ne_bytes());
        b[6..].copy_from_slice(&META_MAGIC.to_ne_bytes());
        b
    }
}

#[path = "rss_hash.rs"]
pub mod hash;

#[cfg(test)]
#[path = "rss_tests.rs"]
pub(crate) mod tests;
