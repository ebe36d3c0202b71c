#!/usr/bin/env bash
# Builds the lanekit test guest: Debian's cloud kernel (extracted, never installed)
# and a gzip'd newc initramfs with busybox-static, the virtio-net modules, ethtool,
# the benchmark servers (iperf3, sockperf, and lk-bench: the harness's Go connection-rate
# tool built static from pkg/bench/cmd/lk-bench) and scripts/guest/init. Idempotent and cached: a second run with the same inputs
# only prints the paths.
#
#   scripts/guest/build.sh [--refresh] [CACHE_DIR]     (default /var/cache/lanekit/guest)
#
# Last two lines of stdout:  KERNEL=<path>  INITRD=<path>
#
# Cache layout:
#   CACHE/debs/*.deb              apt-get download of linux-image-cloud-amd64 + its image
#   CACHE/kernel/<kver>/          dpkg-deb -x of the image package
#   CACHE/kernel.version          the <kver> in use (delete or --refresh to re-resolve)
#   CACHE/vmlinuz                 the kernel to boot
#   CACHE/initrd.img              the initramfs
#   CACHE/initrd.stamp            hash of every input of initrd.img
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
refresh=0
if [ "${1:-}" = --refresh ]; then refresh=1; shift; fi
cache=${1:-/var/cache/lanekit/guest}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# One builder at a time per cache dir (go test runs packages in parallel).
exec 9>"$cache/.lock"
flock -w 600 9 || { echo "build.sh: lock $cache/.lock: timeout" >&2; exit 1; }

log() { echo ">> guest: $*" >&2; }

# Packages the build needs, installed with apt when missing (fresh machine).
need=()
for p in busybox-static cpio ethtool iperf3 sockperf kmod xz-utils zstd; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
	log "apt: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- kernel -------------------------------------------------------------------
