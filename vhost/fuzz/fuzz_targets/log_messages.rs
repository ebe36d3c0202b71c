//! Live-migration messages (`SET_LOG_BASE`, `SET_LOG_FD`, `VHOST_F_LOG_ALL`, new memory tables)
//! with fds of every kind, driven by arbitrary bytes, on a fresh connection to a live loopback
//! backend. The backend must refuse or accept them without hanging or dying.
//! `cargo +nightly fuzz run log_messages`
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use lanekit_vhost::fuzzing::{log_messages, MessageTarget};
use libfuzzer_sys::fuzz_target;

static TARGET: OnceLock<MessageTarget> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let t = TARGET.get_or_init(|| MessageTarget::start("libfuzzer-log").expect("start backend"));
    assert!(log_messages(&t.path, data, Duration::from_secs(10)), "backend hung on input");
});
