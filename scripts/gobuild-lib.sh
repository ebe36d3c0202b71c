# shellcheck shell=bash
# Shared by scripts/k8s-node-bins.sh and scripts/kubevirt-bins.sh (sourced, not
# run): the set-up and helpers that build other projects' binaries from the
# Go module proxy into a cache. The caller sets NAME (its log prefix) and DIR
# (the cache); sourcing creates DIR, sets GO, work (a scratch directory removed
# on exit), the Go environment of the wrapper modules and build (the build
# command).

export PATH=$PATH:/usr/local/go/bin
GO=${GO:-go}
mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The wrapper modules must not pick up the repo's workspace or flags.
export GOWORK=off GOFLAGS="-mod=mod -p=${LANEKIT_BUILD_JOBS:-1}" GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
# shellcheck disable=SC2034 # used by the scripts that source this one
build=(nice -n 19 "$GO" build -trimpath)

log() { echo ">> $NAME: $*" >&2; }

# need NAME...: true if any of the named files is missing from $DIR.
need() {
  local b
  for b in "$@"; do [ -s "$DIR/$b" ] || return 0; done
  return 1
}

# retry CMD...: runs CMD up to LANEKIT_RETRIES (3) times, 10 s apart, so that a
# transient download error of the module proxy does not stop the build; every
# failed try is reported with its exit status (CMD's own stderr says why).
retry() {
  local n=1 max=${LANEKIT_RETRIES:-3} rc
  while true; do
    "$@" && return 0
    rc=$?
    if ((n >= max)); then
      log "FAILED after $n tries (exit $rc): $*"
      return "$rc"
    fi
    log "try $n of $max failed (exit $rc), retrying in 10 s: $*"
    n=$((n + 1))
    sleep 10
  done
}

# timed NAME CMD...: runs CMD (retried), logs how long it took.
timed() {
  local name=$1 start=$SECONDS
  shift
  retry "$@" || exit 1
  log "$name built in $((SECONDS - start)) s"
}

# mod_field MODULE@VERSION FIELD: one field (GoMod, Dir) of `go mod download
# -json`, retried. The errors of that command are in its JSON on stdout
# ("Error"), so they are printed here instead of being filtered away.
mod_field() {
  local out
  if ! out=$(retry "$GO" mod download -json "$1"); then
    echo "$NAME: go mod download $1 failed:" >&2
    echo "$out" | grep -E '"Error"' >&2 || echo "$out" >&2
    exit 1
  fi
  echo "$out" | sed -n "s/^\s*\"$2\": \"\(.*\)\",*\$/\1/p" | tail -n 1
}

# module NAME: creates the wrapper module $work/NAME afresh (a second block
# may set up the same one: a second `go mod init` there would fail, and under
# set -e end the script without a word) and cds into it.
module() {
  rm -rf "${work:?}/$1"
  mkdir -p "$work/$1"
  cd "$work/$1"
  "$GO" mod init "lanekit.local/$1" >/dev/null
}