kver=$(cat "$cache/kernel.version" 2>/dev/null || true)
if ((refresh)) || [ -z "$kver" ] || [ ! -s "$cache/kernel/$kver/boot/vmlinuz-$kver" ]; then
	apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || apt-get update -qq
	dep=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	[ -n "$dep" ] || { echo "build.sh: resolve linux-image-cloud-amd64 dependency: none found" >&2; exit 1; }
	kver=${dep#linux-image-}
	if [ ! -s "$cache/kernel/$kver/boot/vmlinuz-$kver" ]; then
		log "downloading $dep"
		mkdir -p "$cache/debs"
		(cd "$cache/debs" && apt-get download -q linux-image-cloud-amd64 "$dep" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
		deb=$(ls -t "$cache/debs/${dep}_"*.deb 2>/dev/null | head -1)
		[ -n "$deb" ] || { echo "build.sh: apt-get download $dep: no .deb" >&2; exit 1; }
		rm -rf "$cache/kernel/$kver.tmp"
		mkdir -p "$cache/kernel"
		dpkg-deb -x "$deb" "$cache/kernel/$kver.tmp"
		rm -rf "$cache/kernel/$kver"
		mv "$cache/kernel/$kver.tmp" "$cache/kernel/$kver"
	fi
	echo "$kver" >"$cache/kernel.version"
fi
ktree=$cache/kernel/$kver
if ! cmp -s "$ktree/boot/vmlinuz-$kver" "$cache/vmlinuz"; then
	cp "$ktree/boot/vmlinuz-$kver" "$cache/vmlinuz.tmp" && mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
fi

# --- initramfs ----------------------------------------------------------------
mods=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net)
bb=/bin/busybox
[ -x "$bb" ] || bb=$(command -v busybox)
ethtool_bin=$(command -v ethtool || echo /usr/sbin/ethtool)
iperf3_bin=$(command -v iperf3 || echo /usr/bin/iperf3)
sockperf_bin=$(command -v sockperf || echo /usr/bin/sockperf)
dyn_bins=("$ethtool_bin" "$iperf3_bin" "$sockperf_bin")
libs=$(ldd "${dyn_bins[@]}" | awk '/=>/ {print $3} /^\s*\/.*ld-linux/ {print $1}' | sort -u)

# lk-bench: static Go binary (CGO_ENABLED=0) from this checkout, rebuilt when its
# sources change (Go's build cache makes an unchanged rebuild cheap).
repo=$(cd "$here/../.." && pwd)
gobin=$(command -v go || echo /usr/local/go/bin/go)
lkbench=$cache/lk-bench
if [ -x "$gobin" ] && [ -f "$repo/go.mod" ]; then
	(cd "$repo" && CGO_ENABLED=0 "$gobin" build -trimpath -ldflags='-s -w' \
		-o "$lkbench.tmp" ./pkg/bench/cmd/lk-bench) >&2 || { echo "build.sh: go build lk-bench failed" >&2; exit 1; }
	if cmp -s "$lkbench.tmp" "$lkbench"; then rm -f "$lkbench.tmp"; else mv "$lkbench.tmp" "$lkbench"; fi
elif [ ! -x "$lkbench" ]; then
	echo "build.sh: go not found (PATH or /usr/local/go/bin) and no cached $lkbench" >&2
	exit 1
fi
stamp=$( {
	echo "kver=$kver mods=${mods[*]}"
	sha256sum "$0" "$here/init" "$here/lk-responder" "$bb" "${dyn_bins[@]}" "$lkbench" $libs
} | sha256sum | cut -d' ' -f1)
if [ -s "$cache/initrd.img" ] && [ "$(cat "$cache/initrd.stamp" 2>/dev/null)" = "$stamp" ]; then
	log "up to date ($kver)"
	echo "KERNEL=$cache/vmlinuz"
	echo "INITRD=$cache/initrd.img"
	exit 0
fi

log "building initramfs for $kver"
root=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,etc,www,lib/modules/lk}
cp "$bb" "$root/bin/busybox"
for a in $("$bb" --list); do
	[ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"
done
ln -s bin "$root/sbin"
install -m 0755 "$here/init" "$root/init"
install -m 0755 "$here/lk-responder" "$root/bin/lk-responder"
echo "lanekit guest" >"$root/www/index.html"

# ethtool (busybox has none), iperf3 and sockperf with the shared libraries ldd
# reports; lk-bench is static.
install -m 0755 "$ethtool_bin" "$root/bin/ethtool"
install -m 0755 "$iperf3_bin" "$root/bin/iperf3"
install -m 0755 "$sockperf_bin" "$root/bin/sockperf"
install -m 0755 "$lkbench" "$root/bin/lk-bench"
for l in $libs; do
	mkdir -p "$root$(dirname "$l")"
	cp -L "$l" "$root$l"
done
# The x86-64 loader path compiled into binaries is /lib64/ld-linux-x86-64.so.2.
if [ ! -e "$root/lib64/ld-linux-x86-64.so.2" ]; then
	mkdir -p "$root/lib64"
	cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
fi

# Virtio modules in load order; decompress .ko.xz / .ko.zst; skip built-ins.
moddir=$ktree/lib/modules/$kver
: >"$root/etc/lk-modules"
i=0
for m in "${mods[@]}"; do
	i=$((i + 1))
	f=$(find "$moddir/kernel" \( -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" -o -name "$m.ko.gz" \) | head -1)
	if [ -z "$f" ]; then
		if grep -q "/$m.ko$" "$moddir/modules.builtin" 2>/dev/null; then
			log "$m is built in"
			continue
		fi
		echo "build.sh: module $m not found under $moddir" >&2
		exit 1
	fi
	dst=$root/lib/modules/lk/$(printf %02d $i)-$m.ko
	case "$f" in
	*.ko.xz) xz -dc "$f" >"$dst" ;;
	*.ko.zst) zstd -qdc "$f" >"$dst" ;;
	*.ko.gz) gzip -dc "$f" >"$dst" ;;
	*) cp "$f" "$dst" ;;
	esac
	echo "/lib/modules/lk/$(basename "$dst")" >>"$root/etc/lk-modules"
done

(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) | gzip -6 -n >"$cache/initrd.img.tmp"
mv "$cache/initrd.img.tmp" "$cache/initrd.img"
echo "$stamp" >"$cache/initrd.stamp"
log "initrd $(du -h "$cache/initrd.img" | cut -f1)"
echo "KERNEL=$cache/vmlinuz"
echo "INITRD=$cache/initrd.img"
