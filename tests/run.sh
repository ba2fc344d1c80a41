#!/usr/bin/env bash
# The test command: builds the guests and the control-plane launcher, starts one real
# control plane for the whole run (unless KUBECONFIG names a cluster already), runs every
# Rust test in the workspace against it, and stops everything it started.
#
#   bash tests/run.sh [extra cargo test args...]
#
# It exits non-zero when a test fails, and also when no test ran at all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasm-provisioner/target}"

bash guests/build.sh >/dev/null
launcher=$(bash tests/controlplane/build.sh)
# The end-to-end tests run the host binary as a child process. Built by the same
# command as the tests (not `cargo build -p`, whose feature set differs and would build
# every dependency a second time).
cargo test -q --workspace --no-run

if [ -z "${KUBECONFIG:-}" ]; then
  plane_dir=$(mktemp -d /tmp/wasm-provisioner-controlplane-XXXXXX)
  trap '"$launcher" stop --dir "$plane_dir" || true' EXIT
  started=$(date +%s%N)
  "$launcher" start --dir "$plane_dir" >/dev/null
  export KUBECONFIG="$plane_dir/kubeconfig"
  echo "control plane ready in $(( ($(date +%s%N) - started) / 1000000 )) ms (KUBECONFIG=$KUBECONFIG)"
fi

log=$(mktemp)
chaos_report="$CARGO_TARGET_DIR/tmp/chaos-report.md"
mkdir -p "$(dirname "$chaos_report")"
: > "$chaos_report"
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The guest SDK's and the bundled guests' own tests, native (their workspace is
# guests/, built for wasm32-wasip2 everywhere else).
(cd guests && cargo test --locked -p wasm-provisioner-sdk -p hostpath -p nfs-subdir) 2>&1 | tee -a "$log"
guest_status=${PIPESTATUS[0]}
if [ "$status" -eq 0 ]; then status=$guest_status; fi
set -e
passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
rm -f "$log"
if [ -s "$chaos_report" ]; then
  echo "chaos suite ($(date -u +%Y-%m-%d), $(nproc) cores, $(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1048576 )) GiB):"
  echo "| scenario | result |"
  echo "|---|---|"
  cat "$chaos_report"
fi
echo "tests: $passed passed, $failed failed"
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
if [ "$passed" -eq 0 ]; then
  echo "no test ran: that is a failure" >&2
  exit 1
fi
