//! Confinement of a backend the agent runs for one VM (the guest is untrusted; a backend it
//! compromises must not reach other VMs or the node):
//!
//! - [`drop_privileges`] (`--run-as UID:GID`, the agent starts the backend as root): empties
//!   the capability bounding set, drops supplementary groups, switches real/effective/saved
//!   ids to the VM's own uid and gid, and clears every capability set (ambient, inheritable,
//!   permitted, effective). Done first thing, before the fd handover, so the agent sees the
//!   VM's uid as the peer (`SO_PEERCRED`).
//! - [`lock_down`]: `no_new_privs` and non-dumpable (no ptrace by the same uid, no core dumps
//!   of guest memory, `/proc/<pid>` files owned by root). The agent supervises by pid file,
//!   pidfd and `/proc/<pid>/cmdline`, none of which needs the process dumpable.
//! - [`grant_frontend`]: the vhost-user socket is the backend's (0600) plus a POSIX ACL entry
//!   for the frontend's uid only (KubeVirt's qemu, 107). No group is shared between backends.
//! - [`install_seccomp`]: an allow list (below) installed on every thread once the ports, the
//!   metrics listener and the vhost-user listener exist, before any frontend is served. Any
//!   other syscall kills the process (`SECCOMP_RET_KILL_PROCESS`); the agent restarts it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn prctl(op: libc::c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    check(unsafe { libc::prctl(op, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Clear the effective, permitted and inheritable capability sets of this thread.
fn clear_caps() -> io::Result<()> {
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads a v3 header and two data structs, both valid for the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) as libc::c_int })
}

/// Whether this thread's effective, permitted and inheritable sets are all empty.
pub fn caps_empty() -> io::Result<bool> {
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs into `data`, which holds two.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) as libc::c_int })?;
    Ok(data.iter().all(|d| d.effective == 0 && d.permitted == 0 && d.inheritable == 0))
}

/// Become `uid:gid` with no capabilities at all (see the module docs). Needs root.
pub fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    // The bounding set: every capability up to the kernel's last (EINVAL past it).
    for cap in 0..64 {
        match prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(ctx("drop capability bounding set", e)),
        }
    }
    // SAFETY: setgroups with a zero count reads no memory.
    check(unsafe { libc::setgroups(0, std::ptr::null()) }).map_err(|e| ctx("setgroups", e))?;
    // SAFETY: plain integer arguments.
    check(unsafe { libc::setresgid(gid, gid, gid) }).map_err(|e| ctx("setresgid", e))?;
    // SAFETY: plain integer arguments.
    check(unsafe { libc::setresuid(uid, uid, uid) }).map_err(|e| ctx("setresuid", e))?;
    prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong)
        .map_err(|e| ctx("clear ambient", e))?;
    clear_caps().map_err(|e| ctx("capset", e))?;
    // SAFETY: getresuid writes three ids into the locals.
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: the pointers are to live locals.
    check(unsafe { libc::getresuid(&mut r, &mut e, &mut s) })?;
    if (r, e, s) != (uid, uid, uid) || !caps_empty()? {
        return Err(io::Error::other(format!("privileges not dropped: uids {r}/{e}/{s}, want {uid}")));
    }
    Ok(())
}

/// `no_new_privs`, not dumpable, no ambient capabilities, and a private umask.
pub fn lock_down() -> io::Result<()> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    prctl(libc::PR_SET_DUMPABLE, 0)?;
    // Ambient capabilities need the permitted and inheritable ones; clearing is always allowed.
    prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong)?;
    private_umask();
    Ok(())
}

/// Files and sockets the process creates are its user's alone.
pub fn private_umask() {
    // SAFETY: umask only changes the process's file mode mask.
    unsafe { libc::umask(0o077) };
}

/// Give the socket at `path` (just bound, as root) to `uid:gid`, and with `frontend` the
/// frontend's access ACL; neither follows a symbolic link at `path` (`lchown`, `lsetxattr`).
pub fn give_socket(path: &Path, uid: u32, gid: u32, frontend: Option<u32>) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .map_err(|e| io::Error::new(e.kind(), format!("chown {} to {uid}:{gid}: {e}", path.display())))?;
    match frontend {
        Some(f) => grant_frontend(path, f),
        None => Ok(()),
    }
}

