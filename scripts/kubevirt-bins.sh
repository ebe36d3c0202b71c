#!/usr/bin/env bash
# Builds real KubeVirt and Multus from the Go module proxy into a per-machine
# cache beside the node binaries (scripts/k8s-node-bins.sh), for
# `lanekit lab up --k8s --kubelet --kubevirt`. Opt-in (`make kubevirt-bins`),
# not part of `make deps`: the first build takes tens of minutes on two cores.
# Idempotent: skips what exists.
#
#   scripts/kubevirt-bins.sh          build (if needed), check, print the directory
#   scripts/kubevirt-bins.sh dir      print the directory only (no build)
#
# KubeVirt (kubevirt.io/kubevirt $KUBEVIRT_VERSION): virt-operator, virt-api,
# virt-controller, virt-handler, virt-launcher, virt-launcher-monitor,
# virt-chroot, virt-freezer, virt-probe, virt-tail, virt-exportserver,
# virt-exportproxy (a Deployment virt-operator always creates), virtctl,
# libvirt-hook-client (virt-launcher's QEMU hook),
# and container-disk (the static C binary of container disk images, as
# hack/build-go.sh builds it). Multus (gopkg.in/k8snetworkplumbingwg/multus-cni.v4
# $MULTUS_VERSION): the thin plugin (multus) its multus-daemonset.yml installs,
# and the thick one (multus-daemon, multus-shim, install_multus, passthru) that
# deployments/multus-daemonset-thick.yml installs (copied to manifests/).
#
# How the wrapper module is put together: kubevirt.io/kubevirt's own go.mod
# `replace`s its staging repos (kubevirt.io/api, kubevirt.io/client-go) with
# directories, which a dependent module cannot see: they point at the same
# published $KUBEVIRT_VERSION here; its other replaces are copied. Four modules
# it imports are refused by the module proxy (403): kubevirt.io/virt-template-api,
# -client-go, -engine v0.2.0 and libguestfs.org/libnbd. They are replaced with
# the directories in third_party/kubevirt/ (see the README there: the first three
# are upstream's v0.2.0 source, trimmed to the packages the binaries link;
# libnbd is a stand-in whose calls fail).
#
# virt-launcher links libvirt through cgo (libvirt.org/go/libvirt): it is built
# against libvirt-dev from bookworm-backports (11.3, the libvirt of the
# virt-launcher image); this script adds that apt source and installs
# libvirt-dev when pkg-config finds no libvirt >= $LIBVIRT_MIN (root only).
# Builds run under `nice -n 19` with `-p 1` (LANEKIT_BUILD_JOBS to change it).
set -euo pipefail

KUBEVIRT_VERSION=v1.9.0 # v1.9.1+ are refused by the module proxy
MULTUS_VERSION=v4.2.3
LIBVIRT_MIN=11.3.0
REPO=$(cd "$(dirname "$0")/.." && pwd)
NODE_DIR=$("$REPO/scripts/k8s-node-bins.sh" dir)
DIR=${LANEKIT_KUBEVIRT_BIN_DIR:-$(dirname "$NODE_DIR")/kubevirt-${KUBEVIRT_VERSION}_multus-${MULTUS_VERSION}}

if [ "${1:-}" = dir ]; then
  echo "$DIR"
  exit 0
fi

NAME=kubevirt-bins
# shellcheck source=scripts/gobuild-lib.sh
source "$(dirname "$0")/gobuild-lib.sh"

