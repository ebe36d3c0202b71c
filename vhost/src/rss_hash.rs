//! The Toeplitz hash of a frame in the backend, for the wire -> guest path that has no
//! `steer_vm` to compute it (`--rx-gso kernel`): the same input rules as the BPF code
//! (`bpf/lib/toeplitz.h`, `vm_rss.h`) and the Go model (`pkg/rss/frame.go`: `FrameInput`), which
//! the fixture `testdata/rss_frames.txt` holds this code to (written by the Go model, checked
//! against it by `pkg/rss`'s tests).

use super::{hash_type, XskMeta, KEY_SIZE};

/// `VIRTIO_NET_HASH_REPORT_*` this device reports.
const REPORT_IPV4: u16 = 1;
const REPORT_TCPV4: u16 = 2;
const REPORT_UDPV4: u16 = 3;
const REPORT_IPV6: u16 = 4;
const REPORT_TCPV6: u16 = 5;
const REPORT_UDPV6: u16 = 6;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_NONE: u8 = 59;
/// IPv6 extension headers walked to find TCP/UDP (no `_EX` type: their addresses are not used).
const IP6_HOP_BY_HOP: u8 = 0;
const IP6_ROUTING: u8 = 43;
const IP6_FRAGMENT: u8 = 44;
const IP6_DEST_OPTS: u8 = 60;
const IP6_EXT_MAX: usize = 4;

/// The Toeplitz hash of `input` under `key` (virtio 1.3 §5.1.6.4.3.1, Microsoft RSS): for every
/// input bit from the left that is 1, the 32 key bits starting at that bit are xored into the
/// result. Inputs up to 36 bytes (IPv6 addresses and ports).
pub fn toeplitz(key: &[u8; KEY_SIZE], input: &[u8]) -> u32 {
    let mut padded = [0u8; KEY_SIZE + 8];
    padded[..KEY_SIZE].copy_from_slice(key);
    let mut result = 0u32;
    for (i, &b) in input.iter().take(KEY_SIZE - 4).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&padded[i..i + 8]);
        let window = u64::from_be_bytes(w);
        for bit in 0..8 {
            if b & (0x80 >> bit) != 0 {
                result ^= ((window << bit) >> 32) as u32;
            }
        }
    }
    result
}

/// The hash a `HASH_REPORT` guest configured (`RSS_CONFIG` / `HASH_CONFIG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxHash {
    /// `VIRTIO_NET_RSS_HASH_TYPE_*` bits (non-zero).
    pub types: u32,
    /// Toeplitz key.
    pub key: [u8; KEY_SIZE],
}

