#!/usr/bin/env bash
# The VM backend comparison (lanekit-vhost vs DPDK testpmd's vhost + af_xdp PMDs, 64 B packets/s and
# 1500 B Gbit/s) has one implementation: pkg/bench/vmbackend.go, run by `lanekit lab bench`. This
# wrapper runs it alone, for working on the backend: root and dpdk-testpmd needed, no lab.
# The steering rows need the rss_guest example, the CPU-per-frame rows paced_guest
# (cargo build --release --example rss_guest --example paced_guest).
#   SECS=5 REPEAT=1 LANEKIT_VHOST=vhost/target/release/lanekit-vhost LANEKIT=bin/lanekit
# Extra arguments go to `lanekit lab bench` (e.g. --json).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
LANEKIT=${LANEKIT:-$HERE/../bin/lanekit}
VHOST=${LANEKIT_VHOST:-$HERE/target/release/lanekit-vhost}
[ -x "$LANEKIT" ] || { echo "compare.sh: $LANEKIT missing (make build-go)" >&2; exit 2; }
exec "$LANEKIT" lab bench --vm-backend only --vhost-bin "$VHOST" --repeat "${REPEAT:-1}" --duration "${SECS:-5}s" "$@"
