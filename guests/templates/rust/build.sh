#!/usr/bin/env bash
# Builds dist/{{name}}.wasm (a component for wasm32-wasip2, release profile).
set -euo pipefail
cd "$(dirname "$0")"
if ! rustc --print target-libdir --target wasm32-wasip2 >/dev/null 2>&1 ||
    [ ! -d "$(rustc --print target-libdir --target wasm32-wasip2)" ]; then
    rustup target add wasm32-wasip2 >&2
fi
cargo build --release --target wasm32-wasip2 >&2
mkdir -p dist
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate_name}}.wasm" dist/{{name}}.wasm
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
