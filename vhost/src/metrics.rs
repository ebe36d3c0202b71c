//! Prometheus metrics of the backend (`--metrics-listen ADDR`): per VM (label `vm`) and queue
//! pair (label `queue`) frame and byte counters, drops by reason, guest input errors by kind,
//! guest notifications, the kernel's `XDP_STATISTICS` of each AF_XDP socket the backend holds,
//! the kernel's `PACKET_STATISTICS` and buffer state of each `--rx-gso kernel` packet socket
//! (read, and accumulated since the kernel resets them, at scrape time: `pkt_rx.rs`), and
//! frontend connections. The agent hands the sockets over and keeps no copy, so the backend
//! exports these itself.
//!
//! Nothing here touches the datapath: the workers bump relaxed per-pair atomics
//! ([`crate::net::Stats`]) and a scrape reads them, calls `getsockopt` on each socket and takes
//! each pair's lock once for the RX backlog. The text is OpenMetrics, encoded by
//! `prometheus-client`, served by a small blocking HTTP/1.0 responder on one thread (TCP or a
//! unix socket path). Every family is declared in [`FAMILIES`]; the golden list
//! `deploy/grafana/lanekit-vhost-metrics.txt` (checked by a test here) is what the Grafana
//! dashboard test in `pkg/metrics` checks `deploy/grafana/lanekit-vhost.json` against.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{debug, warn};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::net::{ErrorKind, StatsSnapshot};
use crate::pkt_rx::RxSocketStats;
use crate::xsk::{xdp_statistics, XdpStatistics};
use crate::NetBackend;
use vhost_user_backend::VhostUserBackend;

/// One metric family: name (without `_total`), help, type, labels of its samples.
pub struct Family {
    /// Name as declared; counters are exposed with a `_total` suffix.
    pub name: &'static str,
    /// HELP text.
    pub help: &'static str,
    /// Counter or gauge.
    pub counter: bool,
    /// Label names of every sample.
    pub labels: &'static [&'static str],
}

const VM: &[&str] = &["vm"];
const VQ: &[&str] = &["vm", "queue"];

macro_rules! fam {
    ($name:literal, $counter:literal, $labels:expr, $help:literal) => {
        Family { name: $name, help: $help, counter: $counter, labels: $labels }
    };
}