/// Let `uid` (the frontend's user) connect to the socket at `path`: mode 0600 plus an access
/// ACL `user:<uid>:rw-` (mask `rw-`), set on `path` itself, never through a link. Needs a filesystem with POSIX ACLs (ext4, xfs, tmpfs).
pub fn grant_frontend(path: &Path, uid: u32) -> io::Result<()> {
    const UNDEFINED: u32 = u32::MAX;
    // struct posix_acl_xattr_header + entries {tag u16, perm u16, id u32}, sorted by tag.
    let entries: [(u16, u16, u32); 5] = [
        (0x01, 6, UNDEFINED), // USER_OBJ rw
        (0x02, 6, uid),       // USER uid rw
        (0x04, 0, UNDEFINED), // GROUP_OBJ ---
        (0x10, 6, UNDEFINED), // MASK rw
        (0x20, 0, UNDEFINED), // OTHER ---
    ];
    let mut buf = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        buf.extend_from_slice(&tag.to_le_bytes());
        buf.extend_from_slice(&perm.to_le_bytes());
        buf.extend_from_slice(&id.to_le_bytes());
    }
    let p = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: NUL-terminated path and name, buffer valid for its length.
    check(unsafe {
        libc::lsetxattr(p.as_ptr(), c"system.posix_acl_access".as_ptr(), buf.as_ptr().cast(), buf.len(), 0)
    })
    .map_err(|e| io::Error::new(e.kind(), format!("grant uid {uid} access to {}: {e}", path.display())))
}

/// Syscalls the backend makes once it serves a frontend: what `strace -f` saw the binary do
/// under `tests/hostile_frontend.rs` and `tests/metrics.rs` (filter in log mode), the AF_XDP
/// calls of `tests/xsk_netns.rs` (kick `sendto`, `recvfrom`, `poll`, `getsockopt`), and what
/// exiting, sleeping and panicking need. `socket`, `clone` and `prctl` are argument-checked in
/// [`filter`]; `clone3` fails with ENOSYS (its flags are in memory, where seccomp cannot look)
/// and glibc falls back to `clone`.
const ALLOWED: &[libc::c_long] = &[
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_connect,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_eventfd2,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_listen,
    libc::SYS_lseek,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_read,
    libc::SYS_readlink,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_set_robust_list,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_shutdown,
    libc::SYS_sigaltstack,
    libc::SYS_statx,
    libc::SYS_tgkill,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_write,
    libc::SYS_writev,
];

/// Namespace flags a thread-creating `clone` must not carry.
const CLONE_NS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

fn rule(arg: u8, op: SeccompCmpOp, val: u64) -> Result<SeccompRule, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, val)
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(|e| e.to_string())
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, String> {
    let arch = std::env::consts::ARCH.try_into().map_err(|e: seccompiler::BackendError| e.to_string())?;
    let f = SeccompFilter::new(rules, mismatch, matched, arch).map_err(|e| e.to_string())?;
    f.try_into().map_err(|e: seccompiler::BackendError| e.to_string())
}

