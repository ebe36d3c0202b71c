//! The backend against a hostile or broken vhost-user frontend (issue 16). The frontend is
//! hand-written (`hostile/mod.rs`: raw messages, SCM_RIGHTS, memfd memory, split rings) and the
//! backend is the `lanekit-vhost` binary in loopback mode in a child process, so a SIGBUS is an
//! exit status, a wedge a reply that never comes (bounded by timeouts) and a leak a count in
//! /proc/PID. After every case a well-behaved frontend must still get a frame through the
//! device and back (`serve_check`). No root needed.

mod hostile;

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use hostile::*;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// A pipe (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Messages the backend must refuse (error status or closed connection), each on a fresh
/// connection after a normal handshake.
#[test]
fn malformed_messages_are_refused() {
    let mut b = Backend::start("malformed");
    let (pr, _pw) = pipe();
    let big = 0xffff_ffffu32.to_le_bytes();
    let cases: Vec<(&str, Vec<u8>, Vec<i32>)> = vec![
        (
            "version 0 header",
            [&SET_VRING_NUM.to_le_bytes()[..], &[8, 0, 0, 0], &8u32.to_le_bytes(), &state(0, 64)].concat(),
            vec![],
        ),
        ("version 3 header", [GET_FEATURES.to_le_bytes(), [3 | 8, 0, 0, 0], [0; 4]].concat(), vec![]),
        ("unknown request", msg(999, NEED_REPLY, &[]), vec![]),
        ("size field of 4 GiB", [SET_VRING_NUM.to_le_bytes(), [1 | 8, 0, 0, 0], big].concat(), vec![]),
        ("SET_VRING_NUM with a short payload", msg(SET_VRING_NUM, NEED_REPLY, &[0, 0, 0, 0]), vec![]),
        ("SET_VRING_NUM for a queue that does not exist", msg(SET_VRING_NUM, NEED_REPLY, &state(77, 64)), vec![]),
        ("SET_VRING_NUM of 0", msg(SET_VRING_NUM, NEED_REPLY, &state(0, 0)), vec![]),
        ("SET_VRING_NUM above the maximum", msg(SET_VRING_NUM, NEED_REPLY, &state(0, 4096)), vec![]),
        ("SET_VRING_NUM of 100, not a power of two", msg(SET_VRING_NUM, NEED_REPLY, &state(0, 100)), vec![]),
        ("GET_FEATURES with an fd attached", msg(GET_FEATURES, 0, &[]), vec![pr.as_raw_fd()]),
        ("SET_VRING_KICK for vring 200", msg(SET_VRING_KICK, NEED_REPLY, &u64s(&[200])), vec![pr.as_raw_fd()]),
        (
            "SET_VRING_ADDR before SET_MEM_TABLE",
            msg(SET_VRING_ADDR, NEED_REPLY, &Guest::vring_addr(0, 0, 0, 0)),
            vec![],
        ),
        ("GET_VRING_BASE for a queue that does not exist", msg(GET_VRING_BASE, 0, &state(9, 0)), vec![]),
        ("SET_FEATURES with features never offered", msg(SET_FEATURES, NEED_REPLY, &u64s(&[u64::MAX])), vec![]),
        (
            "SET_MEM_TABLE with 9 regions",
            msg(SET_MEM_TABLE, NEED_REPLY, &mem_table(&[Region::whole(MEM_SIZE); 9])),
            vec![],
        ),
        (
            "SET_MEM_TABLE whose count disagrees with its size",
            {
                let mut p = mem_table(&[Region::whole(MEM_SIZE)]);
                p[0] = 3;
                msg(SET_MEM_TABLE, NEED_REPLY, &p)
            },
            vec![],
        ),
        ("SET_MEM_TABLE without fds", msg(SET_MEM_TABLE, NEED_REPLY, &mem_table(&[Region::whole(MEM_SIZE)])), vec![]),
    ];
    for (case, bytes, fds) in cases {
        let mut c = Conn::connect(&b);
        c.handshake();
        c.send_raw(&bytes, &fds).unwrap();
        match c.recv() {
            Outcome::Hung => panic!("{case}: no answer and the connection stays open"),
            Outcome::Closed => {}
            // The vring-num checks may answer with an error status first; the others must not
            // be acked.
            o => assert!(o.is_refusal() || case.starts_with("GET_VRING_BASE"), "{case}: accepted ({o:?})"),
        }
        drop(c);
        serve_check(&mut b, case);
    }
    // A message cut short by the frontend going away.
    let c = Conn::connect(&b);
    c.send_raw(&msg(SET_MEM_TABLE, 0, &mem_table(&[Region::whole(MEM_SIZE)]))[..20], &[]).unwrap();
    drop(c);
    serve_check(&mut b, "truncated message");
}