impl RxHash {
    /// The hash and report type of `frame`, None when it gets none.
    pub fn of(&self, frame: &[u8]) -> Option<XskMeta> {
        frame_hash(frame, self.types, &self.key)
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The hash a guest that enabled `types` gets reported for `frame` (Ethernet, at most one VLAN
/// tag) under `key`, or None (no hash: not IP, a broken IP header, or its type disabled).
pub fn frame_hash(frame: &[u8], types: u32, key: &[u8; KEY_SIZE]) -> Option<XskMeta> {
    if frame.len() < 14 {
        return None;
    }
    let (mut l3, mut etype) = (14, be16(frame, 12));
    if etype == 0x8100 || etype == 0x88a8 {
        if frame.len() < 18 {
            return None;
        }
        etype = be16(frame, 16);
        l3 = 18;
    }
    let ip = &frame[l3..];
    let (addrs, mut proto, mut l4, mut fragment, v6) = match etype {
        0x0800 => {
            if ip.len() < 20 || ip[0] >> 4 != 4 || ip[0] & 0x0f < 5 {
                return None;
            }
            (&ip[12..20], ip[9], usize::from(ip[0] & 0x0f) * 4, be16(ip, 6) & 0x3fff != 0, false)
        }
        0x86dd => {
            if ip.len() < 40 || ip[0] >> 4 != 6 {
                return None;
            }
            (&ip[8..40], ip[6], 40, false, true)
        }
        _ => return None,
    };
    if v6 {
        for _ in 0..IP6_EXT_MAX {
            if ![IP6_HOP_BY_HOP, IP6_ROUTING, IP6_DEST_OPTS, IP6_FRAGMENT].contains(&proto) {
                break;
            }
            if ip.len() < l4 + 2 {
                proto = PROTO_NONE; // truncated: addresses only
                break;
            }
            let next = ip[l4];
            if proto == IP6_FRAGMENT {
                fragment = true;
                l4 += 8;
            } else {
                l4 += (usize::from(ip[l4 + 1]) + 1) * 8;
            }
            proto = next;
        }
    }
    let (tcp, udp, addr, rtcp, rudp, raddr) = if v6 {
        (hash_type::TCPV6, hash_type::UDPV6, hash_type::IPV6, REPORT_TCPV6, REPORT_UDPV6, REPORT_IPV6)
    } else {
        (hash_type::TCPV4, hash_type::UDPV4, hash_type::IPV4, REPORT_TCPV4, REPORT_UDPV4, REPORT_IPV4)
    };
    let mut input = [0u8; 36];
    input[..addrs.len()].copy_from_slice(addrs);
    if !fragment && ip.len() >= l4 + 4 {
        let report = match proto {
            PROTO_TCP if types & tcp != 0 => rtcp,
            PROTO_UDP if types & udp != 0 => rudp,
            _ => 0,
        };
        if report != 0 {
            input[addrs.len()..addrs.len() + 4].copy_from_slice(&ip[l4..l4 + 4]);
            return Some(XskMeta { hash: toeplitz(key, &input[..addrs.len() + 4]), report });
        }
    }
    if types & addr == 0 {
        return None;
    }
    Some(XskMeta { hash: toeplitz(key, &input[..addrs.len()]), report: raddr })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microsoft's "Verifying the RSS Hash Calculation" key.
    const MS_KEY: [u8; KEY_SIZE] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca,
        0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b,
        0xbe, 0xac, 0x01, 0xfa,
    ];

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn toeplitz_matches_the_microsoft_suite() {
        // (source, destination, ports) input and the published hashes (IPv4 suite, first rows).
        let v4 = [
            ("420995bba18e6450", 0x0aea_06e6u32, 0x323e_8fc2u32, 0x51cc_c178u32), // 66.9.149.187 -> 161.142.100.80
            ("c75c6f0241458c53", 0x3796_1283, 0xd718_262a, 0xc626_b0ea),          // 199.92.111.2 -> 65.69.140.83
        ];
        for (addrs, ports, ip, tcp) in v4 {
            let mut input = hex(addrs);
            assert_eq!(toeplitz(&MS_KEY, &input), ip, "{addrs} addresses");
            input.extend_from_slice(&ports.to_be_bytes());
            assert_eq!(toeplitz(&MS_KEY, &input), tcp, "{addrs} tcp");
        }
    }

    /// Every line of the fixture the Go model wrote: `frame-hex types key-hex hash report`.
    #[test]
    fn frame_hash_agrees_with_the_go_model() {
        let text = include_str!("../testdata/rss_frames.txt");
        let mut n = 0;
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            let (frame, types, key) = (hex(f[0]), u32::from_str_radix(f[1], 16).unwrap(), hex(f[2]));
            let (hash, report) = (u32::from_str_radix(f[3], 16).unwrap(), f[4].parse::<u16>().unwrap());
            let key: [u8; KEY_SIZE] = key.try_into().unwrap();
            let got = frame_hash(&frame, types, &key).map_or((0, 0), |m| (m.hash, m.report));
            assert_eq!(got, (hash, report), "line {n}: {line}");
            n += 1;
        }
        assert!(n >= 1000, "fixture has {n} frames");
    }
}
