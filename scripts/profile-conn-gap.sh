#!/bin/bash
# profile-conn-gap.sh: where a lanekit connection's CPU goes above the bare
# wire (docs/benchmarks.md, "Where the gap goes, profiled").
#
# Brings up the stand-in lab (2 nodes, 1 pod each), then alternates N pairs of
# 3 s `lanekit lab cps-client` runs (2 loops): the raw hosts (no rules, no BPF)
# and a lanekit pod on node 1 to a pod on node 2 — through a ClusterIP
# (`svc`, a Service applied with `lanekit lab apply`) or directly (`pod`) —
# each under `perf record -a`, the pod runs with BPF run-time statistics on.
# Prints per connection the CPU busy time (idle excluded) of both, the
# difference split into the BPF programs and what they call, the pod's veth
# crossing and redirects, and the rest, then the largest symbol differences,
# and the BPF statistics' own figure. Takes the lab down on exit (also on
# failure). Root; needs perf (linux-perf), bpftool, python3 and bin/lanekit.
#
# usage: scripts/profile-conn-gap.sh [svc|pod] [pairs]
set -euo pipefail

mode=${1:-svc}
pairs=${2:-4}
case $mode in svc | pod) ;; *)
	echo "usage: $0 [svc|pod] [pairs]" >&2
	exit 2
	;;
esac
if ! [[ $pairs =~ ^[1-9][0-9]?$ ]]; then
	echo "pairs: 1-99" >&2
	exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
lk=$root/bin/lanekit
for c in perf bpftool python3 "$lk"; do
	command -v "$c" >/dev/null || {
		echo "$c: not found (make deps && make build)" >&2
		exit 1
	}
done
[ "$(id -u)" = 0 ] || {
	echo "root only (network namespaces, perf -a, BPF statistics)" >&2
	exit 1
}
if "$lk" lab status >/dev/null 2>&1 && ip netns list | grep -q '^lk-'; then
	echo "a lab is up: take it down first (lanekit lab down)" >&2
	exit 1
fi

out=$(mktemp -d /tmp/lk-profile.XXXXXX)
servers=()
stats_was=$(sysctl -n kernel.bpf_stats_enabled)
# perf mounts tracefs when it is not: leave the machine as found.
tracefs_was=$(mountpoint -q /sys/kernel/tracing && echo 1 || echo 0)
cleanup() {
	for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done
	sysctl -qw kernel.bpf_stats_enabled="$stats_was"
	if [ "$tracefs_was" = 0 ] && mountpoint -q /sys/kernel/tracing; then umount /sys/kernel/tracing || true; fi
	"$lk" lab down >/dev/null 2>&1 || true
	rm -rf "$out"
}
trap cleanup EXIT

"$lk" lab up --nodes 2 --pods-per-node 1 >"$out/up.log" 2>&1 || {
	cat "$out/up.log" >&2
	exit 1
}
client=lk-n1-p1 server=lk-n2-p1 server_ip=$(ip -n lk-n2-p1 -4 -o addr show dev eth0 | awk '{split($4,a,"/"); print a[1]}')
raw_ip=$(ip -n lk-n2-r1 -4 -o addr show | awk '$2 != "lo" {split($4,a,"/"); print a[1]; exit}')
target=$server_ip:7002
if [ "$mode" = svc ]; then
	target=10.96.0.50:7002
	"$lk" lab apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: profile-cps, namespace: default}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: cps, port: 7002, protocol: TCP, targetPort: 7002}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: profile-cps-1
  namespace: default
  labels: {kubernetes.io/service-name: profile-cps}
addressType: IPv4
ports: [{name: cps, port: 7002, protocol: TCP}]
endpoints:
- addresses: [$server_ip]
  conditions: {ready: true}
EOF
fi
life=$((pairs * 20 + 30))s
ip netns exec $server "$lk" lab cps-server --listen "$server_ip:7002" --for $life >/dev/null 2>&1 &
servers+=($!)
ip netns exec lk-n2-r1 "$lk" lab cps-server --listen "$raw_ip:7001" --for $life >/dev/null 2>&1 &
servers+=($!)
sleep 2

