//! `lanekit-vhost --metrics-listen`: the binary in loopback mode, driven by the hand-written
//! frontend of `hostile/mod.rs`, scraped over HTTP (on a unix socket) after known traffic and
//! known bad input; the OpenMetrics text is parsed here and every count asserted exactly.

mod hostile;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hostile::*;
use vm_memory::{Bytes, GuestAddress};

/// Parsed samples: (name, labels) -> value.
type Samples = BTreeMap<(String, BTreeMap<String, String>), f64>;

/// GET /metrics over the unix socket; returns (status line, content type, body).
fn get(sock: &Path, path: &str) -> (String, String, String) {
    let mut c = UnixStream::connect(sock).expect("connect to the metrics socket");
    c.set_read_timeout(Some(T)).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("http header");
    let status = head.lines().next().unwrap_or_default().to_string();
    let ctype = head.lines().find_map(|l| l.strip_prefix("Content-Type: ")).unwrap_or_default().to_string();
    (status, ctype, body.to_string())
}

/// Parse OpenMetrics text: `# TYPE`/`# HELP` lines are checked for form, samples collected.
fn parse(text: &str) -> Samples {
    assert!(text.ends_with("# EOF\n"), "no # EOF terminator:\n{text}");
    let mut out = Samples::new();
    for line in text.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let kw = meta.split_whitespace().next().unwrap_or_default();
            assert!(["TYPE", "HELP", "UNIT", "EOF"].contains(&kw), "bad comment line: {line}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"))),
            None => (series, ""),
        };
        let mut lm = BTreeMap::new();
        // Label values here never contain `,` or escaped quotes (vm and queue names are plain).
        for kv in labels.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("bad label {kv}: {line}"));
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or_else(|| panic!("{line}"));
            lm.insert(k.to_string(), v.to_string());
        }
        assert!(out.insert((name.to_string(), lm), value).is_none(), "duplicate sample: {line}");
    }
    out
}

const VM: &str = "vm-metrics";

/// The value of `name` with labels `vm=VM` plus `labels` (exactly those); panics if absent.
fn val(s: &Samples, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut lm: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    lm.insert("vm".into(), VM.into());
    let key = (name.to_string(), lm);
    *s.get(&key).unwrap_or_else(|| panic!("no sample {key:?}")) as u64
}

fn q0<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    [&[("queue", "0")][..], extra].concat()
}

struct Metrics {
    sock: PathBuf,
}

impl Metrics {
    fn scrape(&self) -> Samples {
        let (status, ctype, body) = get(&self.sock, "/metrics");
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
        parse(&body)
    }

