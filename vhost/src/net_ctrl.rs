//! The control queue: `VIRTIO_NET_CTRL_*` commands from the guest. Each chain is validated like
//! any other guest input (a bad one is counted in [`Stats::errors`] and returned with length 0),
//! then dispatched: `MQ / VQ_PAIRS_SET`, and with the features negotiated `MQ / RSS_CONFIG` and
//! `MQ / HASH_CONFIG` (parsed by `rss.rs`), and with `VIRTIO_NET_F_CTRL_GUEST_OFFLOADS`
//! negotiated `GUEST_OFFLOADS / SET` (`ethtool -K` in the guest: rx checksumming, LRO). What
//! the commands change is handed back to the backend, which applies it.

use log::debug;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::{Bytes, GuestMemory, Permissions};

use super::{add_used, pop_chain, ChainError, QueueRun, Stats};
use crate::rss::{self, RssConfig};

/// Control queue acks.
pub const VIRTIO_NET_OK: u8 = 0;
/// Control queue acks.
pub const VIRTIO_NET_ERR: u8 = 1;
/// Control class and command for setting the number of queue pairs.
pub const CTRL_MQ: u8 = 4;
/// See [`CTRL_MQ`].
pub const CTRL_MQ_VQ_PAIRS_SET: u8 = 0;
/// Control class and command for switching the wire -> guest offloads at run time
/// (`VIRTIO_NET_CTRL_GUEST_OFFLOADS` / `_SET`, data: a le64 of `VIRTIO_NET_F_GUEST_*` bits).
pub const CTRL_GUEST_OFFLOADS: u8 = 5;
/// See [`CTRL_GUEST_OFFLOADS`].
pub const CTRL_GUEST_OFFLOADS_SET: u8 = 0;
/// The feature bits a `GUEST_OFFLOADS / SET` may carry: `GUEST_CSUM` (1), `GUEST_TSO4` (7),
/// `GUEST_TSO6` (8), `GUEST_ECN` (9), `GUEST_UFO` (10), `GUEST_USO4` (54), `GUEST_USO6` (55)
/// (only those negotiated are accepted).
pub const GUEST_OFFLOAD_BITS: u64 = 1 << 1 | 1 << 7 | 1 << 8 | 1 << 9 | 1 << 10 | 1 << 54 | 1 << 55;
/// Control class and command by which the guest acknowledges an announce request
/// (`VIRTIO_NET_CTRL_ANNOUNCE` / `_ACK`, no data; `VIRTIO_NET_F_GUEST_ANNOUNCE`).
pub const CTRL_ANNOUNCE: u8 = 3;
/// See [`CTRL_ANNOUNCE`].
pub const CTRL_ANNOUNCE_ACK: u8 = 0;
/// `VIRTIO_NET_F_CTRL_GUEST_OFFLOADS`.
pub const VIRTIO_NET_F_CTRL_GUEST_OFFLOADS: u32 = 2;

/// Longest control command data read (RSS_CONFIG with a 128-entry table and a 40-byte key is
/// 307 bytes); a longer command is refused.
pub const MAX_CTRL_DATA: usize = 512;

/// One control command's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlReply {
    /// [`VIRTIO_NET_OK`] or [`VIRTIO_NET_ERR`], written to the guest.
    pub ack: u8,
    /// A valid `VQ_PAIRS_SET` value (or RSS_CONFIG's `max_tx_vq`).
    pub set_pairs: Option<u16>,
    /// A valid RSS_CONFIG or HASH_CONFIG.
    pub rss: Option<RssConfig>,
    /// A valid GUEST_OFFLOADS_SET: the `VIRTIO_NET_F_GUEST_*` bits the guest wants on.
    pub guest_offloads: Option<u64>,
}

/// Which hashing features the guest negotiated (they decide which commands are accepted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlFeatures {
    /// VIRTIO_NET_F_RSS: RSS_CONFIG.
    pub rss: bool,
    /// VIRTIO_NET_F_HASH_REPORT: HASH_CONFIG (and RSS_CONFIG with F_RSS).
    pub hash_report: bool,
    /// With VIRTIO_NET_F_CTRL_GUEST_OFFLOADS: the negotiated `VIRTIO_NET_F_GUEST_*` bits a
    /// GUEST_OFFLOADS_SET may turn on (0: the command is refused).
    pub guest_offloads: u64,
}

impl CtrlReply {
    fn err() -> Self {
        CtrlReply { ack: VIRTIO_NET_ERR, set_pairs: None, rss: None, guest_offloads: None }
    }

    fn ok() -> Self {
        CtrlReply { ack: VIRTIO_NET_OK, ..Self::err() }
    }
}

