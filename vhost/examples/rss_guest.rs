//! rss_guest: a minimal virtio-net guest driver over vhost-user that negotiates
//! VIRTIO_NET_F_RSS and VIRTIO_NET_F_HASH_REPORT (when offered), sets the guest's RSS
//! configuration through the control queue (VQ_PAIRS_SET, then RSS_CONFIG), receives on every
//! queue and reports, as one JSON line on stdout, what arrived where: frames per queue, and per
//! IPv4 flow the queues it was seen on, the hashes and report types of its virtio headers.
//!
//! Used by lanekit's steering benchmark and end-to-end test (pkg/bench): real frontends do not
//! pass RSS through vhost-user (QEMU 7.2 keeps the control queue and needs eBPF for F_RSS;
//! DPDK 22.11's virtio_user masks F_RSS/F_HASH_REPORT and answers control commands itself).
//!
//! `rss_guest --socket PATH --queues N [--rss] [--types HEX] [--key HEX] [--table rr|q,q,...]
//!  [--duration SECS] [--frames N]`: without `--rss` no RSS/hash feature is acked (the default
//! steering). It prints "ready" on stderr once its buffers are posted, stops after `--duration`
//! or `--frames` frames, and prints the report.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{Guest, BUF, GUEST_FEATURES, QSIZE};
use lanekit_vhost::rss::{self, CTRL_MQ_RSS_CONFIG, VIRTIO_NET_F_HASH_REPORT, VIRTIO_NET_F_RSS};
use vm_memory::{Bytes, GuestAddress};

#[derive(Parser, Debug)]
struct Args {
    /// vhost-user socket of the backend.
    #[arg(long)]
    socket: PathBuf,
    /// Queue pairs to use.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Negotiate RSS and hash report and send RSS_CONFIG.
    #[arg(long)]
    rss: bool,
    /// VIRTIO_NET_RSS_HASH_TYPE_* bits.
    #[arg(long, default_value = "0x7")]
    types: String,
    /// Toeplitz key, 80 hex digits (default: the RSS verification key).
    #[arg(long)]
    key: Option<String>,
    /// Indirection table: "rr" (128 entries round robin) or comma-separated queues.
    #[arg(long, default_value = "rr")]
    table: String,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many frames (0: no limit).
    #[arg(long, default_value_t = 0)]
    frames: u64,
    /// Also stop when a line (or end of file) arrives on stdin.
    #[arg(long)]
    stdin_stop: bool,
}

const MS_KEY: &str = "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa";

fn hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim_start_matches("0x").replace(':', "");
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex length in {s:?}"));
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string())).collect()
}

