#!/usr/bin/env bash
# Installs everything lanekit builds, tests and demos with. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every tool a test runs is here: under make test a missing one fails the test
# (internal/testutil.MissingDep), it does not skip.
APT_PKGS=(clang llvm libbpf-dev bpftool xdp-tools libxdp-dev iperf3 sockperf busybox-static m4
  protobuf-compiler iproute2 iptables nftables ethtool linux-perf qemu-system-x86 dpdk dpdk-dev cpio
  kmod pkg-config python3 procps util-linux
  # the real-node lab: runc is built with seccomp (make k8s-node-bins), the node images are
  # Debian roots made by mmdebstrap (make k8s-node-images)
  libseccomp-dev mmdebstrap)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo ">> apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! mountpoint -q /sys/fs/bpf; then
  echo ">> mounting bpffs on /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi

echo ">> go: downloading modules"
go mod download

# Reference CNI plugins (bridge, host-local, loopback; portmap for the flannel
# conflist of the rival labs) for the baseline pods and the upstream cnitool, built from the Go module proxy at pinned versions.
mkdir -p bin/cni
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  [ -x "bin/cni/${p#*/}" ] || { echo ">> building reference CNI plugin ${p#*/}"; GOBIN=$PWD/bin/cni go install "github.com/containernetworking/plugins/plugins/$p@v1.9.1"; }
done
[ -x bin/cni/cnitool ] || { echo ">> building cnitool"; GOBIN=$PWD/bin/cni go install github.com/containernetworking/cni/cnitool@v1.3.1; }

# etcd + kube-apiserver for the Kubernetes tests (cached per machine, outside the repo);
# LANEKIT_DEPS_K8S=0 (make demo, which runs no API server) skips them.
if [ "${LANEKIT_DEPS_K8S:-1}" != 0 ]; then
  echo ">> k8s: etcd + kube-apiserver ($(./scripts/k8s-bins.sh dir))"
  nice ./scripts/k8s-bins.sh >/dev/null
fi

if [ -f vhost/Cargo.toml ]; then
  echo ">> cargo: fetching crates"
  (cd vhost && cargo fetch -q)
fi
echo ">> deps ok"
