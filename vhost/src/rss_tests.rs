use super::*;

/// Microsoft's RSS verification key.
pub(crate) const MS_KEY: [u8; KEY_SIZE] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b,
    0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac,
    0x01, 0xfa,
];

/// Wire form of RSS_CONFIG (the data after class and command).
pub(crate) fn rss_cmd(types: u32, table: &[u16], unclassified: u16, max_tx_vq: u16, key: &[u8]) -> Vec<u8> {
    let mut b = types.to_le_bytes().to_vec();
    b.extend_from_slice(&((table.len().max(1) - 1) as u16).to_le_bytes());
    b.extend_from_slice(&unclassified.to_le_bytes());
    for q in table {
        b.extend_from_slice(&q.to_le_bytes());
    }
    b.extend_from_slice(&max_tx_vq.to_le_bytes());
    b.push(key.len() as u8);
    b.extend_from_slice(key);
    b
}

fn hash_cmd(types: u32, key: &[u8]) -> Vec<u8> {
    let mut b = types.to_le_bytes().to_vec();
    b.extend_from_slice(&[0u8; 8]);
    b.push(key.len() as u8);
    b.extend_from_slice(key);
    b
}

const TCP_UDP_V4: u32 = hash_type::IPV4 | hash_type::TCPV4 | hash_type::UDPV4;

#[test]
fn rss_config_parses_what_linux_sends() {
    // virtio_net's default: every supported type, 128 entries round robin over 4 pairs.
    let table: Vec<u16> = (0..128).map(|i| i % 4).collect();
    let c = parse_rss_config(&rss_cmd(SUPPORTED_HASH_TYPES, &table, 0, 4, &MS_KEY), 4).unwrap();
    assert_eq!(c.hash_types, SUPPORTED_HASH_TYPES);
    assert!(c.steer);
    assert_eq!(c.table, table);
    assert_eq!(c.key, MS_KEY);
    assert_eq!(c.pairs, Some(4));
    // One entry (mask 0) is a valid table.
    let c = parse_rss_config(&rss_cmd(TCP_UDP_V4, &[1], 1, 2, &MS_KEY), 2).unwrap();
    assert_eq!((c.table, c.unclassified_queue), (vec![1], 1));
    // Hashing off: no key needed.
    let c = parse_rss_config(&rss_cmd(0, &[0], 0, 1, &[]), 1).unwrap();
    assert_eq!((c.hash_types, c.key), (0, [0u8; KEY_SIZE]));
}

#[test]
fn rss_config_refuses_bad_fields() {
    let t4: Vec<u16> = (0..4).collect();
    let cases: Vec<(Vec<u8>, RssError)> = vec![
        (vec![], RssError::Length { what: "RSS_CONFIG", got: 0, want: 8 }),
        // mask 2: three entries, not a power of two
        (rss_cmd(TCP_UDP_V4, &[0, 1, 2], 0, 4, &MS_KEY), RssError::TableLength(3)),
        // 256 entries: beyond rss_max_indirection_table_length
        (rss_cmd(TCP_UDP_V4, &[0; 256], 0, 4, &MS_KEY), RssError::TableLength(256)),
        (
            rss_cmd(TCP_UDP_V4, &[0, 1, 2, 4], 0, 4, &MS_KEY),
            RssError::Queue { what: "indirection table entry", queue: 4, pairs: 4 },
        ),
        (rss_cmd(TCP_UDP_V4, &t4, 9, 4, &MS_KEY), RssError::Queue { what: "unclassified_queue", queue: 9, pairs: 4 }),
        (rss_cmd(TCP_UDP_V4, &t4, 0, 0, &MS_KEY), RssError::TxQueues(0, 4)),
        (rss_cmd(TCP_UDP_V4, &t4, 0, 5, &MS_KEY), RssError::TxQueues(5, 4)),
        (rss_cmd(TCP_UDP_V4, &t4, 0, 4, &MS_KEY[..39]), RssError::KeyLength(39)),
        (rss_cmd(TCP_UDP_V4, &t4, 0, 4, &[]), RssError::KeyLength(0)),
        // _EX types are not offered
        (rss_cmd(1 << 6, &t4, 0, 4, &MS_KEY), RssError::HashTypes(1 << 6, 1 << 6)),
    ];
    for (cmd, want) in cases {
        assert_eq!(parse_rss_config(&cmd, 4), Err(want), "{cmd:?}");
    }
    // Truncated anywhere, or one byte too many: a length error, never a panic.
    let good = rss_cmd(TCP_UDP_V4, &t4, 0, 4, &MS_KEY);
    for n in 0..good.len() {
        assert!(matches!(parse_rss_config(&good[..n], 4), Err(RssError::Length { .. })), "truncated to {n}");
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(parse_rss_config(&long, 4), Err(RssError::Length { .. })));
}

