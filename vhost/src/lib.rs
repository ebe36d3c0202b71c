//! lanekit-vhost: a vhost-user-net device backend that moves Ethernet frames between a VM's
//! virtio queues and AF_XDP sockets on the node uplink, one socket per queue pair.
//!
//! Layout follows rust-vmm's vhost-device template: `main.rs` parses arguments into a
//! [`Config`] and calls [`start_backend`]; this file holds the error type and the serve loop
//! (a new daemon per frontend connection, so QEMU can reconnect); `backend.rs` is the
//! `VhostUserBackend`; `net.rs` the per-queue datapath; `port.rs` the packet port trait;
//! `xsk.rs` AF_XDP; `relay.rs` sits between the frontend and the daemon and runs the checks
//! of `validate.rs` on every message; `sigbus.rs` survives guest memory shrinking under us;
//! `dirty.rs` logs the pages we write while the VM migrates.

pub mod backend;
pub mod confine;
pub mod dirty;
#[doc(hidden)]
pub mod fuzzing;
pub mod handover;
pub mod metrics;
pub mod net;
pub mod offload;
pub mod pkt_gso;
pub mod pkt_rx;
pub mod port;
mod relay;
pub mod rss;
pub mod sigbus;
mod validate;
pub mod xsk;

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{debug, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

pub use backend::{DeviceConfig, NetBackend};

/// Everything that can stop the backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid command line or settings.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The backend could not be built.
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    /// A port could not be opened.
    #[error("open port for queue pair {queue}: {source}")]
    Port {
        /// Queue pair.
        queue: usize,
        /// Cause.
        source: io::Error,
    },
    /// The vhost-user socket could not be created.
    #[error("listen on {path}: {source}")]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: vhost::vhost_user::Error,
    },
    /// The vhost-user daemon failed outside a connection.
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
    /// Port fds could not be registered on the worker threads.
    #[error("register port fds: {0}")]
    Register(io::Error),
    /// Per-process or per-connection setup failed (SIGBUS guard, fault eventfd).
    #[error("{0}: {1}")]
    Setup(&'static str, io::Error),
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Where the per-queue-pair ports come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSource {
    /// Frames sent by the guest come back to it (no network; tests and benchmarks).
    Loopback,
    /// Create AF_XDP sockets on queues `0..N-1` of this interface (copy mode; needs CAP_NET_RAW).
    Ifname(String),
    /// Receive ready AF_XDP sockets from the agent (see `xsk.rs` for the protocol).
    Agent {
        /// The agent's `SOCK_SEQPACKET` socket.
        socket: PathBuf,
        /// VM name sent in the request.
        vm: String,
    },
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// vhost-user unix socket path (we listen, the frontend connects).
    pub socket: PathBuf,
    /// Device settings.
    pub device: DeviceConfig,
    /// Port source.
    pub ports: PortSource,
    /// Adaptive polling window (zero: event-driven only); see `backend.rs`.
    pub poll: std::time::Duration,
    /// Longest hold of a TX notification the guest asked for (zero: none); see `backend/notify.rs`.
    pub tx_notify_delay: std::time::Duration,
    /// Serve Prometheus metrics here (`host:port`, or a unix socket path); see `metrics.rs`.
    pub metrics_listen: Option<String>,
    /// The `vm` label of the metrics.
    pub vm: String,
    /// Run as this uid:gid with no capabilities (`--run-as`; the agent starts us as root).
    pub run_as: Option<(u32, u32)>,
    /// The frontend's uid, granted access to the vhost-user socket by an ACL (`--frontend-uid`).
    pub frontend_uid: Option<u32>,
    /// Install the seccomp filter before serving (`--no-seccomp` turns it off for debugging).
    pub seccomp: bool,
    /// Guest -> wire offloads offered to the guest (`--no-offload` removes some).
    pub offloads: offload::Offloads,
    /// Who segments TSO/USO frames (`--tx-gso`).
    pub tx_gso: TxGso,
    /// How frames for the guest arrive (`--rx-gso`).
    pub rx_gso: RxGso,
}

/// Ports of every queue pair, and the VM's RSS map when the agent handed one.
pub type Ports = (Vec<Box<dyn port::Port>>, Option<rss::RssMap>);

/// Guest -> wire segmentation (`--tx-gso`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxGso {
    /// TSO/USO frames leave whole as one GSO packet the kernel segments, on queues that have a
    /// GSO socket (the agent hands them; `pkt_gso.rs`); others are cut here.
    #[default]
    Kernel,
    /// Always cut here into MTU-sized AF_XDP frames (no GSO socket asked for).
    Software,
}

