#!/usr/bin/env bash
# Builds dist/{{name}}.wasm with the SDK's build (wasm-provisioner-sdk's componentize.mjs)
# and componentize-js, all pinned by package-lock.json and installed into node_modules by
# `npm ci` on first use (again when package-lock.json changes). NODE_MODULES_DIR names
# another node_modules installed from the same lock (it is linked here).
set -euo pipefail
cd "$(dirname "$0")"
if [ -n "${NODE_MODULES_DIR:-}" ]; then
    ln -sfn "$NODE_MODULES_DIR" node_modules
elif [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2
fi
mkdir -p dist
node node_modules/wasm-provisioner-sdk/componentize.mjs app.js dist/{{name}}.wasm wit >&2
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