/// Memory tables the backend must refuse; mapping any of them (or reading through them) must
/// not crash it.
#[test]
fn bad_memory_tables_are_refused() {
    let mut b = Backend::start("memtable");
    let m = MEM_SIZE;
    let r = Region::whole(m);
    let cases: Vec<(&str, Vec<Region>)> = vec![
        ("no regions", vec![]),
        ("a region of size 0", vec![Region { size: 0, ..r }]),
        ("a region larger than its file", vec![Region { size: 4 * m, ..r }]),
        ("a region past the end of its file", vec![Region { offset: m, ..r }]),
        ("an mmap offset that overflows", vec![Region { offset: u64::MAX - 0xfff, ..r }]),
        ("a guest address range that overflows", vec![Region { gpa: u64::MAX - 0xfff, ..r }]),
        ("a user address range that overflows", vec![Region { uaddr: u64::MAX - 0xfff, ..r }]),
        ("overlapping guest ranges", vec![r, Region { uaddr: UADDR + 2 * m, ..r }]),
        ("a size that does not fit the address space", vec![Region { size: 1 << 62, ..r }]),
    ];
    for (case, regions) in cases {
        let mut g = Guest::new(&b, false);
        let o = g.set_mem_table(&regions);
        if !o.is_refusal() {
            // Accepted: make the backend read through it (ring 0 at the region's far end).
            let far = UADDR + regions.first().map_or(0, |r| r.size.saturating_sub(0x1000));
            let _ = g.conn.ack(SET_VRING_NUM, &state(0, 64), &[]);
            let _ = g.conn.ack(SET_VRING_ADDR, &Guest::vring_addr(0, far, far + 0x800, far + 0x400), &[]);
        }
        drop(g);
        b.assert_alive(case);
        assert!(o.is_refusal(), "{case}: accepted ({o:?})");
        serve_check(&mut b, case);
    }
    // A region fd that cannot be mapped.
    let mut g = Guest::new(&b, false);
    let (pr, _pw) = pipe();
    let o = g.conn.ack(SET_MEM_TABLE, &mem_table(&[r]), &[pr.as_raw_fd()]);
    assert!(o.is_refusal(), "a pipe as guest memory: {o:?}");
    drop(g);
    serve_check(&mut b, "pipe as memory");
}

