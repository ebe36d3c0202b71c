#!/usr/bin/env bash
# Builds the components of a real Kubernetes node from the Go module proxy into
# a per-machine cache (outside the repo): kubelet, kube-controller-manager,
# kube-scheduler, kubectl, the upstream e2e test binary (e2e.test), agnhost,
# ginkgo, CoreDNS, containerd v2 (containerd, containerd-shim-runc-v2, ctr) and
# runc, and the rivals lab bench compares lanekit with: kube-proxy (same module
# as kubelet) and flanneld (github.com/flannel-io/flannel). Opt-in (`make k8s-node-bins`), not part of `make deps`: the first build
# takes tens of minutes on two cores. Idempotent: skips what exists.
#
#   scripts/k8s-node-bins.sh          build (if needed), check, print the directory
#   scripts/k8s-node-bins.sh lab      only what `lab up --k8s --kubelet` runs with lanekit
#                                     (kubelet, the control plane's two, kubectl, containerd,
#                                     runc, pause, agnhost, CoreDNS: no e2e.test, kube-proxy,
#                                     flanneld or Cilium), as CI builds it for the real-node tests
#   scripts/k8s-node-bins.sh dir      print the directory only (no build)
#
# Every version is pinned here and is part of the directory name, so changing
# one builds a fresh set. The Kubernetes binaries come from the same wrapper
# module as scripts/k8s-bins.sh (k8s.io/kubernetes + its staging repos at their
# published v0.Y.Z); ginkgo is the version that k8s.io/kubernetes' go.mod requires
# (checked). Builds run under `nice -n 19` with `-p 1` (LANEKIT_BUILD_JOBS to
# change it) so a shared two-core machine stays usable.
#
# How the coming `lanekit lab up --k8s --kubelet` uses this directory: each lab
# node runs this containerd (its own root, state, socket and CRI config, the
# runtime being this runc and containerd-shim-runc-v2, found through PATH) and
# this kubelet in the node's network and mount namespaces; the control plane adds
# kube-controller-manager, kube-scheduler and CoreDNS next to kube-apiserver and
# etcd from scripts/k8s-bins.sh. There is no registry: at node start the lab
# imports the image archives written by internal/tools/lkimages (pause, the
# lanekit agent, agnhost, CoreDNS) into the node's containerd (`ctr -n k8s.io
# images import`), under the names the manifests and the e2e tests use;
# `make conformance` runs e2e.test with ginkgo and kubectl from here.
set -euo pipefail

K8S_VERSION=v1.37.2
PAUSE_VERSION=3.10.2   # = build/pause/Makefile's TAG and the e2e tests' pause image
GINKGO_VERSION=v2.32.0 # = k8s.io/kubernetes@$K8S_VERSION's require (checked below)
COREDNS_VERSION=v1.15.0
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.2
FLANNEL_VERSION=v0.28.10 # not in the directory name: added to existing sets
CILIUM_VERSION=v1.19.0   # likewise; 1.20.x has dependencies the module proxy refuses
DIR=${LANEKIT_K8S_NODE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lanekit/k8s-node/kube-${K8S_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_coredns-${COREDNS_VERSION}}

case ${1:-} in
  dir) echo "$DIR"; exit 0 ;;
  lab) LAB=1 ;;
  "") LAB= ;;
  *) echo "k8s-node-bins: unknown argument $1 (want lab, dir or none)" >&2; exit 1 ;;
esac

# all: true unless only the lab's set is asked for (the rest is skipped).
all() { [ -z "$LAB" ]; }

NAME=k8s-node-bins
# shellcheck source=scripts/gobuild-lib.sh
source "$(dirname "$0")/gobuild-lib.sh"