# kubevirt_module: the wrapper module for kubevirt.io/kubevirt (see above).
kubevirt_module() {
  module kubevirt
  "$GO" mod edit -go=1.26.0 -require="kubevirt.io/kubevirt@$KUBEVIRT_VERSION"
  local modfile line m
  modfile=$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" GoMod)
  [ -f "$modfile" ] || { echo "kubevirt-bins: no go.mod for kubevirt.io/kubevirt@$KUBEVIRT_VERSION" >&2; exit 1; }
  # Its replace block: `OLD => NEW VERSION` lines are copied, `OLD => ./dir` ones
  # (the staging repos) become the published module at $KUBEVIRT_VERSION.
  while read -r line; do
    set -- $line
    if [ "$#" = 4 ]; then
      "$GO" mod edit -replace="$1=$3@$4"
    elif [ "$#" = 3 ] && [ "${3#./}" != "$3" ]; then
      "$GO" mod edit -replace="$1=$1@$KUBEVIRT_VERSION"
    fi
  done < <(sed -n '/^replace (/,/^)/{/=>/p}' "$modfile")
  grep -q "kubevirt.io/api => kubevirt.io/api $KUBEVIRT_VERSION" go.mod ||
    { echo "kubevirt-bins: kubevirt.io/api is not replaced in the wrapper module" >&2; exit 1; }
  for m in virt-template-api virt-template-client-go virt-template-engine; do
    "$GO" mod edit -replace="kubevirt.io/$m=$REPO/third_party/kubevirt/$m"
  done
  "$GO" mod edit -replace="libguestfs.org/libnbd=$REPO/third_party/kubevirt/libnbd"
  # Upstream's go.sum: its dependencies are checked against the hashes it
  # recorded (the checksum database answers 404 for some of them, e.g.
  # github.com/rhobs/operator-observability-toolkit).
  cp "$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" Dir)/go.sum" go.sum
}

kubevirt_ldflags() {
  local p=kubevirt.io/client-go/version
  echo "-s -w -X $p.gitVersion=$KUBEVIRT_VERSION -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
}

