//! Arbitrary bytes as vhost-user messages on a fresh connection to a live loopback backend.
//! The backend must close the connection (or answer) without hanging or dying.
//! `cargo +nightly fuzz run vhost_user_messages`
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use lanekit_vhost::fuzzing::{send_raw, MessageTarget};
use libfuzzer_sys::fuzz_target;

static TARGET: OnceLock<MessageTarget> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let t = TARGET.get_or_init(|| MessageTarget::start("libfuzzer").expect("start backend"));
    assert!(send_raw(&t.path, data, Duration::from_secs(10)), "backend hung on input");
});