# kube_module: the wrapper module for k8s.io/kubernetes (see scripts/k8s-bins.sh).
kube_module() {
  module kube
  "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  local staging=${K8S_VERSION/#v1./v0.} modfile m
  modfile=$(mod_field "k8s.io/kubernetes@$K8S_VERSION" GoMod)
  [ -f "$modfile" ] || { echo "k8s-node-bins: no go.mod for k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
  for m in $(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile"); do
    "$GO" mod edit -replace="$m=$m@$staging"
  done
  if ! grep -q "github.com/onsi/ginkgo/v2 $GINKGO_VERSION\$" "$modfile"; then
    echo "k8s-node-bins: k8s.io/kubernetes@$K8S_VERSION does not require ginkgo $GINKGO_VERSION:" >&2
    grep 'onsi/ginkgo' "$modfile" >&2
    exit 1
  fi
}

# kube_src: the k8s.io/kubernetes module's source directory.
kube_src() {
  mod_field "k8s.io/kubernetes@$K8S_VERSION" Dir
}

# What hack/lib/version.sh stamps, so kubelet reports $K8S_VERSION to the Node
# and kubectl/e2e see the real server and client versions.
kube_ldflags() {
  local minor=${K8S_VERSION#v1.} p f=""
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "-s -w$f"
}

if need runc; then
  if ! pkg-config --exists libseccomp 2>/dev/null; then
    log "installing libseccomp-dev (runc is built with -tags seccomp)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libseccomp-dev >&2
  fi
  log "building runc $RUNC_VERSION into $DIR"
  (
    module runc
    "$GO" mod edit -require="github.com/opencontainers/runc@$RUNC_VERSION"
    timed runc "${build[@]}" -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
      -o "$work/runc.bin" github.com/opencontainers/runc
  )
  install -m 0755 "$work/runc.bin" "$DIR/runc"
fi

if need containerd containerd-shim-runc-v2 ctr; then
  log "building containerd $CONTAINERD_VERSION into $DIR"
  (
    module containerd
    "$GO" mod edit -require="github.com/containerd/containerd/v2@$CONTAINERD_VERSION"
    v="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    # No btrfs headers here and the lab uses overlayfs: leave btrfs out.
    timed containerd "${build[@]}" -tags "urfave_cli_no_docs no_btrfs" -ldflags "-s -w $v" \
      -o "$work/containerd.bin" github.com/containerd/containerd/v2/cmd/containerd
    timed ctr "${build[@]}" -tags "urfave_cli_no_docs no_btrfs" -ldflags "-s -w $v" \
      -o "$work/ctr.bin" github.com/containerd/containerd/v2/cmd/ctr
    # As upstream's Makefile: a static shim (CGO off) without the gRPC server.
    CGO_ENABLED=0 timed containerd-shim-runc-v2 "${build[@]}" -tags "urfave_cli_no_docs no_grpc" \
      -ldflags "-s -w $v" -o "$work/shim.bin" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  )
  install -m 0755 "$work/containerd.bin" "$DIR/containerd"
  install -m 0755 "$work/ctr.bin" "$DIR/ctr"
  install -m 0755 "$work/shim.bin" "$DIR/containerd-shim-runc-v2"
fi

kube_bins=(kubelet kubectl kube-controller-manager kube-scheduler)
kube_test=(agnhost)
all && kube_bins+=(kube-proxy) && kube_test+=(e2e.test ginkgo)
if need "${kube_bins[@]}" "${kube_test[@]}"; then
  log "building Kubernetes $K8S_VERSION node binaries into $DIR (slow: tens of minutes)"
  (
    kube_module
    ldflags=$(kube_ldflags)
    for b in "${kube_bins[@]}"; do
      need "$b" || continue
      timed "$b" "${build[@]}" -ldflags "$ldflags" -o "$work/$b.bin" "k8s.io/kubernetes/cmd/$b"
      install -m 0755 "$work/$b.bin" "$DIR/$b"
    done
    if need agnhost; then
      timed agnhost "${build[@]}" -ldflags "-s -w" -o "$work/agnhost.bin" k8s.io/kubernetes/test/images/agnhost
      install -m 0755 "$work/agnhost.bin" "$DIR/agnhost"
    fi
    if all && need ginkgo; then
      timed ginkgo "${build[@]}" -ldflags "-s -w" -o "$work/ginkgo.bin" github.com/onsi/ginkgo/v2/ginkgo
      install -m 0755 "$work/ginkgo.bin" "$DIR/ginkgo"
    fi
    if all && need e2e.test; then
      timed e2e.test nice -n 19 "$GO" test -c -trimpath -ldflags "$ldflags" \
        -o "$work/e2e.test.bin" k8s.io/kubernetes/test/e2e
      install -m 0755 "$work/e2e.test.bin" "$DIR/e2e.test"
    fi
  )
fi

# The conntrack test's server (test/images/regression-issue-74839: answers a
# TCP connection with an out-of-window packet), static as its image needs.
if all && need regression-issue-74839; then
  log "building regression-issue-74839 into $DIR"
  (
    kube_module
    CGO_ENABLED=0 timed regression-issue-74839 "${build[@]}" -ldflags "-s -w" \
      -o "$work/regression.bin" k8s.io/kubernetes/test/images/regression-issue-74839
  )
  install -m 0755 "$work/regression.bin" "$DIR/regression-issue-74839"
fi

# pause as upstream builds it (build/pause/Makefile: a static pause.c), and
# agnhost's porter certificates, which its image carries (/localhost.crt, .key).
if need pause agnhost-porter/localhost.crt; then
  log "building pause $PAUSE_VERSION into $DIR"
  (
    kube_module
    src=$(kube_src)
    [ -d "$src" ] || { echo "k8s-node-bins: no source directory for k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
    grep -q "^TAG ?= $PAUSE_VERSION\$" "$src/build/pause/Makefile" ||
      { echo "k8s-node-bins: pause in k8s.io/kubernetes@$K8S_VERSION is not $PAUSE_VERSION" >&2; exit 1; }
    nice -n 19 gcc -Os -Wall -Werror -static -s -DVERSION="v$PAUSE_VERSION-lanekit" \
      -o "$work/pause.bin" "$src/build/pause/linux/pause.c"
    install -m 0755 "$work/pause.bin" "$DIR/pause"
    install -D -m 0644 "$src/test/images/agnhost/porter/localhost.crt" "$DIR/agnhost-porter/localhost.crt"
    install -D -m 0644 "$src/test/images/agnhost/porter/localhost.key" "$DIR/agnhost-porter/localhost.key"
  )
fi

if need coredns; then
  log "building CoreDNS $COREDNS_VERSION into $DIR"
  (
    module coredns
    "$GO" mod edit -require="github.com/coredns/coredns@$COREDNS_VERSION"
    # Upstream's plugin list: core/plugin/zplugin.go as released (plugin.cfg).
    CGO_ENABLED=0 timed coredns "${build[@]}" -ldflags "-s -w" -o "$work/coredns.bin" github.com/coredns/coredns
  )
  install -m 0755 "$work/coredns.bin" "$DIR/coredns"
fi

# flanneld as upstream's Makefile builds it (CGO on for the udp backend's C
# proxy, linked static, version stamped), from its
# main.go less one blank import: the tencentvpc backend's SDK
# (github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc) is refused by
# the module proxy (403). The lab uses the host-gw and vxlan backends.
if all && need flanneld; then
  log "building flanneld $FLANNEL_VERSION into $DIR"
  (
    module flannel
    "$GO" mod edit -require="github.com/flannel-io/flannel@$FLANNEL_VERSION"
    src=$(mod_field "github.com/flannel-io/flannel@$FLANNEL_VERSION" Dir)
    [ -f "$src/main.go" ] || { echo "k8s-node-bins: no main.go in flannel $FLANNEL_VERSION" >&2; exit 1; }
    grep -v '"github.com/flannel-io/flannel/pkg/backend/tencentvpc"' "$src/main.go" >main.go
    # The same versions as upstream's go.mod (MVS of the wrapper keeps them).
    retry "$GO" mod tidy
    CGO_ENABLED=1 timed flanneld "${build[@]}" \
      -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION -extldflags -static" \
      -o "$work/flanneld.bin" .
  )
  install -m 0755 "$work/flanneld.bin" "$DIR/flanneld"
fi

# Cilium as its images/cilium/Dockerfile builds it (Makefile.defs: tag osusergo,
# the version stamped; the generic operator with ipam_provider_operator), plus
# what its image and chart use besides the binaries: the BPF sources the agent
# compiles at start (bpf/, installed where --bpf-dir defaults to), the CNI
# install/uninstall and init-container scripts, and its Helm chart (rendered by
# `lab up --cni cilium`). Envoy (the L7 proxy) is C++ and not built here.
if all && need cilium-agent cilium-operator-generic cilium-cni cilium-dbg cilium/chart/Chart.yaml cilium/bpf/bpf_lxc.c; then
  log "building Cilium $CILIUM_VERSION into $DIR (slow: tens of minutes)"
  (
    module cilium
    "$GO" mod edit -require="github.com/cilium/cilium@$CILIUM_VERSION"
    src=$(mod_field "github.com/cilium/cilium@$CILIUM_VERSION" Dir)
    [ -f "$src/VERSION" ] || { echo "k8s-node-bins: no source directory for cilium $CILIUM_VERSION" >&2; exit 1; }
    # A dependent module does not see upstream's replaces (its gobgp fork): copy them.
    sed -n 's#^replace \([^ ]*\) => \([^ ]*\) \([^ ]*\)$#\1=\2@\3#p' "$src/go.mod" | while read -r r; do
      "$GO" mod edit -replace="$r"
    done
    grep -q gobgp go.mod || { echo "k8s-node-bins: cilium's replaces not found in its go.mod" >&2; exit 1; }
    # The gobgp fork's pseudo-version is not in sum.golang.org: its hashes
    # (and every other) are checked against upstream's own go.sum.
    cp "$src/go.sum" go.sum
    chmod u+w go.sum
    cilium_ldflags="-s -w -X 'github.com/cilium/cilium/pkg/version.ciliumVersion=${CILIUM_VERSION#v} lanekit'"
    ctags=osusergo
    for b in cilium-agent:daemon cilium-operator-generic:operator cilium-cni:plugins/cilium-cni cilium-dbg:cilium-dbg; do
      name=${b%%:*}
      pkg=${b#*:}
      need "$name" || continue
      tags=$ctags
      [ "$name" = cilium-operator-generic ] && tags="$ctags,ipam_provider_operator"
      CGO_ENABLED=0 timed "$name" "${build[@]}" -tags "$tags" -ldflags "$cilium_ldflags" \
        -o "$work/$name.bin" "github.com/cilium/cilium/$pkg"
      install -m 0755 "$work/$name.bin" "$DIR/$name"
    done
    rm -rf "$DIR/cilium"
    mkdir -p "$DIR/cilium"
    cp -r "$src/bpf" "$DIR/cilium/bpf"
    cp -r "$src/install/kubernetes/cilium" "$DIR/cilium/chart"
    install -m 0755 "$src/images/cilium/init-container.sh" "$src/plugins/cilium-cni/install-plugin.sh" \
      "$src/plugins/cilium-cni/cni-uninstall.sh" "$DIR/cilium/"
    chmod -R u+w "$DIR/cilium"
  )
fi

# Every binary runs and reports the pinned version.
check() {
  local b=$1 want=$2
  shift 2
  local out
  out=$("$DIR/$b" "$@" 2>&1) || { echo "k8s-node-bins: $b $* failed: $out" >&2; exit 1; }
  case $out in
    *"$want"*) ;;
    *) echo "k8s-node-bins: $b $*: want $want in: $out" >&2; exit 1 ;;
  esac
}
check pause "v$PAUSE_VERSION" -v
check runc "${RUNC_VERSION#v}" --version
check containerd "$CONTAINERD_VERSION" --version
check ctr "$CONTAINERD_VERSION" --version
check containerd-shim-runc-v2 "$CONTAINERD_VERSION" -v
for b in "${kube_bins[@]}"; do
  [ "$b" = kubectl ] || check "$b" "$K8S_VERSION" --version
done
check kubectl "$K8S_VERSION" version --client
check agnhost "" --help
check coredns "CoreDNS-${COREDNS_VERSION#v}" -version
if all; then
  check ginkgo "${GINKGO_VERSION#v}" version
  check e2e.test "$K8S_VERSION" --version
  check flanneld "$FLANNEL_VERSION" --version
  check cilium-agent "${CILIUM_VERSION#v}" --version
  check cilium-operator-generic "${CILIUM_VERSION#v}" --version
  check cilium-dbg "Client: ${CILIUM_VERSION#v}" version
fi
echo "$DIR"
