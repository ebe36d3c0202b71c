//! A vhost-user message relay between the frontend and the vhost-user-backend daemon.
//!
//! It exists for one ordering incompatibility: QEMU's virtio-net (at least 7.2) attaches its
//! queue pairs when the device is realized and sends `SET_VRING_ENABLE` before `SET_FEATURES`;
//! vhost-user-backend 0.24 refuses `SET_VRING_ENABLE` until `VHOST_USER_F_PROTOCOL_FEATURES` is
//! acked ("inactive feature") and drops the connection, so QEMU could not use the backend at all.
//! The relay holds such early messages (acking them when the frontend asks for a reply) and
//! replays them right after the `SET_FEATURES` that acks protocol features. Every other message
//! passes through unchanged, file descriptors included, after the checks of `validate.rs`
//! (a failed check ends the connection with an `InvalidData` error naming the cause). The
//! frontend direction also watches the backend's fault eventfd (`sigbus.rs`): guest memory that
//! vanished under the backend ends the connection the same way. Only the control path goes
//! through here; frames move through shared memory and eventfds.
//!
//! A `SET_VRING_CALL` for a ring that already runs is followed by one notification on the new
//! call eventfd, once the daemon installed it (see [`CallResignal`]): what the ring used before
//! may have been signalled on the old one, which nobody reads any more.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::mem::{size_of, zeroed};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

use crate::handover::{sendmsg_fds, take_scm_rights};
use crate::validate::Checker;

const HDR: usize = 12;
/// Larger messages are refused (the backend caps messages far below this).
const MAX_PAYLOAD: usize = 1 << 20;
const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ENABLE: u32 = 18;
const SET_LOG_FD: u32 = 7;
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_ADDR: u32 = 9;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
const MAX_FDS: usize = 32;

/// One vhost-user message with the fds that came with it.
struct Msg {
    bytes: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn field(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.bytes[at], self.bytes[at + 1], self.bytes[at + 2], self.bytes[at + 3]])
    }
    fn request(&self) -> u32 {
        self.field(0)
    }
    fn flags(&self) -> u32 {
        self.field(4)
    }
}

/// Read one message; `Ok(None)` on a clean end of stream.
fn read_msg(sock: &mut UnixStream) -> io::Result<Option<Msg>> {
    let mut bytes = vec![0u8; HDR];
    let mut cbuf = [0u64; 32];
    let mut iov = libc::iovec { iov_base: bytes.as_mut_ptr().cast(), iov_len: HDR };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 32]>();
    // SAFETY: msg points to valid buffers of the declared sizes for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: msg was just filled by a successful recvmsg and its control buffer is alive.
    let fds = unsafe { take_scm_rights(&msg) };
    if n == 0 {
        return Ok(None);
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many fds in one message"));
    }
    sock.read_exact(&mut bytes[n as usize..])?;
    let size = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("message payload of {size} bytes")));
    }
    bytes.resize(HDR + size, 0);
    sock.read_exact(&mut bytes[HDR..])?;
    Ok(Some(Msg { bytes, fds }))
}

fn write_msg(sock: &UnixStream, m: &Msg) -> io::Result<()> {
    if m.fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many fds"));
    }
    let raw: Vec<RawFd> = m.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let n = sendmsg_fds(sock.as_raw_fd(), &m.bytes, &raw)?;
    // The rest of a partially sent message goes without fds (they went with the first byte).
    (&*sock).write_all(&m.bytes[n..])
}

/// Wait until `sock` is readable; an error when `fault` fires first.
fn wait_readable(sock: &UnixStream, fault: &EventFd) -> io::Result<()> {
    let mut fds = [
        libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: fault.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: fds is a valid array of two pollfds for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "guest memory shrank under the backend's mapping (SIGBUS caught): \
                 the frontend truncated a memory file after SET_MEM_TABLE",
            ));
        }
        if fds[0].revents != 0 {
            return Ok(());
        }
    }
}

/// Where the relay hands the eventfd of a `SET_LOG_FD` (checked to be one).
pub type LogFdSink = Box<dyn Fn(EventFd) + Send>;