bpf_ns() {
	bpftool -j prog show | python3 -c '
import json, sys
names = {"from_pod", "from_uplink", "to_uplink", "to_pod", "from_tunnel", "to_tunnel"}
progs = [p for p in json.load(sys.stdin) if p.get("name") in names]
print(sum(p.get("run_time_ns", 0) for p in progs), sum(p.get("run_cnt", 0) for p in progs))'
}
for i in $(seq "$pairs"); do
	perf record -q -a -o "$out/raw$i.data" -- ip netns exec lk-n1-r1 "$lk" lab cps-client --addr "$raw_ip:7001" \
		--duration 3s --parallel 2 >"$out/raw$i.out"
	sysctl -qw kernel.bpf_stats_enabled=1
	read -r ns0 n0 < <(bpf_ns)
	perf record -q -a -o "$out/lk$i.data" -- ip netns exec $client "$lk" lab cps-client --addr "$target" \
		--duration 3s --parallel 2 >"$out/lk$i.out"
	read -r ns1 n1 < <(bpf_ns)
	sysctl -qw kernel.bpf_stats_enabled=0
	echo "$((ns1 - ns0)) $((n1 - n0))" >"$out/lk$i.bpf"
	echo "pair $i: raw $(cat "$out/raw$i.out"); lanekit $(cat "$out/lk$i.out")" >&2
done

python3 - "$out" "$pairs" "$mode" <<'EOF'
import collections, json, subprocess, sys

out, pairs, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
IDLE = ("pv_native_safe_halt", "default_idle", "cpu_idle_poll", "poll_idle", "intel_idle", "acpi_idle")
CATS = [
    # bpf_ covers the programs (bpf_prog_*), helpers and the BPF LRU; htab_
    # the hash maps; memcmp is their key compare on this path.
    ("BPF programs and what they call", ("bpf_", "lookup_nulls_elem_raw", "htab_", "fib_table_lookup",
                                         "fib_lookup_good_nhc", "memcmp")),
    ("veth crossing and redirects", ("veth_", "__dev_queue_xmit", "__netif_receive_skb", "handle_softirqs",
                                     "do_softirq", "skb_do_redirect", "dev_hard_start_xmit", "dev_get_by_index",
                                     "validate_xmit", "eth_type_trans", "__dev_forward_skb", "process_backlog",
                                     "net_rx_action", "netif_skb_features", "__napi_poll", "enqueue_to_backlog",
                                     "netif_rx")),
]


def profile(path):
    """ns of CPU (cpu-clock periods) per symbol."""
    rep = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "sym", "--stdio", "-F",
                          "period,sym"], capture_output=True, text=True, check=True).stdout
    d = collections.Counter()
    for line in rep.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        f = line.split(None, 1)
        if len(f) == 2 and f[0].isdigit():
            sym = f[1].strip()
            if "bpf_prog_" in sym:
                sym = "[k] bpf_prog_" + sym.rsplit("_", 1)[-1]
            d[sym] += int(f[0])
    return d


raw, lk = collections.Counter(), collections.Counter()
craw = clk = 0
bpf_ns = bpf_runs = 0
for i in range(1, pairs + 1):
    raw += profile(f"{out}/raw{i}.data")
    lk += profile(f"{out}/lk{i}.data")
    craw += json.load(open(f"{out}/raw{i}.out"))["conns"]
    clk += json.load(open(f"{out}/lk{i}.out"))["conns"]
    ns, runs = map(int, open(f"{out}/lk{i}.bpf").read().split())
    bpf_ns += ns
    bpf_runs += runs


def busy(c, n):
    return sum(v for k, v in c.items() if not any(x in k for x in IDLE)) / 1e3 / n


sums, rows = collections.Counter(), []
for k in set(raw) | set(lk):
    if any(x in k for x in IDLE):
        continue
    d = (lk[k] / clk - raw[k] / craw) / 1e3
    cat = next((name for name, pats in CATS if any(p in k for p in pats)), "the rest")
    sums[cat] += d
    rows.append((d, k, cat))
print(f"lanekit pod -> {'ClusterIP' if mode == 'svc' else 'pod'} (node 1 -> node 2) against the raw hosts, "
      f"{pairs} alternated pairs of 3 s cps-client runs: {craw} and {clk} connections")
print(f"per connection, CPU busy: raw hosts {busy(raw, craw):.1f} us, lanekit {busy(lk, clk):.1f} us, "
      f"difference {busy(lk, clk) - busy(raw, craw):.1f} us")
for name, _ in CATS + [("the rest", ())]:
    print(f"  {name}: {sums[name]:+.1f} us")
print("largest differences (us per connection):")
for d, k, cat in sorted(rows, reverse=True)[:15]:
    print(f"  {d:+6.2f}  {k}  ({cat})")
if clk:
    print(f"BPF_ENABLE_STATS: {bpf_ns / 1e3 / clk:.1f} us of program time per connection, "
          f"{bpf_runs / clk:.1f} program runs per connection (the statistics' clock reads are in 'the rest')")
EOF