/// Every family the backend exports (the golden list is generated from this).
pub const FAMILIES: &[Family] = &[
    fam!("lanekit_vhost_up", false, VM, "1 while the backend process serves"),
    fam!("lanekit_vhost_queue_pairs", false, VM, "Queue pairs offered to the guest"),
    fam!("lanekit_vhost_active_queue_pairs", false, VM, "Queue pairs the guest enabled (VQ_PAIRS_SET)"),
    fam!(
        "lanekit_vhost_device_running",
        false,
        VM,
        "1 from the frontend's device start (features acked) to its first ring stop or disconnect"
    ),
    fam!("lanekit_vhost_frontend_connections", true, VM, "Frontend (VMM) connections accepted"),
    fam!("lanekit_vhost_frontend_refused", true, VM, "Frontend connections refused by the hostile-frontend checks"),
    fam!("lanekit_vhost_frontend_errors", true, VM, "Frontend connections ended by an error (refusals included)"),
    fam!(
        "lanekit_vhost_virtio_features",
        false,
        &["vm", "set", "bit"],
        "1 for each virtio feature bit offered to the frontend (set=offered) and acked by it (set=acked)"
    ),
    fam!("lanekit_vhost_rx_packets", true, VQ, "Frames delivered to the guest (port to guest RX queue)"),
    fam!("lanekit_vhost_rx_bytes", true, VQ, "Bytes delivered to the guest, without virtio header"),
    fam!("lanekit_vhost_tx_packets", true, VQ, "Frames from the guest TX queue accepted by the port"),
    fam!("lanekit_vhost_tx_bytes", true, VQ, "Bytes from the guest accepted by the port"),
    fam!(
        "lanekit_vhost_dropped",
        true,
        &["vm", "queue", "direction", "reason"],
        "Frames dropped: rx no_room (did not fit the guest buffer), bad_chain, refused (a kernel header that failed \
         the checks), and with --rx-gso kernel socket_full (the kernel's PACKET_STATISTICS tp_drops: the packet \
         socket's receive queue was full, each one skb, up to 192 KiB with BIG TCP) and too_big (larger than the backend's \
         buffer); tx port_full or too_large"
    ),
    fam!(
        "lanekit_vhost_guest_errors",
        true,
        &["vm", "queue", "kind"],
        "Malformed guest input refused: bad_chain, frame_too_large, invalid_ring, bad_offload (chain dropped)"
    ),
    fam!(
        "lanekit_vhost_offloads",
        true,
        &["vm", "queue", "kind"],
        "Offloads executed: tx_csum (checksum filled in), tx_gso (GSO chain validated: cut into MTU-sized frames \
         or sent whole), tx_gso_kernel (GSO chain sent whole as one GSO packet the kernel segments), tx_gso_fallback \
         (the kernel refused it: cut here), tx_csum_kernel \
         (TCP/UDP checksum left to the kernel through AF_XDP TX metadata), rx_data_valid \
         (checksum verified, frame marked DATA_VALID), rx_gro_segments (guest packets each coalesced from several frames, \
         GUEST_TSO), rx_gro_frames (frames in them), rx_gro_split (frames of a segment the guest's buffers could \
         not take whole, delivered one by one), rx_gso_kernel (GSO packets received whole from the kernel's packet \
         socket, --rx-gso kernel, delivered whole), rx_gso_kernel_cut (such packets cut here: GSO type not acked or \
         buffers too few), rx_gso_kernel_chunks (the GSO packets of at most 64 KiB a TSO guest got of the \
         kernel's packets larger than that, BIG TCP), rx_kernel_refused (a kernel header that failed the checks: packet dropped)"
    ),
    fam!(
        "lanekit_vhost_guest_notifications",
        true,
        &["vm", "queue", "direction"],
        "Used-buffer notifications (interrupts) sent to the guest; tx includes the control queue"
    ),
    fam!(
        "lanekit_vhost_tx_notifications_held",
        true,
        &["vm", "queue", "outcome"],
        "TX used-buffer notifications the guest asked for: held (held back, --tx-notify-delay-us), sent_late \
         (of those, sent after all: the delay ran out or too many buffers waited); the others the guest showed it no \
         longer needed (it consumed the buffers when it polled its RX queue)"
    ),
    fam!(
        "lanekit_vhost_busy_seconds",
        true,
        VQ,
        "Time in queue runs that moved frames (sleeping, waking and empty polls excluded)"
    ),
    fam!("lanekit_vhost_rx_backlog", false, VQ, "Frames taken from the port waiting for guest RX buffers"),
    fam!(
        "lanekit_vhost_rx_socket_packets",
        true,
        VQ,
        "--rx-gso kernel: packets the kernel passed to the queue's packet socket, dropped ones included \
         (PACKET_STATISTICS tp_packets)"
    ),
    fam!(
        "lanekit_vhost_rx_socket_rcvbuf_bytes",
        false,
        VQ,
        "--rx-gso kernel: the packet socket's receive queue limit (SO_RCVBUF, skb truesize)"
    ),
    fam!(
        "lanekit_vhost_rx_socket_queued_bytes",
        false,
        VQ,
        "--rx-gso kernel: bytes (skb truesize) queued on the packet socket, waiting for the backend"
    ),
    fam!("lanekit_vhost_xdp_rx_dropped", true, VQ, "AF_XDP XDP_STATISTICS rx_dropped"),
    fam!("lanekit_vhost_xdp_rx_invalid_descs", true, VQ, "AF_XDP XDP_STATISTICS rx_invalid_descs"),
    fam!("lanekit_vhost_xdp_tx_invalid_descs", true, VQ, "AF_XDP XDP_STATISTICS tx_invalid_descs"),
    fam!("lanekit_vhost_xdp_rx_ring_full", true, VQ, "AF_XDP XDP_STATISTICS rx_ring_full"),
    fam!("lanekit_vhost_xdp_rx_fill_ring_empty_descs", true, VQ, "AF_XDP XDP_STATISTICS rx_fill_ring_empty_descs"),
    fam!("lanekit_vhost_xdp_tx_ring_empty_descs", true, VQ, "AF_XDP XDP_STATISTICS tx_ring_empty_descs"),
];

