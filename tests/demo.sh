#!/usr/bin/env bash
# The main job in one command: builds the guests, the host and the control-plane
# launcher, starts the local control plane (unless KUBECONFIG names a cluster), runs the
# host against it with example StorageClasses for both guests, provisions a sample
# claim of each and shows the PVs Bound. Ctrl-C (or SIGTERM, SIGHUP) deletes the claims
# and tears it all down.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasm-provisioner/target}"
bash guests/build.sh >/dev/null
bash tests/controlplane/build.sh >/dev/null
# The test command's build (same feature set, so it shares every artifact with the tests).
cargo test -q --workspace --no-run
exec "$CARGO_TARGET_DIR/debug/demo"
