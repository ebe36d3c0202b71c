#!/usr/bin/env bash
# Side-by-side throughput: DPDK testpmd (virtio_user PMD, txonly) as the guest driver, frames
# leaving through AF_XDP (copy mode) on a veth inside a namespace this script creates and deletes.
#   backend: virtio_user -> lanekit-vhost --ifname      -> veth peer
#   testpmd: virtio_user -> testpmd vhost PMD <-> af_xdp PMD (io forwarding) -> veth peer
# Same core budget: the frontend on CPU 0, the backend (lanekit-vhost or forwarding testpmd) on
# CPU 1. Counts frames arriving on the veth peer over a fixed window. Needs root and dpdk-testpmd.
# Prints {"backend":{"pps_64":..,"gbps_1500":..},"testpmd":{"pps_64":..,"gbps_1500":..}}.
# One shot, for working on the backend alone. The repeated, interleaved form with medians and
# min/max is Go (pkg/bench/vmbackend.go): `lanekit lab bench --vm-backend on` (no lab needed).
set -euo pipefail

SECS=${SECS:-5}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LANEKIT_VHOST:-$HERE/target/release/lanekit-vhost}
NS=lk-vhost-bench-$$
DIR=$(mktemp -d /tmp/lk-vhost-bench.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  ip netns del "$NS" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "compare.sh: needs root" >&2; exit 2; }
command -v dpdk-testpmd >/dev/null || { echo "compare.sh: dpdk-testpmd not installed" >&2; exit 2; }
[ -x "$BIN" ] || { echo "compare.sh: build first (cargo build --release): $BIN" >&2; exit 2; }

ip netns add "$NS"
ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip -n "$NS" link add lkb0 type veth peer name lkb1
ip -n "$NS" link set lkb0 up
ip -n "$NS" link set lkb1 up

rx_packets() { ip netns exec "$NS" cat /sys/class/net/lkb1/statistics/rx_packets; }

# frontend SOCK SIZE: virtio_user txonly on CPU 0 for $SECS seconds (then Enter; killed at +20 s).
frontend() {
  local sock=$1 size=$2 before after
  before=$(rx_packets)
  ( sleep "$SECS"; echo ) | timeout -s KILL $((SECS + 20)) dpdk-testpmd --lcores '0@0,1@0' --no-huge -m 512 \
    --no-pci --file-prefix "lkbf$$" --vdev "net_virtio_user0,path=$sock,queues=1" -- \
    --total-num-mbufs=16384 --forward-mode=txonly --txpkts="$size" --stats-period 0 \
    >"$DIR/frontend.log" 2>&1 || true
  after=$(rx_packets)
  echo $(( (after - before) ))
}

# wait_for FILE-TEST PATH [PATTERN]: until the socket exists (or the log has PATTERN), 10 s max.
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; cat "$DIR"/*.log >&2; return 1; }
wait_log() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; echo "no '$2' in $1" >&2; cat "$1" >&2; return 1; }

run_backend() {
  local size=$1 sock=$DIR/lk.sock n pid
  ip netns exec "$NS" taskset -c 1 "$BIN" --ifname lkb0 --socket "$sock" >"$DIR/backend.log" 2>&1 &
  pid=$!; PIDS+=("$pid")
  wait_sock "$sock"
  n=$(frontend "$sock" "$size")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$sock"
  sleep 0.5
  echo "$n"
}

run_testpmd() {
  local size=$1 sock=$DIR/tp.sock n pid
  ( sleep $((SECS + 8)); echo ) | ip netns exec "$NS" timeout -s KILL $((SECS + 30)) stdbuf -oL -eL dpdk-testpmd \
    --lcores '0@1,1@1' --no-huge -m 512 --no-pci --file-prefix "lkbb$$" \
    --vdev "net_vhost0,iface=$sock,queues=1" --vdev "net_af_xdp0,iface=lkb0,start_queue=0,queue_count=1" -- \
    --total-num-mbufs=16384 --forward-mode=io --stats-period 0 >"$DIR/testpmd.log" 2>&1 &
  pid=$!; PIDS+=("$pid")
  wait_sock "$sock"
  wait_log "$DIR/testpmd.log" "Press enter to exit"
  n=$(frontend "$sock" "$size")
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  sleep 0.5
  rm -f "$sock"
  echo "$n"
}

pps() { awk -v n="$1" -v s="$SECS" 'BEGIN { printf "%.0f", n / s }'; }
gbps() { awk -v n="$1" -v s="$SECS" 'BEGIN { printf "%.3f", n * 1500 * 8 / s / 1e9 }'; }

b64=$(run_backend 64); cp "$DIR/backend.log" "$DIR/backend64.log"; b1500=$(run_backend 1500)
t64=$(run_testpmd 64); t1500=$(run_testpmd 1500)
printf '{"backend":{"pps_64":%s,"gbps_1500":%s},"testpmd":{"pps_64":%s,"gbps_1500":%s},"seconds":%s}\n' \
  "$(pps "$b64")" "$(gbps "$b1500")" "$(pps "$t64")" "$(gbps "$t1500")" "$SECS"