/// The golden list: one line per exposed sample name with its labels.
pub fn golden() -> String {
    FAMILIES
        .iter()
        .map(|f| format!("{}{} {}\n", f.name, if f.counter { "_total" } else { "" }, f.labels.join(",")))
        .collect()
}

type Labels = Vec<(&'static str, String)>;

/// Collects one backend's metrics at scrape time.
pub struct Exporter {
    backend: Arc<NetBackend>,
    vm: String,
}

impl fmt::Debug for Exporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exporter").field("vm", &self.vm).finish_non_exhaustive()
    }
}

impl Exporter {
    /// Export `backend` under label `vm`.
    pub fn new(backend: Arc<NetBackend>, vm: impl Into<String>) -> Self {
        Exporter { backend, vm: vm.into() }
    }

    /// A registry holding this exporter.
    pub fn registry(self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self));
        r
    }

    fn vm(&self) -> Labels {
        vec![("vm", self.vm.clone())]
    }

    fn set(&self, set: &str, bit: u32) -> Labels {
        vec![("vm", self.vm.clone()), ("set", set.to_string()), ("bit", bit.to_string())]
    }

    fn q(&self, pair: usize) -> Labels {
        vec![("vm", self.vm.clone()), ("queue", pair.to_string())]
    }
}

fn family(name: &str) -> &'static Family {
    FAMILIES.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("metric {name} is not in FAMILIES"))
}

/// Encode one family with its samples (labels, value).
fn emit(enc: &mut DescriptorEncoder, name: &str, samples: &[(Labels, u64)]) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let f = family(name);
    let ty = if f.counter { MetricType::Counter } else { MetricType::Gauge };
    let mut m = enc.encode_descriptor(f.name, f.help, None, ty)?;
    for (labels, v) in samples {
        let fm = m.encode_family(labels)?;
        if f.counter {
            ConstCounter::new(*v).encode(fm)?;
        } else {
            ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX)).encode(fm)?;
        }
    }
    Ok(())
}

