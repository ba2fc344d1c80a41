#!/usr/bin/env bash
# Builds the Go library provisioner of the load benchmark (a hostpath provisioner on
# sig-storage-lib-external-provisioner, see main.go) and prints its path.
#
# The binary is cached outside the repository, keyed on go.mod, go.sum and the sources,
# like the control-plane launcher (tests/controlplane/build.sh). go.mod pins every shared
# module to the launcher's versions and both build with -trimpath, so after the launcher's
# build Go's build cache (GOCACHE) holds client-go and the rest: this compiles the library
# and links (cold caches: a few minutes on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${WASM_PROVISIONER_CACHE:-$HOME/.cache/wasm-provisioner}/golib"
key=$(cat "$here/go.mod" "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-16)
binary="$cache/golib-$key"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$cache"
cd "$here"
echo "building the Go library provisioner (sig-storage-lib-external-provisioner)" >&2
started=$(date +%s)
go build -mod=readonly -trimpath -ldflags "-s -w" -o "$binary.tmp.$$" .
mv "$binary.tmp.$$" "$binary"
# Keep the three newest builds (checkouts of different commits share this cache).
ls -t "$cache"/golib-* 2>/dev/null | grep -v '\.tmp\.' | tail -n +4 | xargs -r rm -f
echo "built $binary in $(( $(date +%s) - started ))s" >&2
echo "$binary"