/// Ack `m` to the frontend (success) when it asked for a reply.
fn ack(frontend: &UnixStream, m: &Msg) -> io::Result<()> {
    if m.flags() & FLAG_NEED_REPLY == 0 {
        return Ok(());
    }
    let mut reply = Vec::with_capacity(HDR + 8);
    reply.extend(m.request().to_le_bytes());
    reply.extend((0x1 | FLAG_REPLY).to_le_bytes());
    reply.extend(8u32.to_le_bytes());
    reply.extend(0u64.to_le_bytes());
    write_msg(frontend, &Msg { bytes: reply, fds: Vec::new() })
}

/// The ring index of a message whose payload starts with it (u32; the kick fd's u64 keeps it in
/// its low 8 bits).
fn ring_index(m: &Msg) -> Option<u32> {
    let mask = if matches!(m.request(), SET_VRING_KICK | SET_VRING_CALL) { 0xff } else { u32::MAX };
    (m.bytes.len() >= HDR + 4).then(|| m.field(HDR) & mask)
}

/// The eventfd to signal once the daemon acked a `SET_VRING_CALL`, and whether the frontend
/// asked for that ack itself (else the relay asked and the ack stays here).
struct PendingCall {
    call: Option<EventFd>,
    frontend_asked: bool,
}

/// Notifications that must not be lost when the frontend replaces a running ring's call eventfd.
///
/// QEMU starts a ring on a migration's destination (and whenever it starts the device) with
/// `SET_VRING_KICK` and only then sends `SET_VRING_CALL` with its real guest notifier; until
/// then the ring's call eventfd is the one QEMU installed when it set the device up (its "masked
/// notifier", which it never reads for a device without MSI-X). A ring that is enabled already
/// (QEMU's `SET_VRING_ENABLE` came before) runs from the kick on: frames waiting on the port go
/// into the guest at once and their notification goes to that stale eventfd. With
/// `VIRTIO_RING_F_EVENT_IDX` the guest's `used_event` then stays where it was, no later used
/// element passes it again, and the guest never hears of its RX ring: it answers nothing.
///
/// So the relay signals the new call eventfd of a started ring once, after the daemon installed
/// it: it forwards the message with `NEED_REPLY` (with `REPLY_ACK` negotiated) and the
/// frontend-bound direction signals on that ack (dropping it unless the frontend asked for it).
/// vhost-user-backend swaps the call eventfd under the vring's lock, which the worker holds
/// while it signals, so every earlier notification went to the old eventfd and every later one
/// goes to the new one. (libvhost-user signals each new call eventfd the same way.) A spurious
/// notification costs the guest one interrupt that finds nothing.
#[derive(Default)]
struct CallResignal {
    /// Acks of `SET_VRING_CALL` the daemon owes, in order.
    pending: Arc<Mutex<VecDeque<PendingCall>>>,
    /// `GET_FEATURES` seen (vhost's handler enables acks only after it offered the features).
    features_read: bool,
    /// `REPLY_ACK` acked in `SET_PROTOCOL_FEATURES`.
    reply_ack: bool,
}

impl CallResignal {
    fn track(&mut self, m: &Msg) {
        match m.request() {
            GET_FEATURES => self.features_read = true,
            SET_PROTOCOL_FEATURES if m.bytes.len() >= HDR + 8 => {
                self.reply_ack = m.field(HDR) as u64 & PROTOCOL_F_REPLY_ACK != 0;
            }
            _ => {}
        }
    }