/// Emit a counter family of nanosecond samples in seconds.
fn emit_seconds(enc: &mut DescriptorEncoder, name: &str, samples: &[(Labels, u64)]) -> fmt::Result {
    let f = family(name);
    let mut m = enc.encode_descriptor(f.name, f.help, None, MetricType::Counter)?;
    for (labels, ns) in samples {
        ConstCounter::new(*ns as f64 / 1e9).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let b = &self.backend;
        emit(&mut enc, "lanekit_vhost_up", &[(self.vm(), 1)])?;
        emit(&mut enc, "lanekit_vhost_queue_pairs", &[(self.vm(), u64::from(b.config().queue_pairs))])?;
        emit(&mut enc, "lanekit_vhost_active_queue_pairs", &[(self.vm(), u64::from(b.active_pairs()))])?;
        emit(&mut enc, "lanekit_vhost_device_running", &[(self.vm(), u64::from(b.device_running()))])?;
        emit(&mut enc, "lanekit_vhost_frontend_connections", &[(self.vm(), b.connections())])?;
        emit(&mut enc, "lanekit_vhost_frontend_refused", &[(self.vm(), b.refusals())])?;
        emit(&mut enc, "lanekit_vhost_frontend_errors", &[(self.vm(), b.connection_errors())])?;

        let stats = b.pair_stats();
        let per = |f: fn(&StatsSnapshot) -> u64| -> Vec<(Labels, u64)> {
            stats.iter().enumerate().map(|(i, s)| (self.q(i), f(s))).collect()
        };
        let mut features = Vec::new();
        for (set, bits) in
            [("offered", VhostUserBackend::features(b.as_ref())), ("acked", NetBackend::acked_features(b))]
        {
            features.extend((0..64).filter(|i| bits & (1 << i) != 0).map(|i| (self.set(set, i), 1)));
        }
        emit(&mut enc, "lanekit_vhost_virtio_features", &features)?;
        emit(&mut enc, "lanekit_vhost_rx_packets", &per(|s| s.rx_frames))?;
        emit(&mut enc, "lanekit_vhost_rx_bytes", &per(|s| s.rx_bytes))?;
        emit(&mut enc, "lanekit_vhost_tx_packets", &per(|s| s.tx_frames))?;
        emit(&mut enc, "lanekit_vhost_tx_bytes", &per(|s| s.tx_bytes))?;
        let with = |i: usize, extra: &[(&'static str, &str)]| {
            let mut l = self.q(i);
            l.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            l
        };
        let mut drops = Vec::new();
        let mut errors = Vec::new();
        let (mut notes, mut held) = (Vec::new(), Vec::new());
        let mut offloads = Vec::new();
        let rx_socks: Vec<(usize, RxSocketStats)> = b
            .rx_sockets()
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.as_ref()?;
                c.read().map_err(|e| debug!("queue pair {i}: PACKET_STATISTICS: {e}")).ok().map(|s| (i, s))
            })
            .collect();
        for (i, r) in &rx_socks {
            drops.push((with(*i, &[("direction", "rx"), ("reason", "socket_full")]), r.drops));
            drops.push((with(*i, &[("direction", "rx"), ("reason", "too_big")]), r.truncated));
        }
        for (i, s) in stats.iter().enumerate() {
            offloads.push((with(i, &[("kind", "tx_csum")]), s.tx_csum));
            offloads.push((with(i, &[("kind", "tx_gso")]), s.tx_gso));
            offloads.push((with(i, &[("kind", "tx_gso_kernel")]), s.tx_gso_kernel));
            offloads.push((with(i, &[("kind", "tx_gso_fallback")]), s.tx_gso_fallback));
            offloads.push((with(i, &[("kind", "tx_csum_kernel")]), s.tx_csum_kernel));
            offloads.push((with(i, &[("kind", "rx_data_valid")]), s.rx_csum_valid));
            offloads.push((with(i, &[("kind", "rx_gro_segments")]), s.rx_gro_segments));
            offloads.push((with(i, &[("kind", "rx_gro_frames")]), s.rx_gro_merged));
            offloads.push((with(i, &[("kind", "rx_gro_split")]), s.rx_gro_split));
            offloads.push((with(i, &[("kind", "rx_gso_kernel")]), s.rx_gso_kernel));
            offloads.push((with(i, &[("kind", "rx_gso_kernel_cut")]), s.rx_gso_kernel_cut));
            offloads.push((with(i, &[("kind", "rx_gso_kernel_chunks")]), s.rx_gso_kernel_chunks));
            offloads.push((with(i, &[("kind", "rx_kernel_refused")]), s.rx_kernel_refused));
            drops.push((with(i, &[("direction", "rx"), ("reason", "no_room")]), s.rx_dropped_no_room));
            drops.push((with(i, &[("direction", "rx"), ("reason", "bad_chain")]), s.rx_dropped_bad_chain));
            drops.push((with(i, &[("direction", "rx"), ("reason", "refused")]), s.rx_dropped_refused));
            drops.push((with(i, &[("direction", "tx"), ("reason", "port_full")]), s.tx_dropped_port_full));
            drops.push((with(i, &[("direction", "tx"), ("reason", "too_large")]), s.tx_dropped_too_large));
            for (k, v) in ErrorKind::ALL.iter().zip(s.error_kinds) {
                errors.push((with(i, &[("kind", k.label())]), v));
            }
            notes.push((with(i, &[("direction", "rx")]), s.rx_notifications));
            notes.push((with(i, &[("direction", "tx")]), s.tx_notifications));
            held.push((with(i, &[("outcome", "held")]), s.tx_notify_held));
            held.push((with(i, &[("outcome", "sent_late")]), s.tx_notify_late));
        }
        emit(&mut enc, "lanekit_vhost_dropped", &drops)?;
        emit(&mut enc, "lanekit_vhost_guest_errors", &errors)?;
        emit(&mut enc, "lanekit_vhost_offloads", &offloads)?;
        emit(&mut enc, "lanekit_vhost_guest_notifications", &notes)?;
        emit(&mut enc, "lanekit_vhost_tx_notifications_held", &held)?;
        emit_seconds(&mut enc, "lanekit_vhost_busy_seconds", &per(|s| s.busy_ns))?;
        let backlog: Vec<(Labels, u64)> =
            b.rx_backlog().into_iter().enumerate().map(|(i, n)| (self.q(i), n as u64)).collect();
        emit(&mut enc, "lanekit_vhost_rx_backlog", &backlog)?;
        let r = |f: fn(&RxSocketStats) -> u64| -> Vec<(Labels, u64)> {
            rx_socks.iter().map(|(i, s)| (self.q(*i), f(s))).collect()
        };
        emit(&mut enc, "lanekit_vhost_rx_socket_packets", &r(|s| s.packets))?;
        emit(&mut enc, "lanekit_vhost_rx_socket_rcvbuf_bytes", &r(|s| s.rcvbuf))?;
        emit(&mut enc, "lanekit_vhost_rx_socket_queued_bytes", &r(|s| s.queued))?;

        let xdp: Vec<(usize, XdpStatistics)> = b
            .xsk_fds()
            .iter()
            .enumerate()
            .filter_map(|(i, fd)| {
                let fd = (*fd)?;
                xdp_statistics(fd).map_err(|e| debug!("queue pair {i}: XDP_STATISTICS: {e}")).ok().map(|s| (i, s))
            })
            .collect();
        let x = |f: fn(&XdpStatistics) -> u64| -> Vec<(Labels, u64)> {
            xdp.iter().map(|(i, s)| (self.q(*i), f(s))).collect()
        };
        emit(&mut enc, "lanekit_vhost_xdp_rx_dropped", &x(|s| s.rx_dropped))?;
        emit(&mut enc, "lanekit_vhost_xdp_rx_invalid_descs", &x(|s| s.rx_invalid_descs))?;
        emit(&mut enc, "lanekit_vhost_xdp_tx_invalid_descs", &x(|s| s.tx_invalid_descs))?;
        emit(&mut enc, "lanekit_vhost_xdp_rx_ring_full", &x(|s| s.rx_ring_full))?;
        emit(&mut enc, "lanekit_vhost_xdp_rx_fill_ring_empty_descs", &x(|s| s.rx_fill_ring_empty_descs))?;
        emit(&mut enc, "lanekit_vhost_xdp_tx_ring_empty_descs", &x(|s| s.tx_ring_empty_descs))?;
        Ok(())
    }
}