/// A memory region declared larger than the file behind it, with a vring (or a TX buffer)
/// placed past the end of the file: touching it would be SIGBUS. It must be refused when the
/// table arrives.
#[test]
fn region_larger_than_its_file_is_refused_before_anything_touches_it() {
    let mut b = Backend::start("sigbus-declared");
    // The file has 4 MiB; the region claims 16 MiB. Rings sit in the first MiB.
    for case in ["vring past the end of the file", "TX buffer past the end of the file"] {
        let mut g = Guest::new(&b, false);
        let o = g.set_mem_table(&[Region::whole(4 * MEM_SIZE)]);
        if !o.is_refusal() {
            if case.starts_with("vring") {
                let far = UADDR + 2 * MEM_SIZE;
                let _ = g.conn.ack(SET_VRING_NUM, &state(0, 64), &[]);
                let _ = g.conn.ack(SET_VRING_ADDR, &Guest::vring_addr(0, far, far + 0x800, far + 0x400), &[]);
            } else {
                for q in 0..NQ {
                    let _ = g.ring(q);
                    let (call, kick) = (g.calls[q].as_raw_fd(), g.kicks[q].as_raw_fd());
                    let _ = g.ring_fds(q, call, kick);
                }
                g.chain(TX, &[(2 * MEM_SIZE, 1000, false)]);
                g.kick(TX);
                let _ = g.stop();
            }
        }
        drop(g);
        b.assert_alive(case);
        assert!(o.is_refusal(), "{case}: SET_MEM_TABLE accepted a region larger than its file ({o:?})");
        serve_check(&mut b, case);
    }
}

/// The frontend shrinks its (unsealed) memfd after SET_MEM_TABLE and makes the backend touch
/// the lost pages: the backend survives, drops that frontend, and serves the next one.
#[test]
fn memfd_shrunk_after_set_mem_table_fails_only_that_device() {
    let mut b = Backend::start("sigbus-shrink");
    for (n, (case, keep)) in
        [("buffers truncated away", 0x3_0000u64), ("rings truncated away", 0)].into_iter().enumerate()
    {
        let mut g = Guest::new(&b, false);
        g.setup();
        g.round_trip(1);
        // TX chain pointing at buffer memory, written while it still exists.
        let at = buf(TX, 10);
        g.mem.write_slice(&[0u8; 112], GuestAddress(at)).unwrap();
        if keep > 0 {
            g.file.set_len(keep).unwrap();
            // Only the rings (below `keep`) are touched from here on.
            g.chain(TX, &[(at, 112, false)]);
        } else {
            g.file.set_len(0).unwrap();
        }
        g.kick(TX);
        g.kick(RX);
        // The backend must end this connection (only this device fails) ...
        let o = g.conn.recv();
        assert_ne!(o, Outcome::Hung, "{case}: the backend kept a connection whose memory is gone");
        drop(g);
        b.assert_alive(case);
        // ... and say why.
        assert!(b.wait_log("guest memory shrank", n + 1), "{case}: no log line about guest memory:\n{}", b.log());
        serve_check(&mut b, case);
    }
}

/// Sealed memfds (QEMU's memory-backend-memfd default) cannot shrink: the fault cannot happen.
#[test]
fn sealed_guest_memory_cannot_shrink() {
    let f = memfd(MEM_SIZE, true);
    assert!(f.set_len(0x1000).is_err(), "F_SEAL_SHRINK must stop ftruncate");
}

/// Ring addresses that are not inside the memory table.
#[test]
fn vring_addresses_outside_memory_are_refused() {
    let mut b = Backend::start("vring-addr");
    let u = UADDR;
    let q = u64::from(QSIZE);
    let cases = [
        ("descriptor table outside every region", (u + 64 * MEM_SIZE, u + 0x800, u + 0x400)),
        ("used ring below the region", (u, u - 0x1000, u + 0x400)),
        ("avail ring at the null address", (u, u + 0x800, 0)),
        ("descriptor table straddling the end", (u + MEM_SIZE - 8 * q, u + 0x800, u + 0x400)),
        ("used ring straddling the end", (u, u + MEM_SIZE - 16, u + 0x400)),
        ("misaligned descriptor table", (u + 3, u + 0x800, u + 0x400)),
    ];
    for (case, (desc, used, avail)) in cases {
        let mut g = Guest::new(&b, false);
        assert!(g.set_mem_table(&[Region::whole(MEM_SIZE)]).is_ack());
        assert!(g.conn.ack(SET_VRING_NUM, &state(TX as u32, u32::from(QSIZE)), &[]).is_ack());
        let o = g.conn.ack(SET_VRING_ADDR, &Guest::vring_addr(TX, desc, used, avail), &[]);
        if !o.is_refusal() {
            // Accepted: start the ring and kick it.
            let (call, kick) = (g.calls[TX].as_raw_fd(), g.kicks[TX].as_raw_fd());
            let _ = g.ring_fds(TX, call, kick);
            g.kick(TX);
            assert_ne!(g.stop(), Outcome::Hung, "{case}");
        }
        drop(g);
        b.assert_alive(case);
        assert!(o.is_refusal(), "{case}: accepted ({o:?})");
        serve_check(&mut b, case);
    }
}