    /// Scrape until `ok` holds (the datapath counts just after the guest sees its used ring),
    /// bounded by [`T`]; returns the last scrape.
    fn until(&self, what: &str, mut ok: impl FnMut(&Samples) -> bool) -> Samples {
        let deadline = Instant::now() + T;
        loop {
            let s = self.scrape();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: never reached; last scrape: {s:#?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// A pipe (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Put one TX chain on the ring, kick and wait until it comes back.
fn tx_chain(g: &mut Guest, descs: &[(u64, u32, bool)]) {
    let used = g.used_idx(TX);
    g.chain(TX, descs);
    g.kick(TX);
    assert!(g.wait_used(TX, used.wrapping_add(1)), "the TX chain was not returned");
}

#[test]
fn scrape_counts_frames_drops_errors_notifications_and_frontends() {
    let sock = std::env::temp_dir().join(format!("lk-vhost-metrics-{}.sock", std::process::id()));
    let m = Metrics { sock: sock.clone() };
    let mut b = Backend::start_with("metrics", &["--vm", VM, "--metrics-listen", sock.to_str().unwrap()]);
    let deadline = Instant::now() + T;
    while !sock.exists() {
        assert!(Instant::now() < deadline, "metrics socket did not appear:\n{}", b.log());
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, _, _) = get(&sock, "/nope");
    assert_eq!(status, "HTTP/1.0 404 Not Found");

    let s = m.scrape();
    assert_eq!(val(&s, "lanekit_vhost_up", &[]), 1);
    assert_eq!(val(&s, "lanekit_vhost_queue_pairs", &[]), 1);
    assert_eq!(val(&s, "lanekit_vhost_device_running", &[]), 0, "no frontend yet");
    assert_eq!(val(&s, "lanekit_vhost_frontend_connections_total", &[]), 0);
    assert_eq!(val(&s, "lanekit_vhost_rx_packets_total", &q0(&[])), 0);
    assert!(!s.keys().any(|(n, _)| n.contains("_xdp_")), "loopback has no AF_XDP socket");

    // N frames of 114 bytes through the loopback port: guest TX -> port -> guest RX.
    const N: u64 = 5;
    let mut g = Guest::new(&b, true);
    g.setup();
    for i in 0..N {
        g.round_trip(i as u8);
    }
    // Malformed TX input: a device-writable descriptor, and a frame longer than MTU + 18.
    tx_chain(&mut g, &[(buf(TX, 40), 126, true)]);
    let big = 12 + 1600;
    g.mem.write_slice(&vec![0u8; big], GuestAddress(buf(TX, 41))).unwrap();
    tx_chain(&mut g, &[(buf(TX, 41), big as u32, false)]);
    // A valid frame that does not fit the guest's only RX buffer (no MRG_RXBUF): dropped.
    g.chain(RX, &[(buf(RX, 50), 60, true)]);
    g.kick(RX);
    let frame: Vec<u8> = [[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x88, 0xb5].as_slice(), &[7u8; 100]].concat();
    g.mem.write_slice(&[0u8; 12], GuestAddress(buf(TX, 42))).unwrap();
    g.mem.write_slice(&frame, GuestAddress(buf(TX, 42) + 12)).unwrap();
    tx_chain(&mut g, &[(buf(TX, 42), 12 + frame.len() as u32, false)]);

    // Notifications: every signal the backend sent is in the call eventfds' counts.
    let (mut rx_calls, mut tx_calls) = (0u64, 0u64);
    let s = m.until("rx drop and notifications counted", |s| {
        rx_calls += g.calls[RX].read().unwrap_or(0);
        tx_calls += g.calls[TX].read().unwrap_or(0) + g.calls[2].read().unwrap_or(0);
        val(s, "lanekit_vhost_dropped_total", &q0(&[("direction", "rx"), ("reason", "no_room")])) == 1
            && val(s, "lanekit_vhost_guest_notifications_total", &q0(&[("direction", "rx")])) == rx_calls
            && val(s, "lanekit_vhost_guest_notifications_total", &q0(&[("direction", "tx")])) == tx_calls
    });
    assert!(rx_calls >= 1 && tx_calls >= 1, "the guest was notified ({rx_calls} rx, {tx_calls} tx)");
    assert_eq!(val(&s, "lanekit_vhost_tx_packets_total", &q0(&[])), N + 1);
    assert_eq!(val(&s, "lanekit_vhost_tx_bytes_total", &q0(&[])), 114 * (N + 1));
    assert_eq!(val(&s, "lanekit_vhost_rx_packets_total", &q0(&[])), N);
    assert_eq!(val(&s, "lanekit_vhost_rx_bytes_total", &q0(&[])), 114 * N);
    for (dir, reason, want) in
        [("rx", "no_room", 1), ("rx", "bad_chain", 0), ("tx", "port_full", 0), ("tx", "too_large", 0)]
    {
        let got = val(&s, "lanekit_vhost_dropped_total", &q0(&[("direction", dir), ("reason", reason)]));
        assert_eq!(got, want, "dropped {dir} {reason}");
    }
    for (kind, want) in [("bad_chain", 1), ("frame_too_large", 1), ("invalid_ring", 0), ("bad_offload", 0)] {
        assert_eq!(val(&s, "lanekit_vhost_guest_errors_total", &q0(&[("kind", kind)])), want, "guest errors {kind}");
    }
    assert_eq!(val(&s, "lanekit_vhost_rx_backlog", &q0(&[])), 0);
    for kind in ["tx_csum", "tx_gso", "rx_data_valid"] {
        assert_eq!(val(&s, "lanekit_vhost_offloads_total", &q0(&[("kind", kind)])), 0, "offloads {kind}");
    }
    // The hostile guest acks VERSION_1 and protocol features only, of everything offered.
    let bits = |set: &str| -> u64 {
        let f = s.iter().filter(|((n, l), v)| n == "lanekit_vhost_virtio_features" && l["set"] == set && **v == 1.0);
        f.map(|((_, l), _)| 1u64 << l["bit"].parse::<u32>().unwrap()).sum()
    };
    let all = lanekit_vhost::offload::Offloads::ALL.features();
    assert_eq!(bits("offered") & all, all, "every offload offered");
    assert_eq!(bits("acked"), 1 << 32 | 1 << 30);
    assert_eq!(val(&s, "lanekit_vhost_frontend_connections_total", &[]), 1);
    // The device runs from the feature ack to its first ring stop (a migration source's
    // switch-over, which the agent watches for).
    assert_eq!(val(&s, "lanekit_vhost_device_running", &[]), 1);
    assert!(matches!(g.stop(), Outcome::Reply(_)));
    let s = m.scrape();
    assert_eq!(val(&s, "lanekit_vhost_device_running", &[]), 0, "a stopped ring stops the device");
    drop(g);

    // A frontend refused by the hostile-frontend checks (a pipe as kick fd).
    let mut g = Guest::new(&b, false);
    assert!(g.set_mem_table(&[Region::whole(MEM_SIZE)]).is_ack());
    for q in 0..NQ {
        assert!(g.ring(q).is_ack());
    }
    let (pr, pw) = pipe();
    (&File::from(pw)).write_all(&[1]).unwrap();
    assert!(g.conn.ack(SET_VRING_KICK, &u64s(&[TX as u64]), &[pr.as_raw_fd()]).is_refusal());
    drop(g);
    assert!(b.wait_log("frontend refused", 1), "{}", b.log());
    let s = m.until("refusal counted", |s| val(s, "lanekit_vhost_frontend_refused_total", &[]) == 1);
    assert_eq!(val(&s, "lanekit_vhost_frontend_connections_total", &[]), 2);
    assert_eq!(val(&s, "lanekit_vhost_frontend_errors_total", &[]), 1);
    // Per-pair counters survive reconnections (they are the device's, not the connection's).
    assert_eq!(val(&s, "lanekit_vhost_rx_packets_total", &q0(&[])), N);
    b.assert_alive("after scrapes");
}

/// The binary as the agent runs it (seccomp filter on) holds TX notifications of an EVENT_IDX
/// guest (`backend/notify.rs`: a timerfd per pair) and still tells the guest, late: the held and
/// late counts are exported, and the backend survives its filter.
#[test]
fn held_tx_notifications_are_counted_and_sent_under_the_seccomp_filter() {
    let sock = std::env::temp_dir().join(format!("lk-vhost-metrics-notify-{}.sock", std::process::id()));
    let m = Metrics { sock: sock.clone() };
    let mut b = Backend::start_with("metrics-notify", &["--vm", VM, "--metrics-listen", sock.to_str().unwrap()]);
    const EVENT_IDX: u64 = 1 << 29;
    let mut g = Guest::with_features(&b, EVENT_IDX);
    g.setup();
    for i in 0..3 {
        g.round_trip(i);
    }
    // This guest never moves used_event: the held notification goes when its delay runs out.
    let mut tx_calls = 0;
    let s = m.until("a held TX notification sent late", |s| {
        tx_calls += g.calls[TX].read().unwrap_or(0);
        val(s, "lanekit_vhost_tx_notifications_held_total", &q0(&[("outcome", "sent_late")])) >= 1 && tx_calls >= 1
    });
    assert!(val(&s, "lanekit_vhost_tx_notifications_held_total", &q0(&[("outcome", "held")])) >= 1);
    b.assert_alive("held TX notifications");
    assert!(b.wait_log("seccomp filter installed", 1), "the filter was on:\n{}", b.log());
}