/// The backend's seccomp filters: [`ALLOWED`] plus `socket(AF_UNIX, ..)`, `clone` without
/// namespace flags and `prctl(PR_SET_NAME, ..)`; anything else kills the process. The other
/// filter makes `clone3` and `openat` fail with ENOSYS (the kernel applies the stricter verdict
/// of both).
pub fn filter() -> Result<[BpfProgram; 2], String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED.iter().map(|&s| (s, vec![])).collect();
    rules.insert(libc::SYS_socket, vec![rule(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?]);
    rules.insert(libc::SYS_clone, vec![rule(0, SeccompCmpOp::MaskedEq(CLONE_NS), 0)?]);
    rules.insert(libc::SYS_prctl, vec![rule(0, SeccompCmpOp::Eq, libc::PR_SET_NAME as u64)?]);
    rules.insert(libc::SYS_clone3, vec![]);
    rules.insert(libc::SYS_openat, vec![]);
    let main = compile(rules, SeccompAction::KillProcess, SeccompAction::Allow)?;
    // openat fails with ENOSYS instead of killing: glibc's malloc opens
    // /proc/sys/vm/overcommit_memory the first time it shrinks a thread's heap (after the
    // RX coalescer freed large segments), and copes with the open failing.
    let clone3 = compile(
        BTreeMap::from([(libc::SYS_clone3, vec![]), (libc::SYS_openat, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    // The clone3 filter goes first: once the main one is in, seccomp() itself is refused.
    Ok([clone3, main])
}

/// Install [`filter`] on every thread of the process (TSYNC); also sets `no_new_privs`.
pub fn install_seccomp() -> io::Result<()> {
    for prog in filter().map_err(io::Error::other)? {
        seccompiler::apply_filter_all_threads(&prog)
            .map_err(|e| io::Error::other(format!("install seccomp filter: {e}")))?;
    }
    Ok(())
}

/// The `Seccomp:` mode of this process from `/proc/self/status` (2: filter).
pub fn seccomp_mode() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fork, run `f` in the child (no allocation: the filter is compiled before), return how
    /// the child ended: Ok(exit code) or Err(signal).
    fn in_child(progs: &[BpfProgram; 2], f: fn() -> i32) -> Result<i32, i32> {
        // SAFETY: the child only applies a ready filter, makes raw syscalls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = match progs.iter().try_for_each(|p| seccompiler::apply_filter(p)) {
                Ok(()) => f(),
                Err(_) => 99,
            };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, status is a live local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            Ok(libc::WEXITSTATUS(status))
        }
    }

    #[test]
    fn forbidden_syscalls_kill_the_process() {
        let prog = filter().unwrap();
        // Allowed: a unix socket, getpid, eventfd, a thread (clone3 refused, clone used).
        let ok = in_child(&prog, || {
            // SAFETY: raw syscalls with integer arguments.
            let bad = unsafe {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let ev = libc::eventfd(0, 0);
                fd < 0 || ev < 0 || libc::getpid() <= 0
            };
            let t = std::thread::spawn(|| 7).join();
            i32::from(bad) + 2 * i32::from(t.ok() != Some(7))
        });
        assert_eq!(ok, Ok(0), "allowed syscalls");
        // Forbidden: an IP socket (argument filter), ptrace, execve, unshare.
        for (name, f) in [
            (
                "socket(AF_INET)",
                (|| {
                    // SAFETY: raw syscall with integer arguments.
                    unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
                    0
                }) as fn() -> i32,
            ),
            ("ptrace", || {
                // SAFETY: raw syscall with integer arguments.
                unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
                0
            }),
            ("clone(CLONE_NEWUSER)", || {
                // SAFETY: raw clone with a namespace flag and no stack; never returns in a child.
                unsafe { libc::syscall(libc::SYS_clone, libc::CLONE_NEWUSER | libc::SIGCHLD, 0, 0, 0, 0) };
                0
            }),
            ("unshare", || {
                // SAFETY: raw syscall with an integer argument.
                unsafe { libc::unshare(libc::CLONE_NEWUSER) };
                0
            }),
            ("execve", || {
                let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
                // SAFETY: NUL-terminated path and NULL-terminated argv/envp.
                unsafe { libc::execve(c"/bin/true".as_ptr(), argv.as_ptr(), [std::ptr::null()].as_ptr()) };
                0
            }),
        ] {
            assert_eq!(in_child(&prog, f), Err(libc::SIGSYS), "{name} must kill the process");
        }
    }

    #[test]
    fn frontend_acl_admits_only_the_frontend() {
        // SAFETY: geteuid has no arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (switches uid in a child)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("lk-acl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s");
        std::fs::write(&f, b"").unwrap();
        grant_frontend(&f, 107).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        let path = CString::new(f.as_os_str().as_bytes()).unwrap();
        let open_as = |uid: u32| -> i32 {
            // SAFETY: the child switches uid, opens a NUL-terminated path and _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: see above.
                unsafe {
                    let ok = libc::setresuid(uid, uid, uid) == 0 && libc::open(path.as_ptr(), libc::O_RDWR) >= 0;
                    libc::_exit(i32::from(!ok));
                }
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            libc::WEXITSTATUS(status)
        };
        let (qemu, other) = (open_as(107), open_as(108));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(mode, 0o660, "mode follows the ACL mask");
        assert_eq!(qemu, 0, "uid 107 may open the socket");
        assert_eq!(other, 1, "uid 108 may not");
    }
}