/// Descriptor chains built to loop, point outside the table or memory, or abuse indirect
/// tables: each is returned unused (or skipped) and the device keeps working on the same
/// connection.
#[test]
fn hostile_descriptor_chains_are_dropped() {
    let mut b = Backend::start("chains");
    let mut g = Guest::new(&b, false);
    g.setup();
    g.round_trip(0);
    let (n, w, ind) = (DESC_F_NEXT, DESC_F_WRITE, DESC_F_INDIRECT);
    let data = buf(TX, 40);
    let itab = buf(TX, 50);
    // (case, descriptors (index offset from head, addr, len, flags, next offset), indirect table)
    type D = (u64, u32, u16, u16);
    let cases: Vec<(&str, Vec<D>, Vec<D>)> = vec![
        ("descriptor pointing at itself", vec![(data, 100, n, 0)], vec![]),
        ("two descriptors in a cycle", vec![(data, 12, n, 1), (data + 12, 100, n, 0)], vec![]),
        ("next index past the table", vec![(data, 100, n, 500)], vec![]),
        ("address outside memory", vec![(64 * MEM_SIZE, 100, 0, 0)], vec![]),
        ("address + length wraps", vec![(u64::MAX - 4, 100, 0, 0)], vec![]),
        ("length of 4 GiB", vec![(data, u32::MAX, 0, 0)], vec![]),
        ("device-writable TX buffer", vec![(data, 112, w, 0)], vec![]),
        ("indirect table outside memory", vec![(64 * MEM_SIZE, 32, ind, 0)], vec![]),
        ("indirect table of 20 bytes", vec![(itab, 20, ind, 0)], vec![(data, 112, 0, 0)]),
        ("indirect table of 0 bytes", vec![(itab, 0, ind, 0)], vec![]),
        ("indirect with NEXT set", vec![(itab, 16, ind | n, 1), (data, 100, 0, 0)], vec![(data, 112, 0, 0)]),
        ("nested indirect table", vec![(itab, 32, ind, 0)], vec![(itab, 32, ind, 0), (data, 112, 0, 0)]),
        ("loop inside an indirect table", vec![(itab, 32, ind, 0)], vec![(data, 12, n, 1), (data, 100, n, 0)]),
        ("indirect next past its table", vec![(itab, 16, ind, 0)], vec![(data, 112, n, 7)]),
    ];
    for (case, descs, table) in cases {
        let used = g.used_idx(TX);
        let head = g.alloc(TX, descs.len() as u16);
        for (k, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let i = (head + k as u16) % QSIZE;
            let next = if next >= 500 { next } else { (head + next) % QSIZE };
            g.write_desc(TX, i, addr, len, flags, next);
        }
        for (k, &(addr, len, flags, next)) in table.iter().enumerate() {
            let at = itab + 16 * k as u64;
            g.mem.write_obj(addr, GuestAddress(at)).unwrap();
            g.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            g.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            g.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
        }
        // A header asking for checksum offload: any chain that does get parsed is dropped too,
        // so no stray frame comes back on RX.
        g.mem.write_slice(&[1u8; 112], GuestAddress(data)).unwrap();
        g.publish(TX, head);
        g.kick(TX);
        assert!(g.wait_used(TX, used.wrapping_add(1)), "{case}: chain not returned");
        b.assert_alive(case);
        g.round_trip(1);
    }
    // The same on RX: each bad receive chain comes back with length 0 and the frame goes into
    // the good buffer the guest posts after it (`round_trip`).
    let rxbuf = buf(RX, 60);
    let rx_cases: Vec<(&str, Vec<D>)> = vec![
        ("read-only RX buffer", vec![(rxbuf, 2048, 0, 0)]),
        ("RX buffer outside memory", vec![(64 * MEM_SIZE, 2048, w, 0)]),
        ("RX descriptor pointing at itself", vec![(rxbuf, 2048, w | n, 0)]),
        ("RX next index past the table", vec![(rxbuf, 100, w | n, 500)]),
        ("RX indirect table outside memory", vec![(64 * MEM_SIZE, 32, ind, 0)]),
    ];
    for (case, descs) in rx_cases {
        let used = g.used_idx(RX);
        let head = g.alloc(RX, descs.len() as u16);
        for (k, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let i = (head + k as u16) % QSIZE;
            let next = if next >= 500 { next } else { (head + next) % QSIZE };
            g.write_desc(RX, i, addr, len, flags, next);
        }
        g.publish(RX, head);
        g.round_trip(2);
        assert_eq!(g.used_elem(RX, used), (u32::from(head), 0), "{case}: returned unused");
        b.assert_alive(case);
    }
    // A head index past the descriptor table: there is nothing to return; the ring goes on.
    g.publish(TX, 1000);
    g.kick(TX);
    std::thread::sleep(std::time::Duration::from_millis(50));
    b.assert_alive("head index past the table");
    assert_ne!(g.stop(), Outcome::Hung);
    drop(g);
    serve_check(&mut b, "chains");
}