#[derive(Default)]
struct Flow {
    frames: u64,
    queues: BTreeMap<usize, u64>,
    hashes: BTreeMap<u32, u64>,
    reports: BTreeMap<u16, u64>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("rss_guest: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    let types = u32::from_str_radix(a.types.trim_start_matches("0x"), 16).map_err(|e| format!("--types: {e}"))?;
    let key = hex(a.key.as_deref().unwrap_or(MS_KEY))?;
    if key.len() != rss::KEY_SIZE {
        return Err(format!("--key: {} bytes, want {}", key.len(), rss::KEY_SIZE));
    }
    let table: Vec<u16> = if a.table == "rr" {
        (0..128).map(|i| i % a.queues).collect()
    } else {
        a.table
            .split(',')
            .map(|q| q.trim().parse::<u16>().map_err(|e| format!("--table: {e}")))
            .collect::<Result<_, _>>()?
    };
    let mut want = GUEST_FEATURES;
    if a.rss {
        want |= 1 << VIRTIO_NET_F_RSS | 1 << VIRTIO_NET_F_HASH_REPORT;
    }
    let mut g = Guest::connect(&a.socket, a.queues, want);
    let acked = g.features;
    let hash_report = acked & (1 << VIRTIO_NET_F_HASH_REPORT) != 0;
    let rss_on = acked & (1 << VIRTIO_NET_F_RSS) != 0;
    if a.rss && !(hash_report && rss_on) {
        return Err(format!("backend did not offer RSS and hash report (acked {acked:#x})"));
    }
    let hdr_len = if hash_report { 20 } else { 12 };
    if a.queues > 1 {
        let mut cmd = vec![4u8, 0];
        cmd.extend_from_slice(&a.queues.to_le_bytes());
        if g.ctrl(&cmd) != 0 {
            return Err("VQ_PAIRS_SET refused".into());
        }
    }
    if rss_on {
        let mut cmd = vec![4u8, CTRL_MQ_RSS_CONFIG];
        cmd.extend_from_slice(&types.to_le_bytes());
        cmd.extend_from_slice(&((table.len() as u16).wrapping_sub(1)).to_le_bytes());
        cmd.extend_from_slice(&0u16.to_le_bytes());
        for q in &table {
            cmd.extend_from_slice(&q.to_le_bytes());
        }
        cmd.extend_from_slice(&a.queues.to_le_bytes());
        cmd.push(key.len() as u8);
        cmd.extend_from_slice(&key);
        // The command is longer than Guest::ctrl's 32-byte slot: write it at a private spot.
        let q = g.queues.len() - 1;
        let at = g.queues[q].bufs + 0x4_0000;
        g.mem.write_slice(&cmd, GuestAddress(at)).map_err(|e| e.to_string())?;
        g.mem.write_obj(0xffu8, GuestAddress(at + 0x1000)).map_err(|e| e.to_string())?;
        let wantu = g.used_idx(q) + 1;
        g.add_chain(q, &[(at, 2, false), (at + 2, cmd.len() as u32 - 2, false), (at + 0x1000, 1, true)]);
        g.kick(q);
        if !g.wait_used(q, wantu, Duration::from_secs(5)) {
            return Err("RSS_CONFIG not answered".into());
        }
        let ack: u8 = g.mem.read_obj(GuestAddress(at + 0x1000)).map_err(|e| e.to_string())?;
        if ack != 0 {
            return Err("RSS_CONFIG refused".into());
        }
    }
    let nq = usize::from(a.queues);
    for q in 0..nq {
        g.post_rx(2 * q, QSIZE);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if a.stdin_stop {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    eprintln!("ready");
    let mut seen = vec![0u16; nq];
    let mut per_queue = vec![0u64; nq];
    let mut flows: BTreeMap<String, Flow> = BTreeMap::new();
    let mut other = 0u64;
    let mut total = 0u64;
    let start = Instant::now();
    let (mut first, mut last) = (None::<Instant>, start);
    let end = start + Duration::from_secs_f64(a.duration);
    let mut buf = vec![0u8; BUF as usize];
    while Instant::now() < end
        && (a.frames == 0 || total < a.frames)
        && !stop.load(std::sync::atomic::Ordering::Relaxed)
    {
        let mut progress = false;
        for q in 0..nq {
            let rxq = 2 * q;
            let used = g.used_idx(rxq);
            while seen[q] != used {
                let (head, len) = g.used_elem(rxq, seen[q]);
                seen[q] = seen[q].wrapping_add(1);
                let desc = g.queues[rxq].base + 16 * u64::from(head);
                let addr: u64 = g.mem.read_obj(GuestAddress(desc)).map_err(|e| e.to_string())?;
                let len = (len as usize).min(buf.len());
                g.mem.read_slice(&mut buf[..len], GuestAddress(addr)).map_err(|e| e.to_string())?;
                total += 1;
                per_queue[q] += 1;
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                match flow_of(&buf[..len], hdr_len) {
                    Some((name, hash, report)) => {
                        let f = flows.entry(name).or_default();
                        f.frames += 1;
                        *f.queues.entry(q).or_default() += 1;
                        if hash_report {
                            *f.hashes.entry(hash).or_default() += 1;
                            *f.reports.entry(report).or_default() += 1;
                        }
                    }
                    None => other += 1,
                }
                // Give the buffer back (same address, next descriptor slot).
                g.add_chain(rxq, &[(addr, BUF as u32, true)]);
                progress = true;
            }
            if progress {
                g.kick(rxq);
            }
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let window = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let mut out = String::new();
    out.push_str(&format!(
        "{{\"acked\":{acked},\"rss\":{rss_on},\"hash_report\":{hash_report},\"frames\":{total},\"other\":{other},\"window_s\":{window:.6},\"queues\":{per_queue:?},\"flows\":["
    ));
    for (i, (name, f)) in flows.iter().enumerate() {
        let hashes = f.hashes.iter().map(|(k, v)| format!("\"0x{k:08x}\":{v}")).collect::<Vec<_>>().join(",");
        out.push_str(&format!(
            "{}{{\"flow\":\"{name}\",\"frames\":{},\"queues\":{{{}}},\"hashes\":{{{hashes}}},\"reports\":{{{}}}}}",
            if i > 0 { "," } else { "" },
            f.frames,
            kv(&f.queues),
            kv(&f.reports)
        ));
    }
    out.push_str("]}\n");
    std::io::stdout().write_all(out.as_bytes()).map_err(|e| e.to_string())
}

fn kv<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(",")
}

/// The flow of an IPv4 TCP/UDP frame after a `hdr_len` virtio header ("proto src:sport dst:dport")
/// and the header's hash_value and hash_report (zero without hash report).
fn flow_of(b: &[u8], hdr_len: usize) -> Option<(String, u32, u16)> {
    let (hash, report) = if hdr_len == 20 && b.len() >= 20 {
        (u32::from_le_bytes([b[12], b[13], b[14], b[15]]), u16::from_le_bytes([b[16], b[17]]))
    } else {
        (0, 0)
    };
    let f = b.get(hdr_len..)?;
    if f.len() < 34 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let proto = ip[9];
    let l4 = ip.get(ihl..ihl + 4)?;
    let name = format!(
        "{} {}.{}.{}.{}:{} {}.{}.{}.{}:{}",
        match proto {
            6 => "tcp",
            17 => "udp",
            _ => "ip",
        },
        ip[12],
        ip[13],
        ip[14],
        ip[15],
        u16::from_be_bytes([l4[0], l4[1]]),
        ip[16],
        ip[17],
        ip[18],
        ip[19],
        u16::from_be_bytes([l4[2], l4[3]])
    );
    Some((name, hash, report))
}
