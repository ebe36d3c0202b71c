//! tso_guest: a virtio-net guest driver over vhost-user that transmits TCP TSO segments the way
//! a Linux guest with HOST_TSO4/6 does: one chain per segment, a `virtio_net_hdr` with
//! `NEEDS_CSUM` and the GSO type, the frame's TCP checksum field holding the pseudo-header sum.
//!
//! `tso_guest --socket PATH --src-mac M --dst-mac M --src IP:PORT --dst IP:PORT [--count N]
//! [--payload BYTES] [--mss N]`: sends N segments of one flow (sequence numbers consecutive;
//! payload byte k of the stream is `k % 251`), each when the device has used the one before,
//! then prints "sent N" and exits. Used by the agent's root test of guest -> wire GSO
//! (`pkg/agent`, `TestVMGuestTSOLeavesAsOneGSOPacket`). Both address families.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use common::{Guest, GUEST_FEATURES};
use lanekit_vhost::offload::{csum_add, csum_fold, TxHdr, F_NEEDS_CSUM};
use vm_memory::{Bytes, GuestAddress};

#[derive(Parser, Debug)]
struct Args {
    /// vhost-user socket of the backend.
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    src_mac: String,
    #[arg(long)]
    dst_mac: String,
    #[arg(long)]
    src: SocketAddr,
    #[arg(long)]
    dst: SocketAddr,
    /// Segments to send.
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// TCP payload bytes per segment (at most 65,000).
    #[arg(long, default_value_t = 64_000, value_parser = clap::value_parser!(u32).range(1..=65_000))]
    payload: u32,
    /// gso_size.
    #[arg(long, default_value_t = 1448)]
    mss: u16,
}

const HDR: usize = 12;
/// Where segment k goes in the TX queue's buffer area (room for 64 KiB + headers each).
const SLOT: u64 = 68 * 1024;

fn mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> =
        s.split(':').map(|p| u8::from_str_radix(p, 16)).collect::<Result<_, _>>().map_err(|e| format!("{s}: {e}"))?;
    v.try_into().map_err(|_| format!("{s}: not a MAC address"))
}

/// One TSO segment (virtio header + frame) of the flow `a.src -> a.dst` starting at stream
/// offset `off`.
fn segment(a: &Args, off: u32) -> Result<Vec<u8>, String> {
    let payload = a.payload as usize;
    let (src, dst) = (a.src.ip(), a.dst.ip());
    let v4 = src.is_ipv4();
    if v4 != dst.is_ipv4() {
        return Err("--src and --dst of different families".into());
    }
    let (l3, ethertype) = (14usize, if v4 { 0x0800u16 } else { 0x86dd });
    let l4 = l3 + if v4 { 20 } else { 40 };
    let mut f = vec![0u8; HDR + l4 + 20 + payload];
    let hdr = TxHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v4 { 1 } else { 4 },
        hdr_len: (l4 + 20) as u16,
        gso_size: a.mss,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    f[..10].copy_from_slice(&hdr.bytes());
    let e = &mut f[HDR..];
    e[..6].copy_from_slice(&mac(&a.dst_mac)?);
    e[6..12].copy_from_slice(&mac(&a.src_mac)?);
    e[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let l4len = 20 + payload;
    let addrs: Vec<u8> = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => [s.octets(), d.octets()].concat(),
        (IpAddr::V6(s), IpAddr::V6(d)) => [s.octets(), d.octets()].concat(),
        _ => unreachable!("families checked above"),
    };
    if v4 {
        let tot = (20 + l4len) as u16;
        e[l3..l3 + 12].copy_from_slice(&[0x45, 0, (tot >> 8) as u8, tot as u8, 0, 1, 0x40, 0, 64, 6, 0, 0]);
        e[l3 + 12..l3 + 20].copy_from_slice(&addrs);
        let c = !csum_fold(csum_add(0, &e[l3..l4]));
        e[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        e[l3..l3 + 8].copy_from_slice(&[0x60, 0, 0, 0, (l4len >> 8) as u8, l4len as u8, 6, 64]);
        e[l3 + 8..l3 + 40].copy_from_slice(&addrs);
    }
    let t = &mut e[l4..];
    t[..2].copy_from_slice(&a.src.port().to_be_bytes());
    t[2..4].copy_from_slice(&a.dst.port().to_be_bytes());
    t[4..8].copy_from_slice(&(1u32.wrapping_add(off)).to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x18; // PSH, ACK
    t[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    let pseudo = csum_add(csum_add(0, &addrs), &[0, 6]) + l4len as u64;
    t[16..18].copy_from_slice(&csum_fold(pseudo).to_be_bytes());
    for (k, b) in t[20..].iter_mut().enumerate() {
        *b = ((off as usize + k) % 251) as u8;
    }
    Ok(f)
}

fn run(a: &Args) -> Result<(), String> {
    let mut g = Guest::connect(&a.socket, 1, GUEST_FEATURES);
    let txq = 1usize;
    let base = g.queues[txq].bufs;
    for k in 0..a.count {
        let f = segment(a, k * a.payload)?;
        let addr = base + u64::from(k % 4) * SLOT;
        g.mem.write_slice(&f, GuestAddress(addr)).map_err(|e| e.to_string())?;
        g.add_chain(txq, &[(addr, f.len() as u32, false)]);
        g.kick(txq);
        if !g.wait_used(txq, (k + 1) as u16, Duration::from_secs(10)) {
            return Err(format!("segment {k} not used by the device within 10 s"));
        }
    }
    println!("sent {}", a.count);
    Ok(())
}

fn main() {
    if let Err(e) = run(&Args::parse()) {
        eprintln!("tso_guest: {e}");
        std::process::exit(1);
    }
}
