#!/usr/bin/env bash
# The load benchmark in one command: builds the guests, the host, the control-plane
# launcher and the Go library's provisioner (bench/golib), starts the local control plane
# (unless KUBECONFIG names a cluster), then for each run creates N claims at once and
# deletes them, and prints the figures (see docs/benchmarks.md, "Load benchmark").
#
#   bash bench/load.sh [--release] [--claims N] [--runs ceiling,defaults,unthrottled,start]
#                      [--threads T] [--concurrency C] [--out DIR]
#   bash bench/load.sh --release --runs ceiling,go-library,unthrottled
#
# `--release` builds optimised, with the release profile's LTO (a second full build of
# the dependencies the first time, about 12 minutes on two cores);
# without it the host is the test build (dependencies at opt-level 1, our crates at 0).
# Exits non-zero when a run did not bind or delete every claim.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasm-provisioner/target}"
profile=debug
if [ "${1:-}" = "--release" ]; then
  shift
  profile=release
fi
bash guests/build.sh >/dev/null
bash tests/controlplane/build.sh >/dev/null
# The go-library runs' binary (cached; after the launcher's build, mostly a link).
WASM_PROVISIONER_GO_LIBRARY=$(bash bench/golib/build.sh)
export WASM_PROVISIONER_GO_LIBRARY
if [ "$profile" = release ]; then
  # Only the two binaries: the release profile links with whole-program LTO, which
  # every test binary would pay too.
  cargo build -q --locked --release -p wasm-provisioner --bin wasm-provisioner \
    -p wasm-provisioner-bench --bin load
else
  # The test command's build and the binaries: with the test targets selected, the
  # feature set is the test command's, so every artifact is shared with the tests (`cargo
  # test --no-run` alone builds no binary of this package, which has no integration test;
  # `cargo build -p` would resolve other features and build the dependencies again).
  cargo build -q --workspace --bins --tests
fi
exec "$CARGO_TARGET_DIR/$profile/load" "$@"
