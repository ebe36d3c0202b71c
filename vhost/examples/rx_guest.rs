//! rx_guest: a virtio-net guest driver over vhost-user that receives one TCP stream the way a
//! Linux guest with GUEST_CSUM + GUEST_TSO4/6 + MRG_RXBUF does (256 mergeable 2 KiB buffers,
//! reposted as they are used), checks it and says how each packet arrived.
//!
//! `rx_guest --socket PATH --bytes N [--timeout-ms MS] [--no-tso]`: receives on queue 0 until
//! N bytes of TCP payload arrived (it prints `ready` once its buffers are posted); every payload byte k of the stream (offset from sequence
//! number 1) must be `k % 251` (what `lanekit-tso-guest` and the agent's root tests send).
//! Prints one line per packet (`packet gso_type=T gso_size=S flags=F len=L bufs=B`) and then
//! `received N bytes in P packets (G gso)`. Used by the agent's root test of wire -> guest GSO
//! (`pkg/agent`, `TestVMRxGSOKernelReceivesWholePackets`). Both address families.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{Guest, BUF, GUEST_FEATURES, QSIZE};
use vm_memory::{Bytes, GuestAddress};

#[derive(Parser, Debug)]
struct Args {
    /// vhost-user socket of the backend.
    #[arg(long)]
    socket: PathBuf,
    /// TCP payload bytes to receive.
    #[arg(long)]
    bytes: u64,
    /// Give up after this long.
    #[arg(long, default_value_t = 20_000)]
    timeout_ms: u64,
    /// Do not ack GUEST_TSO4/6 (the backend must then hand MTU-sized frames).
    #[arg(long)]
    no_tso: bool,
}

const GUEST_TSO: u64 = 1 << 7 | 1 << 8;
const HDR: usize = 12;

/// The TCP payload of `f` and its stream offset (sequence number - 1), if it is TCP.
fn tcp_payload(f: &[u8]) -> Option<(u32, &[u8])> {
    let et = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    let (l4, proto, end) = match et {
        0x0800 => {
            let ihl = usize::from(f.get(14)? & 0x0f) * 4;
            (14 + ihl, *f.get(23)?, 14 + usize::from(u16::from_be_bytes([f[16], f[17]])))
        }
        0x86dd => (54, *f.get(20)?, 54 + usize::from(u16::from_be_bytes([*f.get(18)?, *f.get(19)?]))),
        _ => return None,
    };
    if proto != 6 || end > f.len() {
        return None;
    }
    let doff = usize::from(f.get(l4 + 12)? >> 4) * 4;
    let seq = u32::from_be_bytes(f.get(l4 + 4..l4 + 8)?.try_into().ok()?);
    Some((seq.wrapping_sub(1), f.get(l4 + doff..end)?))
}

fn run(a: &Args) -> Result<(), String> {
    let features = GUEST_FEATURES | if a.no_tso { 0 } else { GUEST_TSO };
    let mut g = Guest::connect(&a.socket, 1, features);
    let rxq = 0usize;
    g.post_rx(rxq, QSIZE);
    println!("ready");
    let base = g.queues[rxq].bufs;
    let deadline = Instant::now() + Duration::from_millis(a.timeout_ms);
    let (mut seen, mut got, mut packets, mut gso) = (0u16, 0u64, 0u64, 0u64);
    while got < a.bytes {
        if Instant::now() > deadline {
            return Err(format!("received {got} of {} bytes in {packets} packets within the timeout", a.bytes));
        }
        if g.used_idx(rxq) == seen {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let read = |i: u16| -> Vec<u8> {
            let (head, len) = g.used_elem(rxq, i);
            let mut b = vec![0u8; len as usize];
            g.mem.read_slice(&mut b, GuestAddress(base + u64::from(head) * BUF)).map_err(|e| e.to_string()).unwrap();
            b
        };
        let first = read(seen);
        if first.len() < HDR {
            return Err(format!("used length {} shorter than the header", first.len()));
        }
        let bufs = u16::from_le_bytes([first[10], first[11]]);
        if bufs == 0 {
            return Err("num_buffers 0".into());
        }
        // The packet's other buffers may not be used yet.
        let until = Instant::now() + Duration::from_secs(5);
        while g.used_idx(rxq).wrapping_sub(seen) < bufs {
            if Instant::now() > until {
                return Err(format!("packet of {bufs} buffers never completed"));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let mut frame = first[HDR..].to_vec();
        for k in 1..bufs {
            frame.extend(read(seen.wrapping_add(k)));
        }
        let (flags, gso_type, gso_size) = (first[0], first[1], u16::from_le_bytes([first[4], first[5]]));
        println!("packet gso_type={gso_type} gso_size={gso_size} flags={flags} len={} bufs={bufs}", frame.len());
        seen = seen.wrapping_add(bufs);
        g.post_rx(rxq, bufs);
        packets += 1;
        if gso_type != 0 {
            gso += 1;
        }
        let Some((off, payload)) = tcp_payload(&frame) else { continue };
        for (k, b) in payload.iter().enumerate() {
            let want = ((off as u64 + k as u64) % 251) as u8;
            if *b != want {
                return Err(format!("payload byte {} of the stream is {b}, want {want}", off as u64 + k as u64));
            }
        }
        got += payload.len() as u64;
    }
    println!("received {got} bytes in {packets} packets ({gso} gso)");
    Ok(())
}

fn main() {
    if let Err(e) = run(&Args::parse()) {
        eprintln!("rx_guest: {e}");
        std::process::exit(1);
    }
}