/// Kick and call fds that would block the backend: a pipe holding one byte as kick fd (a
/// blocking 8-byte read), other non-eventfd fds, and a blocking eventfd already at its maximum
/// count as call fd (a blocking write). The control socket must keep answering.
#[test]
fn kick_and_call_fds_cannot_wedge_the_backend() {
    let mut b = Backend::start("wedge");
    // Non-eventfd kick/call/err fds: refused with a clear error.
    for (case, req, why) in [
        ("pipe as kick fd", SET_VRING_KICK, "kick fd is not an eventfd (pipe:"),
        ("pipe as call fd", SET_VRING_CALL, "call fd is not an eventfd (pipe:"),
        ("pipe as err fd", SET_VRING_ERR, "err fd is not an eventfd (pipe:"),
    ] {
        let mut g = Guest::new(&b, false);
        assert!(g.set_mem_table(&[Region::whole(MEM_SIZE)]).is_ack());
        for q in 0..NQ {
            assert!(g.ring(q).is_ack());
        }
        let (pr, pw) = pipe();
        (&File::from(pw.try_clone().unwrap())).write_all(&[1]).unwrap();
        let o = g.conn.ack(req, &u64s(&[TX as u64]), &[pr.as_raw_fd()]);
        if !o.is_refusal() {
            // Accepted: finish the setup and have the backend read the kick.
            for q in 0..NQ {
                let (call, kick) = (g.calls[q].as_raw_fd(), g.kicks[q].as_raw_fd());
                let (call, kick) = match (q == TX, req) {
                    (true, SET_VRING_KICK) => (call, pr.as_raw_fd()),
                    (true, SET_VRING_CALL) => (pr.as_raw_fd(), kick),
                    _ => (call, kick),
                };
                let _ = g.ring_fds(q, call, kick);
            }
            g.chain(TX, &[(buf(TX, 3), 112, false)]);
            g.kick(TX);
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_ne!(g.stop(), Outcome::Hung, "{case}: GET_VRING_BASE got no reply (backend wedged)");
        }
        drop(g);
        b.assert_alive(case);
        assert!(o.is_refusal(), "{case}: accepted ({o:?})");
        assert!(b.wait_log(why, 1), "{case}: no clear error in the log:\n{}", b.log());
        serve_check(&mut b, case);
    }
    // A blocking call eventfd at its maximum count: signalling the guest would block forever.
    let mut g = Guest::new(&b, false);
    let full = EventFd::new(0).unwrap();
    full.write(u64::MAX - 1).unwrap();
    g.calls[TX] = full;
    g.setup();
    g.round_trip(3);
    g.round_trip(4);
    assert_ne!(g.stop(), Outcome::Hung, "call eventfd at max count: GET_VRING_BASE got no reply");
    assert!(b.wait_log("signal guest", 1), "the failed signal is logged:\n{}", b.log());
    drop(g);
    serve_check(&mut b, "call eventfd at its maximum count");
}

