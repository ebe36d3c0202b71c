//! `lanekit-vhost`: command line entry point.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use lanekit_vhost::offload::Offloads;
use lanekit_vhost::{start_backend, Config, DeviceConfig, Error, PortSource, RxGso, TxGso};

/// The lab switch (`LANEKIT_LAB=1` in the environment, as lanekitd's: internal/labswitch): without
/// it the lab-only flags (`--loopback`, `--no-seccomp`) are refused. The agent starts backends with
/// a clean environment, so no argument it passes can turn the filter off.
const LAB_ENV: &str = "LANEKIT_LAB";

/// vhost-user-net backend moving frames between a VM's virtio queues and AF_XDP sockets.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// vhost-user socket to listen on (the VMM connects to it).
    #[arg(long)]
    socket: PathBuf,
    /// Queue pairs offered to the guest (one port per pair).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Guest MAC address (xx:xx:xx:xx:xx:xx), reported in virtio config space.
    #[arg(long, default_value = "52:54:00:12:34:56")]
    mac: String,
    /// MTU reported to the guest.
    #[arg(long, default_value_t = 1500)]
    mtu: u16,
    /// Loop every frame the guest sends back to it (no network). Lab-only: needs LANEKIT_LAB=1.
    #[arg(long, hide = true, conflicts_with_all = ["ifname", "xsk_socket"])]
    loopback: bool,
    /// Create AF_XDP sockets on queues 0..N-1 of this interface (copy mode, needs CAP_NET_RAW;
    /// loads no XDP program).
    #[arg(long, conflicts_with = "xsk_socket")]
    ifname: Option<String>,
    /// Get ready AF_XDP sockets from the agent's SOCK_SEQPACKET socket (needs --vm).
    #[arg(long, requires = "vm")]
    xsk_socket: Option<PathBuf>,
    /// VM name: sent to the agent with --xsk-socket, and the `vm` label of the metrics
    /// (default: the --socket file name).
    #[arg(long)]
    vm: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (ADDR: host:port, or a unix socket path
    /// containing '/'). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Microseconds a worker keeps polling its queues and port after the last frame before it
    /// sleeps (0: purely event-driven). Polling saves wakeups and syscalls under load, at the
    /// cost of up to this much busy CPU after each burst. Default: 50 with more than 2 usable
    /// CPUs, else 0 (a busy-polling worker would take a core from the guest's vCPUs).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    poll_us: Option<u64>,
    /// Microseconds a TX completion notification the guest asked for may be held back (0:
    /// never): dropped when the guest shows it freed those buffers anyway (a Linux guest does
    /// whenever it polls the pair's RX queue), else sent when the time runs out (ten times that
    /// on a pair with no other traffic) or 32 buffers wait. Saves the guest an interrupt (and
    /// QEMU a wake-up) per ACK or small response.
    #[arg(long, default_value_t = lanekit_vhost::backend::DEFAULT_TX_NOTIFY_DELAY.as_micros() as u64,
        value_parser = clap::value_parser!(u64).range(0..=10_000))]
    tx_notify_delay_us: u64,
    /// Do not offer these offloads (comma-separated: csum, tso4, tso6, ecn, uso for guest ->
    /// wire, csum taking every segmentation offload with it; guest_csum, guest_tso4, guest_tso6
    /// for wire -> guest, guest_csum taking both guest_tso with it; guest_tso is both).
    /// All are offered by default.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    no_offload: Vec<String>,
    /// Who segments the guest's TSO/USO frames: `kernel` sends each whole as ONE GSO packet
    /// through a per-queue AF_PACKET socket the agent hands over (the kernel segments it where
    /// the route leaves, after the agent's programs saw one packet); `software` cuts it here
    /// into MTU-sized AF_XDP frames. `kernel` falls back to `software` on queues without such a
    /// socket (an older agent, or one started with --tx-gso software).
    #[arg(long, value_name = "kernel|software", default_value = "kernel", value_parser = parse_tx_gso)]
    tx_gso: TxGso,
    /// How frames reach the guest: `kernel` receives each packet whole (a pod's 64 KiB TCP
    /// segment as ONE packet with its GSO header) through a per-queue AF_PACKET socket the agent
    /// hands over (the agent then steers the VM's frames there, no XDP on its device); `xdp`
    /// receives MTU-sized frames through the AF_XDP sockets and coalesces them here. `kernel`
    /// falls back to `xdp` with an agent that hands no such socket (older, or --rx-gso xdp).
    #[arg(long, value_name = "kernel|xdp", default_value = "kernel", value_parser = parse_rx_gso)]
    rx_gso: RxGso,
    /// Drop every privilege and run as UID:GID (start as root; the agent gives each VM its own
    /// uid). Done before the AF_XDP handover.
    #[arg(long, value_name = "UID:GID", value_parser = parse_ids)]
    run_as: Option<(u32, u32)>,
    /// Grant this uid (the frontend's, KubeVirt's qemu: 107) access to the vhost-user socket with
    /// a POSIX ACL; the socket is otherwise 0600.
    #[arg(long, value_name = "UID")]
    frontend_uid: Option<u32>,
    /// Do not install the seccomp filter (debugging only). Lab-only: needs LANEKIT_LAB=1.
    #[arg(long, hide = true)]
    no_seccomp: bool,
    /// The lab switch was on (set by main from LAB_ENV, not a flag).
    #[arg(skip)]
    lab: bool,
}