    /// Forward `m`, a `SET_VRING_CALL`; `running`: its ring runs.
    fn forward(&self, mut m: Msg, running: bool, to: &UnixStream) -> io::Result<()> {
        let frontend_asked = m.flags() & FLAG_NEED_REPLY != 0;
        let call = match m.fds.first() {
            // SAFETY: a fresh duplicate that nobody else owns; EventFd takes it over. The checker
            // made sure it is an eventfd and made it non-blocking (a full one cannot block us).
            Some(fd) if running => Some(unsafe { EventFd::from_raw_fd(fd.try_clone()?.into_raw_fd()) }),
            _ => None,
        };
        if !(self.features_read && self.reply_ack) {
            // No acks to wait for (no frontend this backend met does this): signal right after.
            write_msg(to, &m)?;
            if let Some(c) = call {
                signal(&c, ring_index(&m));
            }
            return Ok(());
        }
        if call.is_none() && !frontend_asked {
            return write_msg(to, &m);
        }
        if !frontend_asked {
            let flags = m.flags() | FLAG_NEED_REPLY;
            m.bytes[4..8].copy_from_slice(&flags.to_le_bytes());
        }
        lock(&self.pending).push_back(PendingCall { call, frontend_asked });
        write_msg(to, &m)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn signal(call: &EventFd, ring: Option<u32>) {
    match call.write(1) {
        Ok(()) => log::debug!("ring {}: new call eventfd signalled once", ring.unwrap_or(0)),
        Err(e) => log::warn!("ring {}: signal the new call eventfd: {e}", ring.unwrap_or(0)),
    }
}

/// Rings as the relay saw them configured: what `SET_VRING_ADDR` on a running ring may skip.
#[derive(Default)]
struct Rings {
    /// Descriptor, used and avail addresses last sent for a ring.
    addrs: std::collections::HashMap<u32, [u8; 24]>,
    /// Rings started (kick fd set) and not stopped (`GET_VRING_BASE`) since.
    running: std::collections::HashSet<u32>,
}

impl Rings {
    /// True when `m` (a `SET_VRING_ADDR`) repeats the addresses of a running ring, as QEMU does
    /// to switch the ring's `VHOST_VRING_F_LOG` flag when a migration starts or ends. Such a
    /// message must not reach vhost-user-backend 0.24: its `set_vring_addr` re-reads the used
    /// index from guest memory and resets the queue's next used index to it, unlocked between
    /// the two, so a worker adding used elements in between would see them rolled back (used
    /// entries written twice, the used index going backwards). The backend logs by guest
    /// physical page and needs neither the flag nor the log address.
    fn same_addr_on_running_ring(&mut self, m: &Msg) -> bool {
        let (Some(index), Some(a)) = (ring_index(m), m.bytes.get(HDR + 8..HDR + 32)) else { return false };
        let mut addrs = [0u8; 24];
        addrs.copy_from_slice(a);
        let same = self.running.contains(&index) && self.addrs.get(&index) == Some(&addrs);
        self.addrs.insert(index, addrs);
        same
    }

    fn track(&mut self, m: &Msg) {
        match (m.request(), ring_index(m)) {
            (SET_VRING_KICK, Some(i)) => {
                self.running.insert(i);
            }
            (GET_VRING_BASE, Some(i)) => {
                self.running.remove(&i);
            }
            // The same frontend addresses may mean other guest addresses now.
            (SET_MEM_TABLE | ADD_MEM_REG | REM_MEM_REG, _) => self.addrs.clear(),
            _ => {}
        }
    }
}

/// Relay frontend -> backend, holding early `SET_VRING_ENABLE`s as described in the module docs.
/// `SET_LOG_FD` is answered here (vhost-user-backend 0.24 refuses it and ends the connection):
/// its eventfd goes to `log_fd`. `SET_VRING_ADDR` repeating a running ring's addresses is acked
/// here and not passed on (see [`Rings::same_addr_on_running_ring`]).
fn forward(
    from: &mut UnixStream,
    to: &UnixStream,
    fault: &EventFd,
    log_fd: &LogFdSink,
    calls: &mut CallResignal,
) -> io::Result<()> {
    let mut protocol_acked = false;
    let mut held: Vec<Msg> = Vec::new();
    let mut checker = Checker::default();
    let mut rings = Rings::default();
    loop {
        wait_readable(from, fault)?;
        let Some(mut m) = read_msg(from)? else { return Ok(()) };
        checker.check(&m.bytes, &m.fds)?;
        if log::log_enabled!(log::Level::Debug) {
            let payload: Vec<u32> = (HDR..m.bytes.len().min(HDR + 16))
                .step_by(4)
                .filter(|&at| at + 4 <= m.bytes.len())
                .map(|at| m.field(at))
                .collect();
            log::debug!(
                "frontend message {} flags {:#x} payload {:?} fds {}",
                m.request(),
                m.flags(),
                payload,
                m.fds.len()
            );
        }
        rings.track(&m);
        calls.track(&m);
        match m.request() {
            SET_VRING_CALL => {
                let running = ring_index(&m).is_some_and(|i| rings.running.contains(&i));
                calls.forward(m, running, to)?;
            }
            SET_VRING_ADDR if rings.same_addr_on_running_ring(&m) => {
                let log_flag = m.bytes.get(HDR + 4).is_some_and(|f| f & 1 != 0);
                log::info!(
                    "ring {}: SET_VRING_ADDR with the running ring's addresses (VHOST_VRING_F_LOG {}): \
                     not passed on (the rings' state stays)",
                    ring_index(&m).unwrap_or(0),
                    if log_flag { "on" } else { "off" }
                );
                ack(from, &m)?;
            }
            SET_LOG_FD => {
                // The checker made sure there is exactly one fd and that it is an eventfd.
                let Some(fd) = m.fds.pop() else {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "SET_LOG_FD without an fd"));
                };
                // SAFETY: `fd` is an open eventfd (checked) that we own; EventFd takes it over.
                log_fd(unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) });
                log::info!("frontend set the log eventfd");
                ack(from, &m)?;
            }
            SET_VRING_ENABLE if !protocol_acked => {
                log::debug!("holding SET_VRING_ENABLE sent before protocol features were acked");
                if m.flags() & FLAG_NEED_REPLY != 0 {
                    ack(from, &m)?;
                    let flags = m.flags() & !FLAG_NEED_REPLY;
                    m.bytes[4..8].copy_from_slice(&flags.to_le_bytes());
                }
                held.push(m);
            }
            SET_FEATURES if m.bytes.len() >= HDR + 8 => {
                let mut f = [0u8; 8];
                f.copy_from_slice(&m.bytes[HDR..HDR + 8]);
                protocol_acked = u64::from_le_bytes(f) & F_PROTOCOL_FEATURES != 0;
                write_msg(to, &m)?;
                if protocol_acked {
                    for h in held.drain(..) {
                        write_msg(to, &h)?;
                    }
                }
            }
            _ => write_msg(to, &m)?,
        }
    }
}