/// Frontends that go away mid-setup, again and again: nothing accumulates in the backend
/// (fds, threads, guest memory mappings, RSS).
#[test]
fn aborted_setups_leave_nothing_behind() {
    const CYCLES: usize = 20;
    let mut b = Backend::start("aborted");
    serve_check(&mut b, "warm-up");
    serve_check(&mut b, "warm-up 2");
    let base = settled_usage(&b);
    for i in 0..CYCLES {
        // After SET_MEM_TABLE.
        let mut g = Guest::new(&b, false);
        assert!(g.set_mem_table(&[Region::whole(MEM_SIZE)]).is_ack());
        drop(g);
        // After the rings are set up and kicked, with a chain in flight.
        let mut g = Guest::new(&b, i % 2 == 0);
        g.setup();
        g.chain(TX, &[(buf(TX, 1), 112, false)]);
        g.kick(TX);
        g.kick(RX);
        drop(g);
        // After a round trip, without GET_VRING_BASE.
        let mut g = Guest::new(&b, false);
        g.setup();
        g.round_trip(i as u8);
        drop(g);
        // In the middle of a message with fds attached.
        let g = Guest::new(&b, false);
        let bytes = msg(SET_MEM_TABLE, 0, &mem_table(&[Region::whole(MEM_SIZE)]));
        g.conn.send_raw(&bytes[..16], &[g.file.as_raw_fd()]).unwrap();
        drop(g);
        b.assert_alive("aborted setups");
    }
    // One more frontend after all of them, then everything must be back to the baseline.
    serve_check(&mut b, "after aborted setups");
    let after = b.assert_settles(base, 4096, &format!("{} aborted setups", 4 * CYCLES));
    println!("{} aborted setups: before {base:?}, after {after:?}", 4 * CYCLES);
}

/// Usage once the backend is idle (two equal readings in a row).
fn settled_usage(b: &Backend) -> Usage {
    let mut last = b.usage();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = b.usage();
        if (now.fds, now.threads, now.maps) == (last.fds, last.threads, last.maps) {
            return now;
        }
        last = now;
    }
    last
}