/// Encode the registry as OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        warn!("encode metrics: {e}");
    }
    out
}

/// Where metrics are served.
#[derive(Debug)]
pub enum MetricsListener {
    /// `host:port`.
    Tcp(TcpListener),
    /// A unix socket path (anything containing `/`).
    Unix(UnixListener),
}

impl MetricsListener {
    /// Listen on `addr`: a unix socket path when it contains `/`, else a TCP `host:port`.
    pub fn bind(addr: &str) -> io::Result<Self> {
        if addr.contains('/') {
            // A stale socket from an earlier run is replaced; any other file is left alone
            // (bind then fails with "address in use").
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(addr).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(addr)?;
            }
            UnixListener::bind(addr).map(MetricsListener::Unix)
        } else {
            TcpListener::bind(addr).map(MetricsListener::Tcp)
        }
    }

    /// The bound TCP address (tests listen on port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            MetricsListener::Tcp(l) => l.local_addr().ok(),
            MetricsListener::Unix(_) => None,
        }
    }
}

const MAX_REQUEST: usize = 8192;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Answer one HTTP request: `GET /metrics` gets the metrics, anything else 404/405.
fn respond(conn: &mut (impl Read + Write), registry: &Registry) -> io::Result<()> {
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > MAX_REQUEST {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request header too large"));
        }
    }
    let line = String::from_utf8_lossy(req.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => {
            ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(registry))
        }
        ("GET", _) => ("404 Not Found", "text/plain", "not found: try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".to_string()),
    };
    write!(
        conn,
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// Serve `registry` on `listener` from a background thread, one request per connection.
pub fn spawn(listener: MetricsListener, registry: Registry) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("metrics".into()).spawn(move || loop {
        let r = match &listener {
            MetricsListener::Tcp(l) => l.accept().and_then(|(mut c, _)| {
                c.set_read_timeout(Some(CLIENT_TIMEOUT))?;
                c.set_write_timeout(Some(CLIENT_TIMEOUT))?;
                respond(&mut c, &registry)
            }),
            MetricsListener::Unix(l) => l.accept().and_then(|(mut c, _)| {
                c.set_read_timeout(Some(CLIENT_TIMEOUT))?;
                c.set_write_timeout(Some(CLIENT_TIMEOUT))?;
                respond(&mut c, &registry)
            }),
        };
        if let Err(e) = r {
            debug!("metrics request: {e}");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::{LoopPort, Port};
    use crate::DeviceConfig;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/lanekit-vhost-metrics.txt");

    /// The golden list the Grafana dashboard test reads is exactly [`FAMILIES`]
    /// (`LANEKIT_UPDATE_GOLDEN=1 cargo test golden` rewrites it).
    #[test]
    fn golden_list_matches_families() {
        if std::env::var_os("LANEKIT_UPDATE_GOLDEN").is_some() {
            std::fs::write(GOLDEN, golden()).unwrap();
        }
        let have = std::fs::read_to_string(GOLDEN).unwrap();
        assert_eq!(have, golden(), "{GOLDEN} is stale: run LANEKIT_UPDATE_GOLDEN=1 cargo test golden");
    }

    /// Over TCP (port 0 here): GET /metrics answers 200 with the text, other paths 404,
    /// other methods 405.
    #[test]
    fn serves_over_tcp() {
        let ports: Vec<Box<dyn Port>> = vec![Box::new(LoopPort::new(0).unwrap())];
        let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 1], queue_pairs: 1, mtu: 1500 };
        let backend = Arc::new(NetBackend::new(cfg, ports).unwrap());
        let l = MetricsListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        spawn(l, Exporter::new(backend, "vm-t").registry()).unwrap();
        let get = |req: &str| {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\nlanekit_vhost_up{vm=\"vm-t\"} 1\n"), "{ok}");
        assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.0 405"));
    }

    /// Every family the exporter emits is declared (the `family` lookup panics otherwise) and
    /// carries exactly the declared labels; without AF_XDP ports the xdp families are absent.
    #[test]
    fn rendered_samples_match_declared_labels() {
        let ports: Vec<Box<dyn Port>> = (0..2).map(|i| Box::new(LoopPort::new(i).unwrap()) as Box<dyn Port>).collect();
        let cfg = DeviceConfig { mac: [2, 0, 0, 0, 0, 1], queue_pairs: 2, mtu: 1500 };
        let backend = Arc::new(NetBackend::new(cfg, ports).unwrap());
        let text = render(&Exporter::new(backend, "vm-a").registry());
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, rest) = line.split_once('{').unwrap_or_else(|| panic!("no labels: {line}"));
            let f = FAMILIES
                .iter()
                .find(|f| name == format!("{}{}", f.name, if f.counter { "_total" } else { "" }))
                .unwrap_or_else(|| panic!("undeclared sample {name}"));
            let labels: Vec<&str> =
                rest.split_once('}').unwrap().0.split(',').map(|kv| kv.split_once('=').unwrap().0).collect();
            assert_eq!(labels, f.labels, "{line}");
            assert!(rest.contains("vm=\"vm-a\""), "{line}");
            seen.insert(f.name);
        }
        let not_xdp: Vec<&str> =
            FAMILIES.iter().map(|f| f.name).filter(|n| !n.contains("_xdp_") && !n.contains("_rx_socket_")).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), {
            let mut v = not_xdp;
            v.sort();
            v
        });
    }
}
