//! Harnesses shared by the cargo-fuzz targets in `fuzz/` and the randomized tests that run in
//! `cargo test`: arbitrary bytes as guest rings and memory, and as vhost-user messages.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::net::{self, NetMode, RxState, Stats, StatsSnapshot, TxState};
use crate::port::{LoopPort, Port};
use crate::{serve, DeviceConfig, NetBackend};

/// Queue size used by [`queues_from_bytes`].
pub const QSIZE: u16 = 16;
const MEM: usize = 0x2_0000;
const DESC: u64 = 0;
const AVAIL: u64 = 0x100;
const USED: u64 = 0x200;
const DATA: u64 = 0x1000;

/// Lay `data` out as a 16-entry split queue (avail idx, avail ring, descriptor table, then
/// buffer memory) and run the TX, RX and control queue code over it, each on a fresh `Queue`
/// over the same rings. Returns the counters; must never panic or hang.
pub fn queues_from_bytes(data: &[u8]) -> StatsSnapshot {
    let mem = match GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) {
        Ok(m) => m,
        Err(_) => return StatsSnapshot::default(),
    };
    let header = 2 + 2 * usize::from(QSIZE) + 16 * usize::from(QSIZE);
    let mut raw = vec![0u8; header];
    let n = data.len().min(header);
    raw[..n].copy_from_slice(&data[..n]);
    // The lengths fit: header < MEM - DATA and the rest is clamped to the data area.
    let _ = mem.write_slice(&raw[..2], GuestAddress(AVAIL + 2));
    let _ = mem.write_slice(&raw[2..2 + 2 * usize::from(QSIZE)], GuestAddress(AVAIL + 4));
    let _ = mem.write_slice(&raw[2 + 2 * usize::from(QSIZE)..], GuestAddress(DESC));
    let rest = &data[n..];
    let rest = &rest[..rest.len().min(MEM - DATA as usize)];
    let _ = mem.write_slice(rest, GuestAddress(DATA));
    let stats = Stats::default();
    let mode = NetMode {
        hdr_len: net::HDR_LEN,
        mergeable: data.first().is_some_and(|b| b & 1 == 1),
        max_frame: 1518,
        hash_report: false,
    };
    let new_queue = || -> Option<Queue> {
        let mut q = Queue::new(QSIZE).ok()?;
        q.set_size(QSIZE);
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_event_idx(data.get(1).is_some_and(|b| b & 1 == 1));
        q.set_ready(true);
        Some(q)
    };
    let Ok(mut port) = LoopPort::new(0) else { return stats.snapshot() };
    if let Some(mut q) = new_queue() {
        net::tx_queue(&mut q, &mem, &mut port, &mut TxState::default(), mode, &stats, 64);
    }
    if let Some(mut q) = new_queue() {
        // Frames looped back from the TX run plus one of every size class.
        let mut b = crate::port::Batch::default();
        for len in [14usize, 60, 1514] {
            b.push(&vec![0xab; len]);
        }
        let _ = port.send(&b);
        net::rx_queue(&mut q, &mem, &mut port, &mut RxState::default(), mode, &stats, 64);
    }
    if let Some(mut q) = new_queue() {
        net::ctrl_queue(&mut q, &mem, 4, net::CtrlFeatures { rss: true, hash_report: true }, &stats, 64);
    }
    stats.snapshot()
}

/// Write `data` to a new connection on a vhost-user socket, close our side for writing and wait
/// (bounded) until the backend closes. Returns false if the backend neither answered nor closed
/// within `timeout`.
pub fn send_raw(path: &Path, data: &[u8], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return false,
        }
    };
    let _ = s.set_write_timeout(Some(timeout));
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A loopback backend serving forever on a private socket, for message fuzzing.
pub struct MessageTarget {
    /// Socket path.
    pub path: PathBuf,
    /// The backend.
    pub backend: Arc<NetBackend>,
}

impl MessageTarget {
    /// Start a one-queue-pair loopback backend on a socket under the temp dir.
    pub fn start(tag: &str) -> std::io::Result<MessageTarget> {
        let path = std::env::temp_dir().join(format!("lk-vhost-fuzz-{}-{tag}.sock", std::process::id()));
        let port: Box<dyn Port> = Box::new(LoopPort::new(0)?);
        let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 9], queue_pairs: 1, mtu: 1500 };
        let backend = Arc::new(NetBackend::new(cfg, vec![port]).map_err(std::io::Error::other)?);
        let (b, p) = (backend.clone(), path.clone());
        std::thread::spawn(move || {
            if let Err(e) = serve(b, &p, None) {
                log::error!("fuzz target backend stopped: {e}");
            }
        });
        Ok(MessageTarget { path, backend })
    }
}