/// Live migration against the binary (seccomp on, loopback): bad dirty logs end the connection
/// with the reason in the backend's log and the backend serves the next frontend; a good log is
/// mapped, stays clean until `VHOST_F_LOG_ALL` is acked, and then gets the RX buffer and the used
/// rings the backend wrote.
#[test]
fn dirty_logs_bad_ones_refused_a_good_one_marked() {
    const SET_LOG_BASE: u32 = 6;
    const PF_LOG_SHMFD_REPLY_ACK: u64 = 1 << 1 | 1 << 3;
    const LOG_ALL: u64 = 1 << 26;
    let mut b = Backend::start("dirty-log");
    let base = settled_usage(&b);
    // One bit per 4 KiB page of the 4 MiB guest.
    let need = MEM_SIZE / 4096 / 8;
    let log_base = |size: u64| u64s(&[size, 0]);
    let cases: Vec<(&str, bool, File, u64, &str)> = vec![
        ("no LOG_SHMFD", false, memfd(4096, true), need, "VHOST_USER_PROTOCOL_F_LOG_SHMFD was not negotiated"),
        ("log too small", true, memfd(4096, true), need - 1, "(needs 128 bytes: one bit per 4 KiB page)"),
        ("log past its file", true, memfd(64, true), need, "past the end of the 0x40-byte log file"),
        ("unsealed log", true, memfd(4096, false), need, "not sealed against shrinking"),
    ];
    for (i, (case, shmfd, log, size, why)) in cases.into_iter().enumerate() {
        let mut g = Guest::new(&b, true);
        if shmfd {
            g.conn.send(SET_PROTOCOL_FEATURES, &u64s(&[PF_LOG_SHMFD_REPLY_ACK]), &[]).unwrap();
        }
        assert!(g.set_mem_table(&[Region::whole(MEM_SIZE)]).is_ack(), "{case}: memory table");
        g.conn.send(SET_LOG_BASE, &log_base(size), &[log.as_raw_fd()]).unwrap();
        assert!(g.conn.closed_by_backend(), "{case}: SET_LOG_BASE accepted");
        drop(g);
        assert!(b.wait_log("frontend refused: SET_LOG_BASE: ", i + 1), "{case}: no refusal logged:\n{}", b.log());
        assert!(b.log().contains(why), "{case}: the reason {why:?} is not in the log:\n{}", b.log());
        serve_check(&mut b, case);
    }

    let mut g = Guest::new(&b, true);
    g.conn.send(SET_PROTOCOL_FEATURES, &u64s(&[PF_LOG_SHMFD_REPLY_ACK]), &[]).unwrap();
    g.setup();
    let log = memfd(4096, true);
    g.conn.send(SET_LOG_BASE, &log_base(need), &[log.as_raw_fd()]).unwrap();
    assert!(matches!(g.conn.recv(), Outcome::Reply(_)), "good log refused:\n{}", b.log());
    let dirty = |log: &File| {
        use std::os::unix::fs::FileExt;
        let mut bits = vec![0u8; need as usize];
        log.read_exact_at(&mut bits, 0).unwrap();
        (0..need * 8).filter(|p| bits[(p / 8) as usize] & (1 << (p % 8)) != 0).collect::<Vec<u64>>()
    };
    g.round_trip(1);
    assert_eq!(dirty(&log), Vec::<u64>::new(), "logged before VHOST_F_LOG_ALL");
    g.conn.send(SET_FEATURES, &u64s(&[1 << 32 | 1 << 30 | LOG_ALL]), &[]).unwrap();
    assert!(matches!(g.conn.get(GET_FEATURES, &[]), Outcome::Reply(_)));
    g.round_trip(2);
    let mut want = vec![used_ring(RX) / 4096, used_ring(TX) / 4096, buf(RX, 1) / 4096];
    want.sort();
    assert_eq!(dirty(&log), want, "pages logged by the binary");
    assert!(matches!(g.stop(), Outcome::Reply(_)));
    drop(g);
    serve_check(&mut b, "after a migration");
    // The log's mapping (a memfd of the same name) went with the connection, like guest memory.
    b.assert_settles(base, 4096, "dirty log mapping");
}