#[test]
fn hash_config_parses_and_refuses() {
    let c = parse_hash_config(&hash_cmd(hash_type::TCPV4, &MS_KEY)).unwrap();
    assert_eq!((c.hash_types, c.steer, c.key, c.pairs), (hash_type::TCPV4, false, MS_KEY, None));
    assert!(parse_hash_config(&hash_cmd(0, &[])).is_ok());
    assert_eq!(parse_hash_config(&hash_cmd(hash_type::TCPV4, &[])), Err(RssError::KeyLength(0)));
    assert_eq!(parse_hash_config(&hash_cmd(1 << 8, &MS_KEY)), Err(RssError::HashTypes(1 << 8, 1 << 8)));
    let good = hash_cmd(hash_type::TCPV4, &MS_KEY);
    for n in 0..good.len() {
        assert!(parse_hash_config(&good[..n]).is_err(), "truncated to {n}");
    }
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Hostile input: random bytes and random mutations of valid commands. The parser never
/// panics, and whatever it accepts satisfies the invariants the BPF side relies on, and
/// encodes back to the exact input.
#[test]
fn random_commands_never_break_the_invariants() {
    let mut rng = Rng(0x0000_554e_5eed_0014);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..20000 {
        let pairs = (rng.next() % 31 + 1) as u16;
        let mut cmd = if i % 2 == 0 {
            let n = (rng.next() % 8) as u32;
            let table: Vec<u16> = (0..1u32 << n).map(|_| (rng.next() % u64::from(pairs)) as u16).collect();
            rss_cmd(SUPPORTED_HASH_TYPES, &table, 0, pairs, &MS_KEY)
        } else {
            (0..rng.next() % 400).map(|_| rng.next() as u8).collect()
        };
        for _ in 0..rng.next() % 4 {
            if cmd.is_empty() {
                break;
            }
            let at = (rng.next() % cmd.len() as u64) as usize;
            match rng.next() % 3 {
                0 => cmd[at] = rng.next() as u8,
                1 => cmd.truncate(at),
                _ => cmd.insert(at, rng.next() as u8),
            }
        }
        match parse_rss_config(&cmd, pairs) {
            Ok(c) => {
                accepted += 1;
                assert!(c.table.len().is_power_of_two() && c.table.len() <= TABLE_SIZE);
                assert!(c.table.iter().all(|&q| q < pairs) && c.unclassified_queue < pairs);
                assert_eq!(c.hash_types & !SUPPORTED_HASH_TYPES, 0);
                let keylen = usize::from(cmd[8 + 2 * c.table.len() + 2]);
                let again = rss_cmd(c.hash_types, &c.table, c.unclassified_queue, c.pairs.unwrap(), &c.key[..keylen]);
                assert_eq!(again, cmd);
            }
            Err(_) => refused += 1,
        }
        let _ = parse_hash_config(&cmd);
    }
    assert!(accepted > 1000 && refused > 1000, "accepted {accepted}, refused {refused}");
}

#[test]
fn encode_matches_the_bpf_layout() {
    let table: Vec<u16> = (0..8).map(|i| 7 - i).collect();
    let c = parse_rss_config(&rss_cmd(TCP_UDP_V4, &table, 3, 8, &MS_KEY), 8).unwrap();
    let v = encode(&c);
    assert_eq!(u32::from_ne_bytes(v[0..4].try_into().unwrap()), TCP_UDP_V4);
    assert_eq!(u16::from_ne_bytes(v[4..6].try_into().unwrap()), 1, "steer");
    assert_eq!(u16::from_ne_bytes(v[6..8].try_into().unwrap()), 7, "table_mask");
    assert_eq!(u16::from_ne_bytes(v[8..10].try_into().unwrap()), 3, "unclassified_queue");
    // QEMU layout: the first key word as a number, then the remaining 36 bytes.
    assert_eq!(u32::from_ne_bytes(v[16..20].try_into().unwrap()), 0x6d5a56da);
    assert_eq!(&v[20..56], &MS_KEY[4..]);
    assert_eq!(u16::from_ne_bytes(v[56..58].try_into().unwrap()), 7);
    assert_eq!(u16::from_ne_bytes(v[70..72].try_into().unwrap()), 0);
    assert!(v[72..].iter().all(|&b| b == 0));
}

#[test]
fn rss_map_writes_through_a_shared_mapping() {
    // A memfd stands in for the BPF map: same mmap semantics for this purpose.
    let f = crate::xsk::memfd("rss", 4096).unwrap();
    let peer = f.try_clone().unwrap();
    let mut m = RssMap::from_fd(f.into(), MAP_VALUE_SIZE).unwrap();
    let c = parse_rss_config(&rss_cmd(TCP_UDP_V4, &[0, 1], 1, 2, &MS_KEY), 2).unwrap();
    m.write(Some(&c));
    let mut back = [0u8; MAP_VALUE_SIZE];
    std::os::unix::fs::FileExt::read_exact_at(&peer, &mut back, 0).unwrap();
    let mut want = encode(&c);
    want[12..16].copy_from_slice(&2u32.to_ne_bytes()); // seq: one completed write
    assert_eq!(back, want);
    m.write(None);
    let v = m.read();
    assert_eq!(u32::from_ne_bytes(v[12..16].try_into().unwrap()), 4);
    assert!(v.iter().enumerate().all(|(i, &b)| (12..16).contains(&i) || b == 0));
    assert!(RssMap::from_fd(peer.into(), 308).is_err());
}

#[test]
fn meta_decodes_only_what_steer_vm_wrote() {
    let m = XskMeta { hash: 0x51ccc178, report: 2 };
    assert_eq!(XskMeta::decode(&m.encode()), Some(m));
    let mut b = m.encode();
    b[6] ^= 1;
    assert_eq!(XskMeta::decode(&b), None, "bad magic");
    let bad = XskMeta { hash: 1, report: MAX_REPORT + 1 }.encode();
    assert_eq!(XskMeta::decode(&bad), None, "report type out of range");
    assert_eq!(XskMeta::decode(&[0; META_LEN]), None);
}