/// Execute one control command (`class`, `command`, data; then one writable ack byte).
/// Supported: `MQ / VQ_PAIRS_SET`, and with the features negotiated `MQ / RSS_CONFIG` and
/// `MQ / HASH_CONFIG` (parsed by `rss.rs`); everything else, and every invalid command, is
/// answered with `VIRTIO_NET_ERR` and changes nothing.
pub fn ctrl_chain<M: GuestMemory>(
    chain: DescriptorChain<&M>,
    mem: &M,
    max_pairs: u16,
    features: CtrlFeatures,
) -> Result<CtrlReply, ChainError> {
    let mut cmd = [0u8; 2 + MAX_CTRL_DATA + 1];
    let mut got = 0usize;
    let mut ack_at = None;
    let mut open = false;
    for d in chain {
        open = d.has_next();
        let len = d.len() as usize;
        let perm = if d.is_write_only() { Permissions::Write } else { Permissions::Read };
        if len > 0 && !mem.check_range(d.addr(), len, perm) {
            return Err(ChainError::BadAddress(d.addr().0, len));
        }
        if d.is_write_only() {
            if ack_at.is_none() && len > 0 {
                ack_at = Some(d.addr());
            }
        } else if ack_at.is_some() {
            return Err(ChainError::Direction { expected_writable: true });
        } else if got < cmd.len() {
            let n = len.min(cmd.len() - got);
            mem.read_slice(&mut cmd[got..got + n], d.addr()).map_err(|_| ChainError::BadAddress(d.addr().0, n))?;
            got += n;
        } else {
            got = got.saturating_add(len);
        }
    }
    if open {
        return Err(ChainError::Unterminated);
    }
    let ack_at = ack_at.ok_or(ChainError::NoAck)?;
    // More than MAX_CTRL_DATA bytes of data: `got` counts past the buffer, so it matches no
    // command below and every parser sees a length error.
    let data = &cmd[2.min(got)..got.min(cmd.len())];
    let reply = match (got, cmd[0], cmd[1]) {
        (4, CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET) => {
            let pairs = u16::from_le_bytes([cmd[2], cmd[3]]);
            if (1..=max_pairs).contains(&pairs) {
                CtrlReply { set_pairs: Some(pairs), ..CtrlReply::ok() }
            } else {
                CtrlReply::err()
            }
        }
        (n, CTRL_MQ, rss::CTRL_MQ_RSS_CONFIG) if features.rss && n < cmd.len() => {
            match rss::parse_rss_config(data, max_pairs) {
                Ok(c) => CtrlReply { set_pairs: c.pairs, rss: Some(c), ..CtrlReply::ok() },
                Err(e) => {
                    debug!("RSS_CONFIG refused: {e}");
                    CtrlReply::err()
                }
            }
        }
        (n, CTRL_MQ, rss::CTRL_MQ_HASH_CONFIG) if features.hash_report && n < cmd.len() => {
            match rss::parse_hash_config(data) {
                Ok(c) => CtrlReply { rss: Some(c), ..CtrlReply::ok() },
                Err(e) => {
                    debug!("HASH_CONFIG refused: {e}");
                    CtrlReply::err()
                }
            }
        }
        // Exactly a le64; a bit that is no guest offload, or one not negotiated, is refused
        // (the spec forbids the driver to enable those) and changes nothing.
        (10, CTRL_GUEST_OFFLOADS, CTRL_GUEST_OFFLOADS_SET) if features.guest_offloads != 0 => {
            let want = u64::from_le_bytes(cmd[2..10].try_into().unwrap_or_default());
            if want & !features.guest_offloads == 0 {
                CtrlReply { guest_offloads: Some(want), ..CtrlReply::ok() }
            } else {
                debug!("GUEST_OFFLOADS_SET {want:#x} refused (negotiated {:#x})", features.guest_offloads);
                CtrlReply::err()
            }
        }
        // The guest has sent its announcement (a VMM that keeps the control queue, like QEMU,
        // answers this itself; one that hands the queue here gets the ack it expects).
        (2, CTRL_ANNOUNCE, CTRL_ANNOUNCE_ACK) => CtrlReply::ok(),
        _ => CtrlReply::err(),
    };
    mem.write_obj(reply.ack, ack_at).map_err(|_| ChainError::BadAddress(ack_at.0, 1))?;
    Ok(reply)
}

/// What a control queue run changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtrlChanges {
    /// The last valid pair count set.
    pub pairs: Option<u16>,
    /// The last valid hashing configuration set.
    pub rss: Option<RssConfig>,
    /// The last valid guest offload set.
    pub guest_offloads: Option<u64>,
}

/// Execute every pending control command. Returns the run and what the commands changed.
pub fn ctrl_queue<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    max_pairs: u16,
    features: CtrlFeatures,
    stats: &Stats,
    budget: usize,
) -> (QueueRun, CtrlChanges) {
    let mut run = QueueRun::default();
    let mut changes = CtrlChanges::default();
    while let Some(chain) = pop_chain(q, mem, stats) {
        let head = chain.head_index();
        let len = match ctrl_chain(chain, mem, max_pairs, features) {
            Ok(reply) => {
                if reply.ack != VIRTIO_NET_OK {
                    debug!("control command refused with VIRTIO_NET_ERR");
                }
                changes.pairs = reply.set_pairs.or(changes.pairs);
                changes.rss = reply.rss.or(changes.rss);
                changes.guest_offloads = reply.guest_offloads.or(changes.guest_offloads);
                1
            }
            Err(e) => {
                stats.error(&e);
                0
            }
        };
        add_used(q, mem, head, len, stats);
        run.used = true;
        run.handled += 1;
        if run.handled >= budget {
            run.more = true;
            break;
        }
    }
    (run, changes)
}