# Local changes to upstream's source, each a patch in third_party/kubevirt/patches
# (see the README there), for the binaries named here: they are built against a
# patched copy of the module in $work (`go build -overlay` refuses files in the
# module cache), the others against upstream's. A binary built before the
# patches changed is built again ($DIR/BIN.patches holds their sum).
patched_bins=(virt-handler)
patch_files=("$REPO"/third_party/kubevirt/patches/*.patch)
patch_sum=$(cat "${patch_files[@]}" | sha256sum | cut -d' ' -f1)
for b in "${patched_bins[@]}"; do
  [ "$(cat "$DIR/$b.patches" 2>/dev/null)" = "$patch_sum" ] || rm -f "$DIR/$b"
done

# kubevirt_patched: (in the wrapper module) replaces kubevirt.io/kubevirt with a
# copy of its source in $work/kubevirt-patched with the patches applied.
kubevirt_patched() {
  local src p dst=$work/kubevirt-patched
  if [ ! -d "$dst" ]; then
    src=$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" Dir)
    cp -r "$src" "$dst.tmp"
    chmod -R u+w "$dst.tmp"
    git -C "$dst.tmp" init -q
    for p in "${patch_files[@]}"; do
      git -C "$dst.tmp" apply "$p" ||
        { echo "kubevirt-bins: $p does not apply to kubevirt.io/kubevirt@$KUBEVIRT_VERSION" >&2; exit 1; }
    done
    rm -rf "$dst.tmp/.git"
    mv "$dst.tmp" "$dst"
  fi
  "$GO" mod edit -replace="kubevirt.io/kubevirt=$dst"
}

# The pure-Go binaries first (virt-handler's node labeller has a little cgo, no
# libraries), virt-launcher last: it needs libvirt-dev.
kv_bins=(virt-operator virt-api virt-controller virt-handler virt-chroot virt-launcher-monitor
  virt-freezer virt-probe virt-tail virt-exportserver virt-exportproxy virtctl manifest-templator
  libvirt-hook-client)
if need "${kv_bins[@]}"; then
  log "building KubeVirt $KUBEVIRT_VERSION into $DIR (slow: tens of minutes)"
  (
    kubevirt_module
    ldflags=$(kubevirt_ldflags)
    for b in "${kv_bins[@]}"; do
      need "$b" || continue
      pkg=kubevirt.io/kubevirt/cmd/$b
      [ "$b" != manifest-templator ] || pkg=kubevirt.io/kubevirt/tools/$b
      # virt-launcher links /etc/libvirt/hooks/qemu to it at start.
      [ "$b" != libvirt-hook-client ] || pkg=kubevirt.io/kubevirt/cmd/virt-launcher/$b
      patched=false
      if [[ " ${patched_bins[*]} " == *" $b "* ]]; then
        patched=true
        kubevirt_patched
      fi
      timed "$b" "${build[@]}" -ldflags "$ldflags" -o "$work/$b.bin" "$pkg"
      install -m 0755 "$work/$b.bin" "$DIR/$b"
      if $patched; then
        echo "$patch_sum" >"$DIR/$b.patches"
        "$GO" mod edit -dropreplace=kubevirt.io/kubevirt
      fi
    done
  )
fi

if need container-disk; then
  log "building container-disk into $DIR"
  (
    module cd
    src=$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" Dir)
    nice -n 19 gcc -static -Os -s -o "$work/container-disk.bin" "$src/cmd/container-disk-v2alpha/main.c"
  )
  install -m 0755 "$work/container-disk.bin" "$DIR/container-disk"
fi

libvirt_ok() { pkg-config --atleast-version="$LIBVIRT_MIN" libvirt 2>/dev/null; }
if need virt-launcher; then
  if ! libvirt_ok; then
    [ "$(id -u)" = 0 ] || { echo "kubevirt-bins: virt-launcher needs libvirt-dev >= $LIBVIRT_MIN (run as root to install it from bookworm-backports)" >&2; exit 1; }
    src=/etc/apt/sources.list.d/lanekit-bookworm-backports.sources
    if [ ! -f "$src" ]; then
      log "adding bookworm-backports ($src) for libvirt-dev $LIBVIRT_MIN"
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$src"
    fi
    export DEBIAN_FRONTEND=noninteractive
    retry apt-get update -qq
    retry apt-get install -y -qq --no-install-recommends -t bookworm-backports libvirt-dev >/dev/null
    libvirt_ok || { echo "kubevirt-bins: libvirt-dev from bookworm-backports is not >= $LIBVIRT_MIN: $(pkg-config --modversion libvirt)" >&2; exit 1; }
  fi
  log "building virt-launcher (cgo, libvirt $(pkg-config --modversion libvirt)) into $DIR"
  (
    kubevirt_module
    CGO_ENABLED=1 timed virt-launcher "${build[@]}" -ldflags "$(kubevirt_ldflags)" \
      -o "$work/virt-launcher.bin" kubevirt.io/kubevirt/cmd/virt-launcher
  )
  install -m 0755 "$work/virt-launcher.bin" "$DIR/virt-launcher"
fi

# The files upstream's virt-launcher image carries besides the binaries
# (cmd/virt-launcher: libvirt and QEMU configuration, the libvirt qemu hook,
# the node labeller's script); internal/tools/lkimages puts them in place.
if need launcher-files/qemu.conf launcher-files/virtqemud.conf launcher-files/nsswitch.conf \
  launcher-files/node-labeller.sh launcher-files/qemu; then
  (
    module files
    src=$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" Dir)/cmd/virt-launcher
    mkdir -p "$DIR/launcher-files"
    for f in qemu.conf virtqemud.conf nsswitch.conf node-labeller/node-labeller.sh qemu; do
      install -m 0644 "$src/$f" "$DIR/launcher-files/$(basename "$f")"
    done
  )
fi

# The release manifests, rendered as hack/build-manifests.sh renders them
# (first the file includes, then the variables), with upstream's image names
# (quay.io/kubevirt/NAME:$KUBEVIRT_VERSION, which internal/tools/lkimages tags).
if need manifests/kubevirt-operator.yaml manifests/kubevirt-cr.yaml; then
  log "rendering the KubeVirt release manifests into $DIR/manifests"
  (
    module render
    src=$(mod_field "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" Dir)
    mkdir -p "$DIR/manifests"
    for m in kubevirt-operator kubevirt-cr; do
      "$DIR/manifest-templator" --process-files --generated-manifests-dir="$src/manifests/generated/" \
        --input-file="$src/manifests/release/$m.yaml.in" >"$work/$m.yaml.in"
      "$DIR/manifest-templator" --process-vars --namespace=kubevirt --container-prefix=quay.io/kubevirt \
        --container-tag="$KUBEVIRT_VERSION" --image-pull-policy=IfNotPresent --verbosity=2 \
        --kubevirt-logo-path="$src/assets/kubevirt_logo.png" \
        --input-file="$work/$m.yaml.in" >"$work/$m.yaml"
      sed -i -e '${/^$/d;}' "$work/$m.yaml"
      install -m 0644 "$work/$m.yaml" "$DIR/manifests/$m.yaml"
    done
  )
fi

# install_multus copies multus-shim and passthru (cmd/passthru-cni) to the node.
multus_bins=(multus multus-daemon multus-shim install_multus passthru)
if need "${multus_bins[@]}"; then
  log "building Multus $MULTUS_VERSION into $DIR"
  (
    module multus
    m=gopkg.in/k8snetworkplumbingwg/multus-cni.v4
    "$GO" mod edit -require="$m@$MULTUS_VERSION"
    # hack/build-go.sh's version stamp.
    ldflags="-s -w -X $m/pkg/multus.version=$MULTUS_VERSION -X $m/pkg/multus.releaseStatus=released"
    for b in "${multus_bins[@]}"; do
      pkg=$m/cmd/$b
      [ "$b" != passthru ] || pkg=$m/cmd/passthru-cni
      CGO_ENABLED=0 timed "$b" "${build[@]}" -ldflags "$ldflags" -o "$work/$b.bin" "$pkg"
      install -m 0755 "$work/$b.bin" "$DIR/$b"
    done
  )
fi
if need manifests/multus-daemonset-thick.yml; then
  (
    module multus-manifest
    src=$(mod_field "gopkg.in/k8snetworkplumbingwg/multus-cni.v4@$MULTUS_VERSION" Dir)
    mkdir -p "$DIR/manifests"
    install -m 0644 "$src/deployments/multus-daemonset-thick.yml" "$DIR/manifests/multus-daemonset-thick.yml"
  )
fi

# Every binary runs; those that print a version print the pinned one.
check() {
  local b=$1 want=$2
  shift 2
  local out
  out=$("$DIR/$b" "$@" 2>&1) || { echo "kubevirt-bins: $b $* failed: $out" >&2; exit 1; }
  case $out in
    *"$want"*) ;;
    *) echo "kubevirt-bins: $b $*: want $want in: $out" >&2; exit 1 ;;
  esac
}
check virtctl "$KUBEVIRT_VERSION" version --client
check virt-operator "" --help
check virt-api "" --help
check virt-controller "" --help
check virt-exportproxy "" --help
check virt-handler "" --help
check virt-launcher "" --help
check virt-chroot "" --help
check multus "$MULTUS_VERSION" -version
# multus-daemon -version prints its version and exits 1.
case $("$DIR/multus-daemon" -version 2>&1 || true) in
  *"$MULTUS_VERSION"*) ;;
  *) echo "kubevirt-bins: multus-daemon -version does not say $MULTUS_VERSION" >&2; exit 1 ;;
esac
for f in manifests/kubevirt-operator.yaml manifests/kubevirt-cr.yaml manifests/multus-daemonset-thick.yml; do
  grep -q "quay.io/kubevirt/virt-operator:$KUBEVIRT_VERSION\|kind: KubeVirt\|multus" "$DIR/$f" ||
    { echo "kubevirt-bins: $DIR/$f is not the manifest expected" >&2; exit 1; }
done
echo "$DIR"
