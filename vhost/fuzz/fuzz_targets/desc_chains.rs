//! Arbitrary bytes as a split queue (avail ring, descriptor table, buffers) run through the TX,
//! RX and control queue code. `cargo +nightly fuzz run desc_chains`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lanekit_vhost::fuzzing::queues_from_bytes(data);
});