/// Wire -> guest receive path (`--rx-gso`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxGso {
    /// Whole packets (64 KiB GSO packets as one) through a per-queue `AF_PACKET` socket the
    /// agent hands over (`pkt_rx.rs`); queues without one receive through AF_XDP.
    Kernel,
    /// Through the AF_XDP sockets (`steer_vm`), MTU-sized frames coalesced here (`gro.rs`).
    #[default]
    Xdp,
}

/// Open one port per queue pair; AF_XDP frames must hold `max_frame` bytes. `rx_gso` only
/// matters for ports the agent hands over (`--ifname` ports always receive through AF_XDP).
pub fn open_ports(source: &PortSource, pairs: u16, max_frame: usize, tx_gso: TxGso, rx_gso: RxGso) -> Result<Ports> {
    let boxed = |p: xsk::XskPort| -> Result<Box<dyn port::Port>> {
        let fs = p.params().frame_size as usize;
        if fs < max_frame {
            return Err(Error::Config(format!(
                "AF_XDP frame size {fs} is smaller than the largest frame {max_frame} (mtu + 18)"
            )));
        }
        Ok(Box::new(p))
    };
    let ports: Result<Vec<Box<dyn port::Port>>> = match source {
        PortSource::Loopback => (0..usize::from(pairs))
            .map(|i| {
                port::LoopPort::new(i)
                    .map(|p| Box::new(p) as Box<dyn port::Port>)
                    .map_err(|source| Error::Port { queue: i, source })
            })
            .collect(),
        PortSource::Ifname(ifname) => (0..pairs)
            .map(|i| {
                let mut p = xsk::XskPort::create(ifname, xsk::XskParams::standard(u32::from(i)))
                    .map_err(|source| Error::Port { queue: usize::from(i), source })?;
                if tx_gso == TxGso::Kernel {
                    let g = xsk::ifindex(ifname)
                        .and_then(pkt_gso::GsoSocket::open)
                        .map_err(|source| Error::Port { queue: usize::from(i), source })?;
                    p.set_gso(g);
                }
                boxed(p)
            })
            .collect(),
        PortSource::Agent { socket, vm } => {
            let (ports, rss) =
                handover::request_ports(socket, vm, pairs, tx_gso == TxGso::Kernel, rx_gso == RxGso::Kernel)
                    .map_err(|source| Error::Port { queue: 0, source })?;
            return Ok((ports.into_iter().map(boxed).collect::<Result<_>>()?, rss));
        }
    };
    Ok((ports?, None))
}

/// Open the ports and serve frontends forever. With `run_as`, privileges are dropped before
/// anything else; the process is locked down (`confine.rs`) before the first frontend.
pub fn start_backend(config: Config) -> Result<()> {
    // With `run_as`, the socket is bound while still root: its directory may lie beneath one only
    // root can search (KubeVirt's socket volume inside kubelet's 0750 pods directory). It is then
    // given to the backend's user and the frontend's ACL set without following links (the pod
    // that owns the directory cannot make root chown or ACL another file).
    let mut bound = None;
    if let Some((uid, gid)) = config.run_as {
        confine::private_umask();
        let listener = listen(&config.socket)?;
        confine::give_socket(&config.socket, uid, gid, config.frontend_uid)
            .map_err(|e| Error::Setup("socket owner", e))?;
        bound = Some(listener);
        confine::drop_privileges(uid, gid).map_err(|e| Error::Setup("drop privileges", e))?;
    }
    confine::lock_down().map_err(|e| Error::Setup("lock down", e))?;
    let max_frame = usize::from(config.device.mtu) + 18;
    let (ports, rss) = open_ports(&config.ports, config.device.queue_pairs, max_frame, config.tx_gso, config.rx_gso)?;
    let mut backend = NetBackend::new(config.device, ports)?
        .with_poll(config.poll)
        .with_tx_notify_delay(config.tx_notify_delay)
        .with_offloads(config.offloads);
    if let Some(map) = rss {
        info!("offering virtio RSS and hash report (the agent handed the VM's RSS map)");
        backend = backend.with_rss(map);
    }
    let backend = Arc::new(backend);
    if let Some(addr) = &config.metrics_listen {
        let listener = metrics::MetricsListener::bind(addr).map_err(|e| Error::Setup("listen for metrics", e))?;
        let registry = metrics::Exporter::new(backend.clone(), config.vm.clone()).registry();
        metrics::spawn(listener, registry).map_err(|e| Error::Setup("start metrics thread", e))?;
        info!("serving metrics on {addr}");
    }
    let listener = match bound {
        Some(l) => l,
        None => {
            let l = listen(&config.socket)?;
            if let Some(uid) = config.frontend_uid {
                confine::grant_frontend(&config.socket, uid).map_err(|e| Error::Setup("socket access", e))?;
            }
            l
        }
    };
    let _unlink = Unlink(config.socket.clone());
    sigbus::install().map_err(|e| Error::Setup("guard guest memory", e))?;
    if config.seccomp {
        confine::install_seccomp().map_err(|e| Error::Setup("seccomp", e))?;
        info!("seccomp filter installed");
    } else {
        warn!("seccomp filter off (--no-seccomp)");
    }
    info!("serving {} queue pair(s) on {}", config.device.queue_pairs, config.socket.display());
    serve_on(backend, &listener, &config.socket, None)
}