fn parse_tx_gso(s: &str) -> Result<TxGso, String> {
    match s {
        "kernel" => Ok(TxGso::Kernel),
        "software" => Ok(TxGso::Software),
        _ => Err(format!("want kernel or software, got {s:?}")),
    }
}

fn parse_rx_gso(s: &str) -> Result<RxGso, String> {
    match s {
        "kernel" => Ok(RxGso::Kernel),
        "xdp" => Ok(RxGso::Xdp),
        _ => Err(format!("want kernel or xdp, got {s:?}")),
    }
}

fn parse_ids(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s.split_once(':').ok_or_else(|| format!("want UID:GID, got {s:?}"))?;
    Ok((u.parse().map_err(|_| format!("bad uid {u:?}"))?, g.parse().map_err(|_| format!("bad gid {g:?}"))?))
}

fn parse_mac(s: &str) -> Result<[u8; 6], Error> {
    let bad = || Error::Config(format!("bad mac address {s:?}"));
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

impl TryFrom<Args> for Config {
    type Error = Error;

    fn try_from(a: Args) -> Result<Self, Error> {
        for (set, flag) in [(a.loopback, "--loopback"), (a.no_seccomp, "--no-seccomp")] {
            if set && !a.lab {
                return Err(Error::Config(format!(
                    "{flag} is lab-only: refused unless {LAB_ENV}=1 is in the environment"
                )));
            }
        }
        let vm = a.vm.clone().unwrap_or_else(|| {
            a.socket.file_name().map_or_else(|| "lanekit-vhost".into(), |n| n.to_string_lossy().into_owned())
        });
        let ports = match (a.loopback, a.ifname, a.xsk_socket, a.vm) {
            (true, None, None, _) => PortSource::Loopback,
            (false, Some(ifname), None, _) => PortSource::Ifname(ifname),
            (false, None, Some(socket), Some(vm)) => PortSource::Agent { socket, vm },
            _ => {
                return Err(Error::Config(
                    "choose one port source: --xsk-socket PATH --vm NAME, --ifname IF or --loopback".into(),
                ))
            }
        };
        Ok(Config {
            socket: a.socket,
            device: DeviceConfig { mac: parse_mac(&a.mac)?, queue_pairs: a.queues, mtu: a.mtu },
            ports,
            poll: a
                .poll_us
                .map_or_else(|| lanekit_vhost::backend::default_poll(cpus()), std::time::Duration::from_micros),
            tx_notify_delay: std::time::Duration::from_micros(a.tx_notify_delay_us),
            metrics_listen: a.metrics_listen,
            vm,
            run_as: a.run_as,
            frontend_uid: a.frontend_uid,
            seccomp: !a.no_seccomp,
            offloads: a.no_offload.iter().try_fold(Offloads::ALL, |o, n| o.without(n.trim())).map_err(Error::Config)?,
            tx_gso: a.tx_gso,
            rx_gso: a.rx_gso,
        })
    }
}

/// CPUs this process may run on (affinity and cgroup quota included).
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let mut args = Args::parse();
    args.lab = std::env::var_os(LAB_ENV).is_some_and(|v| v == "1");
    let result = Config::try_from(args).and_then(start_backend);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanekit-vhost: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn config_lab(args: &[&str], lab: bool) -> Result<Config, String> {
        let mut a = Args::try_parse_from([&["lanekit-vhost", "--socket", "/tmp/s"], args].concat())
            .map_err(|e| e.to_string())?;
        a.lab = lab;
        Config::try_from(a).map_err(|e| e.to_string())
    }

    /// With the lab switch on (most cases use --loopback).
    fn config(args: &[&str]) -> Result<Config, String> {
        config_lab(args, true)
    }

    #[test]
    fn lab_flags_need_the_switch() {
        for (args, flag) in [
            (&["--loopback"][..], "--loopback"),
            (&["--ifname", "eth1", "--no-seccomp"][..], "--no-seccomp"),
            (&["--loopback", "--no-seccomp"][..], "--loopback"),
        ] {
            let err = config_lab(args, false).unwrap_err();
            assert!(err.contains(flag) && err.contains("LANEKIT_LAB=1"), "{args:?}: {err}");
        }
        let c = config_lab(&["--ifname", "eth1"], false).unwrap();
        assert!(c.seccomp);
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("--ifname"), "{help}");
        for hidden in ["--loopback", "--no-seccomp"] {
            assert!(!help.contains(hidden), "--help lists {hidden}: {help}");
        }
    }

    #[test]
    fn args_to_config() {
        let c = config(&["--loopback", "--queues", "4", "--mac", "02:00:00:00:00:01"]).unwrap();
        assert_eq!(c.ports, PortSource::Loopback);
        assert_eq!(c.device.queue_pairs, 4);
        assert_eq!(c.device.mac, [2, 0, 0, 0, 0, 1]);
        assert_eq!(config(&["--ifname", "eth1"]).unwrap().ports, PortSource::Ifname("eth1".into()));
        let c = config(&["--xsk-socket", "/run/lk.sock", "--vm", "vm1"]).unwrap();
        assert_eq!(c.ports, PortSource::Agent { socket: "/run/lk.sock".into(), vm: "vm1".into() });
        assert!(config(&[]).is_err());
        assert!(config(&["--xsk-socket", "/run/lk.sock"]).is_err());
        assert!(config(&["--loopback", "--ifname", "eth1"]).is_err());
        assert!(config(&["--loopback", "--mac", "zz"]).is_err());
        let want = if cpus() > 2 { 50 } else { 0 };
        assert_eq!(config(&["--loopback"]).unwrap().poll, std::time::Duration::from_micros(want));
        assert_eq!(config(&["--loopback", "--poll-us", "50"]).unwrap().poll, std::time::Duration::from_micros(50));
        assert_eq!(config(&["--loopback"]).unwrap().offloads, Offloads::ALL);
        let c = config(&["--loopback", "--no-offload", "tso6,ecn", "--no-offload", "uso"]).unwrap();
        assert_eq!(c.offloads, Offloads { tso6: false, ecn: false, uso: false, ..Offloads::ALL });
        let c = config(&["--loopback", "--no-offload", "guest_tso"]).unwrap();
        assert_eq!(c.offloads, Offloads { guest_tso4: false, guest_tso6: false, ..Offloads::ALL });
        let c = config(&["--loopback", "--no-offload", "csum,guest_csum"]).unwrap();
        assert_eq!(c.offloads, Offloads::NONE);
        let e = config(&["--loopback", "--no-offload", "tso7"]).unwrap_err();
        assert!(e.contains("unknown offload \"tso7\""), "{e}");
        assert!(config(&["--loopback", "--poll-us", "0"]).unwrap().poll.is_zero());
        assert!(config(&["--loopback", "--poll-us", "2000000"]).is_err());
        let c = config(&["--loopback", "--metrics-listen", "127.0.0.1:9200"]).unwrap();
        assert_eq!((c.metrics_listen.as_deref(), c.vm.as_str()), (Some("127.0.0.1:9200"), "s"));
        assert_eq!(config(&["--loopback", "--vm", "vm7"]).unwrap().vm, "vm7");
        assert_eq!(config(&["--loopback"]).unwrap().metrics_listen, None);
        let c = config(&["--loopback", "--run-as", "200000:200001", "--frontend-uid", "107"]).unwrap();
        assert_eq!((c.run_as, c.frontend_uid, c.seccomp), (Some((200000, 200001)), Some(107), true));
        assert!(!config(&["--loopback", "--no-seccomp"]).unwrap().seccomp);
        assert!(config(&["--loopback", "--run-as", "1"]).is_err());
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:aa:bb:0f").unwrap(), [2, 0, 0, 0xaa, 0xbb, 0x0f]);
        for bad in ["", "02:00:00:aa:bb", "02:00:00:aa:bb:0g", "002:00:00:aa:bb:0f", "1:2:3:4:5:6"] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}
