#!/usr/bin/env bash
# Builds dist/{{name}}.wasm with componentize-js (pinned by package-lock.json), installed
# into node_modules by `npm ci` on first use. NODE_MODULES_DIR names another
# node_modules installed from the same lock (it is linked here).
set -euo pipefail
cd "$(dirname "$0")"
if [ -n "${NODE_MODULES_DIR:-}" ]; then
    ln -sfn "$NODE_MODULES_DIR" node_modules
elif [ ! -d node_modules ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2
fi
mkdir -p dist
node componentize.mjs app.js dist/{{name}}.wasm wit >&2
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