fn listen(socket: &Path) -> Result<UnixListener> {
    let _ = std::fs::remove_file(socket);
    UnixListener::bind(socket)
        .map_err(|e| Error::Listen { path: socket.to_path_buf(), source: vhost::vhost_user::Error::SocketError(e) })
}

/// Accept frontends on `socket` one after another (a new daemon for each, so a frontend can
/// disconnect and connect again), stopping after `max_connections` when given. Each connection
/// goes through `relay.rs` (QEMU message-order fix) to the daemon over a private abstract socket.
pub fn serve(backend: Arc<NetBackend>, socket: &Path, max_connections: Option<usize>) -> Result<()> {
    sigbus::install().map_err(|e| Error::Setup("guard guest memory", e))?;
    let listener = listen(socket)?;
    let _unlink = Unlink(socket.to_path_buf());
    serve_on(backend, &listener, socket, max_connections)
}

/// [`serve`] on a bound listener (`socket` names it in errors).
fn serve_on(
    backend: Arc<NetBackend>,
    listener: &UnixListener,
    socket: &Path,
    max_connections: Option<usize>,
) -> Result<()> {
    let listen_err =
        |e: io::Error| Error::Listen { path: socket.to_path_buf(), source: vhost::vhost_user::Error::SocketError(e) };
    let mut served = 0usize;
    while max_connections.is_none_or(|m| served < m) {
        backend.reset();
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<dirty::DirtyBitmap>::new());
        let mut daemon = VhostUserDaemon::new("lanekit-vhost".into(), backend.clone(), mem)
            .map_err(|e| Error::Daemon(e.to_string()))?;
        let handlers = daemon.get_epoll_handlers();
        backend.register_listeners(&handlers).map_err(Error::Register)?;
        let (frontend, _) = listener.accept().map_err(listen_err)?;
        let name = format!("lanekit-vhost-{}-{served}-{:p}", std::process::id(), Arc::as_ptr(&backend));
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(listen_err)?;
        let mut inner = Listener::from(UnixListener::bind_addr(&addr).map_err(listen_err)?);
        let to_daemon = UnixStream::connect_addr(&addr).map_err(listen_err)?;
        let fault = backend.fault_fd().map_err(|e| Error::Setup("duplicate fault eventfd", e))?;
        let b = backend.clone();
        let on_log_fd = Box::new(move |fd| b.set_log_fd(fd));
        let relay = relay::spawn(frontend, to_daemon, fault, on_log_fd).map_err(listen_err)?;
        daemon.start(&mut inner).map_err(|e| Error::Daemon(e.to_string()))?;
        backend.count_connection();
        info!("frontend connected");
        match daemon.wait() {
            Ok(()) | Err(vhost_user_backend::Error::HandleRequest(vhost::vhost_user::Error::Disconnected)) => {
                info!("frontend disconnected")
            }
            Err(e) => {
                backend.count_connection_error();
                warn!("frontend connection ended: {e}");
            }
        }
        for h in &handlers {
            h.send_exit_event();
        }
        drop(handlers);
        // Dropping the daemon closes its end, which ends the relay, and joins its workers.
        drop(daemon);
        for t in relay {
            match t.join() {
                Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                    backend.count_refusal();
                    warn!("frontend refused: {e}");
                }
                Ok(Err(e)) => debug!("relay: {e}"),
                Ok(Ok(())) => {}
                Err(_) => warn!("relay thread panicked"),
            }
        }
        backend.end_connection();
        served += 1;
        info!("stats after connection {served}: {:?}", backend.stats());
    }
    Ok(())
}

/// Removes the socket file when serving stops.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