/// Relay backend -> frontend unchanged, but for the acks of `SET_VRING_CALL`: each signals the
/// call eventfd [`CallResignal`] kept for it, and goes on only when the frontend asked for it.
fn backward(from: &mut UnixStream, to: &UnixStream, pending: &Mutex<VecDeque<PendingCall>>) -> io::Result<()> {
    while let Some(m) = read_msg(from)? {
        if m.request() == SET_VRING_CALL && m.flags() & FLAG_REPLY != 0 {
            if let Some(p) = lock(pending).pop_front() {
                if let Some(c) = &p.call {
                    signal(c, None);
                }
                if !p.frontend_asked {
                    continue;
                }
            }
        }
        write_msg(to, &m)?;
    }
    Ok(())
}

/// Start relaying between a frontend connection and a connection to the daemon; `fault` is the
/// backend's guest memory fault eventfd. Both sockets are shut down when either side ends; join
/// the returned threads after that: each returns why its direction ended (`InvalidData`: the
/// frontend was refused).
pub fn spawn(
    frontend: UnixStream,
    backend: UnixStream,
    fault: EventFd,
    log_fd: LogFdSink,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let (f2, b2) = (frontend.try_clone()?, backend.try_clone()?);
    let end = |a: &UnixStream, b: &UnixStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    let spawn = |name: &str, f: Box<dyn FnOnce() -> io::Result<()> + Send>| {
        std::thread::Builder::new().name(name.into()).spawn(f)
    };
    let mut calls = CallResignal::default();
    let pending = calls.pending.clone();
    let (mut from, to) = (frontend, backend);
    let inbound = spawn(
        "vu-relay-in",
        Box::new(move || {
            let r = forward(&mut from, &to, &fault, &log_fd, &mut calls);
            end(&from, &to);
            r
        }),
    )?;
    let (mut from, to) = (b2, f2);
    let outbound = spawn(
        "vu-relay-out",
        Box::new(move || {
            let r = backward(&mut from, &to, &pending);
            end(&from, &to);
            r
        }),
    )?;
    Ok(vec![inbound, outbound])
}