/// Offload requests from a guest that negotiated them (CSUM, HOST_TSO4/6, HOST_ECN, HOST_USO):
/// lying virtio-net headers are dropped (the chain comes back, nothing reaches the wire, here
/// the loopback port and so the guest's RX), and an honest 20 KB TSO chain leaves as MSS-sized
/// frames with correct checksums, its payload once and in order.
#[test]
fn lying_offload_headers_are_dropped_and_tso_is_cut() {
    use lanekit_vhost::fuzzing::{gso_hdr, l4_check, packet};
    use lanekit_vhost::offload::{Offloads, TxHdr};
    let mut b = Backend::start("offload");
    let mut g = Guest::with_features(&b, Offloads::ALL.features());
    g.setup();
    g.round_trip(0);
    let v4 = packet(true, true, 3000, 0x10);
    let v6 = packet(false, true, 3000, 0x10);
    let udp = packet(true, false, 3000, 0);
    let good = gso_hdr(&v4, 1, 1448);
    let cases: Vec<(&str, TxHdr, &[u8])> = vec![
        ("gso_size 0", TxHdr { gso_size: 0, ..good }, &v4),
        ("hdr_len past the frame", TxHdr { hdr_len: 4000, ..good }, &v4),
        ("csum_start past the frame", TxHdr { gso_type: 0, csum_start: 5000, ..good }, &v4),
        ("csum_offset past the frame", TxHdr { gso_type: 0, csum_offset: 3100, ..good }, &v4),
        ("TCPV4 on an IPv6 frame", TxHdr { csum_start: 54, ..good }, &v6),
        ("TCP GSO on a UDP frame", good, &udp),
        ("UDP GSO on a TCP frame", TxHdr { gso_type: 5, ..good }, &v4),
        ("GSO without NEEDS_CSUM", TxHdr { flags: 0, ..good }, &v4),
        ("200 segments", TxHdr { gso_size: 15, ..good }, &v4),
        ("segments larger than the MTU", TxHdr { gso_size: 2000, ..good }, &v4),
        ("unknown GSO type", TxHdr { gso_type: 0x7f, ..good }, &v4),
    ];
    let data = buf(TX, 100);
    for (case, h, frame) in cases {
        let used = g.used_idx(TX);
        g.mem.write_slice(&[&h.bytes()[..], &[0, 0], frame].concat(), GuestAddress(data)).unwrap();
        g.chain(TX, &[(data, 12 + frame.len() as u32, false)]);
        g.kick(TX);
        assert!(g.wait_used(TX, used.wrapping_add(1)), "{case}: chain not returned");
        b.assert_alive(case);
        // A frame the lie let through would take this RX buffer first.
        g.round_trip(1);
    }
    // An honest TSO chain: 20,000 bytes of payload at MSS 1448 are 14 frames.
    let big = packet(true, true, 20_000, 0x18);
    let h = gso_hdr(&big, 1, 1448);
    let rx_used = g.used_idx(RX);
    let heads: Vec<(u16, u64)> = (0..14)
        .map(|i| {
            let at = buf(RX, 100 + i);
            (g.chain(RX, &[(at, 2048, true)]), at)
        })
        .collect();
    g.kick(RX);
    let used = g.used_idx(TX);
    g.mem.write_slice(&[&h.bytes()[..], &[0, 0], &big[..]].concat(), GuestAddress(data)).unwrap();
    g.chain(TX, &[(data, 12 + big.len() as u32, false)]);
    g.kick(TX);
    assert!(g.wait_used(TX, used.wrapping_add(1)), "TSO chain not returned");
    assert!(g.wait_used(RX, rx_used.wrapping_add(14)), "14 segments did not come back");
    let mut payload = Vec::new();
    for i in 0..14u16 {
        let (id, len) = g.used_elem(RX, rx_used.wrapping_add(i));
        let &(_, at) = heads.iter().find(|(h, _)| u32::from(*h) == id).expect("an RX buffer of ours");
        let mut f = vec![0u8; len as usize - 12];
        g.mem.read_slice(&mut f, GuestAddress(at + 12)).unwrap();
        assert!(f.len() <= 1514, "segment {i}: {} bytes", f.len());
        assert_eq!(l4_check(&f, true), 0, "segment {i}: TCP checksum");
        assert_eq!(f[..14], big[..14], "segment {i}: Ethernet header");
        payload.extend_from_slice(&f[14 + 20 + 32..]);
    }
    assert!(payload == big[66..], "the payload, once and in order");
    assert_ne!(g.stop(), Outcome::Hung);
    drop(g);
    serve_check(&mut b, "offload");
}
