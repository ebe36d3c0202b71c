#!/usr/bin/env bash
# Builds etcd and kube-apiserver from the Go module proxy into a per-machine cache
# (outside the repo) for the tests that run against a real API server
# (internal/k8stest, pkg/k8s, `lanekit lab up --k8s`). Idempotent: skips what
# exists. First build: ~5-10 min and ~3 GB peak on two cores.
#
#   scripts/k8s-bins.sh          build (if needed), print the directory
#   scripts/k8s-bins.sh dir      print the directory only (no build)
#
# kube-apiserver's version matches the repo's k8s.io/api (go.mod), so the API
# server serves the same types the agent's client-go decodes.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
DIR=${LANEKIT_K8S_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lanekit/k8s/kube-${K8S_VERSION}_etcd-${ETCD_VERSION}}

if [ "${1:-}" = dir ]; then
  echo "$DIR"
  exit 0
fi

export PATH=$PATH:/usr/local/go/bin
GO=${GO:-go}
mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The wrapper modules must not pick up the repo's workspace or flags.
export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
ldflags="-s -w"

if [ ! -x "$DIR/etcd" ]; then
  echo ">> k8s-bins: building etcd $ETCD_VERSION into $DIR" >&2
  mkdir -p "$work/etcd"
  (
    cd "$work/etcd"
    "$GO" mod init lanekit.local/etcd >/dev/null 2>&1
    for m in server api client/v3 client/pkg pkg; do
      m=${m%/v3}
      "$GO" mod edit -require="go.etcd.io/etcd/$m/v3@$ETCD_VERSION"
    done
    "$GO" build -trimpath -ldflags="$ldflags" -o "$work/etcd.bin" go.etcd.io/etcd/server/v3
  )
  install -m 0755 "$work/etcd.bin" "$DIR/etcd"
fi

if [ ! -x "$DIR/kube-apiserver" ]; then
  echo ">> k8s-bins: building kube-apiserver $K8S_VERSION into $DIR (slow: ~5-10 min)" >&2
  mkdir -p "$work/kube"
  (
    cd "$work/kube"
    "$GO" mod init lanekit.local/kube >/dev/null 2>&1
    "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    # k8s.io/kubernetes requires its staging repos at v0.0.0 and replaces them
    # with ./staging/...; a dependent module replaces each with its published
    # v0.Y.Z instead (Y = the minor of K8S_VERSION).
    staging=${K8S_VERSION/#v1./v0.}
    modfile=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",*$/\1/p')
    [ -f "$modfile" ] || { echo "k8s-bins: no go.mod for k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
    for m in $(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile"); do
      "$GO" mod edit -replace="$m=$m@$staging"
    done
    "$GO" build -trimpath -ldflags="$ldflags" -o "$work/kube-apiserver.bin" k8s.io/kubernetes/cmd/kube-apiserver
  )
  install -m 0755 "$work/kube-apiserver.bin" "$DIR/kube-apiserver"
fi

"$DIR/etcd" --version >/dev/null
"$DIR/kube-apiserver" --version >/dev/null
echo "$DIR"
