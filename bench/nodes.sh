#!/usr/bin/env bash
# The node-local benchmark in one command: builds the guests, the host and the
# control-plane launcher, then (on the control plane KUBECONFIG names, else the one the
# test support starts, with kube-scheduler) runs N pods with WaitForFirstConsumer claims
# over K nodes, in Deployment mode and in node-local mode, and prints the table (see
# docs/benchmarks.md, "Node-local mode").
#
#   bash bench/nodes.sh [--release] [--nodes 3,50] [--claims N] [--out DIR]
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
if [ "$profile" = release ]; then
  cargo build -q --locked --release -p wasm-provisioner --bin wasm-provisioner \
    -p wasm-provisioner-bench --bin nodes
else
  cargo build -q --workspace --bins --tests
fi
exec "$CARGO_TARGET_DIR/$profile/nodes" "$@"
