//! Used-buffer notifications and kicks: when the driver asked to be told (`needs_signal`), when
//! a TX notification may be held back and when the guest has made it moot (`moderate_tx`,
//! `tx_consumed`), and re-arming kicks before a polling worker sleeps.

use std::time::{Duration, Instant};

use super::*;

#[test]
fn needs_signal_follows_used_event_and_no_interrupt() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    add_small_tx_chains(&m, &vq, 4);
    let mut q: Queue = vq.create_queue().unwrap();
    q.set_event_idx(true);
    let used_event = GuestAddress(q.avail_ring() + 4 + 2 * 16);
    let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
    tx_queue(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
    assert_eq!(q.next_used(), 4);
    // used_event in [old, new): the driver asked to be told once entry used_event is used.
    for (ev, old, want) in
        [(0u16, 0u16, true), (3, 0, true), (4, 0, false), (10, 0, false), (1, 2, false), (2, 2, true)]
    {
        m.write_obj(ev.to_le(), used_event).unwrap();
        assert_eq!(needs_signal(&q, &m, old, &stats), want, "used_event {ev} old {old}");
    }
    assert!(!needs_signal(&q, &m, 4, &stats), "nothing used, nothing to signal");
    // Without EVENT_IDX only VRING_AVAIL_F_NO_INTERRUPT suppresses.
    q.set_event_idx(false);
    let flags = GuestAddress(q.avail_ring());
    m.write_obj(1u16.to_le(), flags).unwrap();
    assert!(!needs_signal(&q, &m, 0, &stats));
    m.write_obj(0u16.to_le(), flags).unwrap();
    assert!(needs_signal(&q, &m, 0, &stats));
    assert_eq!(stats.snapshot().errors, 0);
}

#[test]
fn polling_keeps_kicks_off_and_arming_reports_chains_that_raced() {
    for event_idx in [false, true] {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 64);
        let mut q: Queue = vq.create_queue().unwrap();
        q.set_event_idx(event_idx);
        let used_flags = GuestAddress(q.used_ring());
        let avail_event = GuestAddress(q.used_ring() + 4 + 8 * 64);
        let (mut port, mut st, stats) = (TestPort::new(), TxState::default(), Stats::default());
        let add = |first: u16, n: u16| {
            let chains: Vec<_> = (first..first + n)
                .map(|i| tx_descs(&m, BUF_BASE + 0x1000 * u64::from(i), [0; 12], &frame(64, i as u8), 128))
                .collect();
            add_chains(&vq, first, &chains);
        };
        add(0, 3);
        let run = tx_poll(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
        assert_eq!((run.handled, run.more), (3, false));
        if !event_idx {
            // Polling: the driver is told not to kick.
            assert_eq!(m.read_obj::<u16>(used_flags).unwrap(), 1, "VRING_USED_F_NO_NOTIFY while polling");
        }
        // A chain published after the last poll but before arming: arming must report it, so
        // the worker polls again instead of sleeping on a kick the driver never sends.
        add(3, 1);
        assert!(arm_tx(&mut q, &m, &stats), "event_idx {event_idx}: raced chain reported");
        if event_idx {
            assert_eq!(m.read_obj::<u16>(avail_event).unwrap(), 3, "kick wanted at the next chain");
        } else {
            assert_eq!(m.read_obj::<u16>(used_flags).unwrap(), 0, "kicks re-enabled");
        }
        let run = tx_poll(&mut q, &m, &mut port, &mut st, MODE, &stats, 64);
        assert_eq!(run.handled, 1);
        // Nothing pending: arming says sleep, and the driver will kick for the next chain.
        assert!(!arm_tx(&mut q, &m, &stats));
        if event_idx {
            assert_eq!(m.read_obj::<u16>(avail_event).unwrap(), 4);
        } else {
            assert_eq!(m.read_obj::<u16>(used_flags).unwrap(), 0);
        }
        assert_eq!(port.sent.len(), 4);
        assert_eq!(stats.snapshot().errors, 0);
    }
}

/// Moderation: a notification the driver asked for is held (a new episode each time it asks),
/// later runs it did not ask for extend the held episode, and 32 unconsumed entries send it.
#[test]
fn moderate_tx_holds_what_was_asked_and_sends_at_the_frame_limit() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_micros(100);
    let mut owed = None;
    assert!(!moderate_tx(&mut owed, false, 0, 1, t0), "nothing asked, nothing held: no signal");
    assert_eq!(owed, None);
    assert!(!moderate_tx(&mut owed, true, 0, 1, t0), "asked: held");
    assert_eq!(owed, Some(TxOwed { since: t0, first: 0, used: 1 }));
    assert!(!moderate_tx(&mut owed, false, 1, 5, later), "not asked: the episode covers more");
    assert_eq!(owed, Some(TxOwed { since: t0, first: 0, used: 5 }));
    // Asked again: the guest moved used_event past what was held, a new episode starts.
    assert!(!moderate_tx(&mut owed, true, 5, 6, later));
    assert_eq!(owed, Some(TxOwed { since: later, first: 5, used: 6 }));
    // The limit: TX_NOTIFY_MAX_FRAMES entries unconsumed send it, and end the episode.
    let limit = 5 + TX_NOTIFY_MAX_FRAMES;
    assert!(!moderate_tx(&mut owed, false, 6, limit - 1, later));
    assert!(moderate_tx(&mut owed, false, limit - 1, limit, later), "the frame limit sends it");
    assert_eq!(owed, None);
    // One run of that many chains goes at once too, across the index wrap.
    assert!(moderate_tx(&mut owed, true, 65_530, 65_530u16.wrapping_add(TX_NOTIFY_MAX_FRAMES), t0));
    assert_eq!(owed, None);
}

/// The guest consumed the held entries when it moved used_event to them or past (at most a ring
/// ahead); an older used_event, Linux's 0 while it disables callbacks, or no EVENT_IDX: not.
#[test]
fn tx_consumed_reads_the_guests_used_event() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let mut q: Queue = vq.create_queue().unwrap();
    q.set_event_idx(true);
    let used_event = GuestAddress(q.avail_ring() + 4 + 2 * 16);
    for (ev, used, want) in [
        (7u16, 7u16, true),
        (9, 7, true),
        (7 + 16, 7, true),
        (7 + 17, 7, false),
        (6, 7, false),
        (0, 7, false),
        (2, 65_533, true),
        (65_532, 65_533, false),
    ] {
        m.write_obj(ev.to_le(), used_event).unwrap();
        assert_eq!(tx_consumed(&q, &m, used), want, "used_event {ev}, held up to {used}");
    }
    m.write_obj(7u16.to_le(), used_event).unwrap();
    q.set_event_idx(false);
    assert!(!tx_consumed(&q, &m, 7), "without EVENT_IDX nothing shows consumption");
}
