#!/usr/bin/env bash
# CI: the committed bpf2go output (objects and Go bindings, constants
# included) of every package that generates BPF must be what the C sources in
# bpf/ compile to. Regenerates each package in a scratch copy and compares.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

mapfile -t pkgs < <(git grep -l 'go:generate go tool bpf2go' -- '*.go' | xargs -n1 dirname | sort -u)
if ((${#pkgs[@]} == 0)); then
  echo "check-generated: no bpf2go package found" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r go.mod go.sum bpf "$tmp/"
for p in "${pkgs[@]}"; do
  mkdir -p "$tmp/$p"
  git grep -l 'go:generate go tool bpf2go' -- "$p/*.go" | xargs -I{} cp {} "$tmp/$p/"
done
(cd "$tmp" && "$GO" generate $(printf './%s/ ' "${pkgs[@]}"))

stale=0
for p in "${pkgs[@]}"; do
  for f in "$tmp/$p"/*_bpfel.*; do
    cmp -s "$f" "$p/$(basename "$f")" || { echo "$p/$(basename "$f") is stale"; stale=1; }
  done
  for f in "$p"/*_bpfel.*; do
    [ -e "$tmp/$f" ] || { echo "$f is not generated any more"; stale=1; }
  done
done
if [ $stale = 1 ]; then
  echo "generated BPF files differ from bpf/: run make generate and commit" >&2
  exit 1
fi
echo "generated BPF files are up to date (${pkgs[*]})"
