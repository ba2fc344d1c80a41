#!/usr/bin/env bash
# Builds dist/{{name}}.wasm with componentize-py.
#
# - The toolchain, componentize-py (pinned in build-requirements.txt), goes into .venv
#   on first use; COMPONENTIZE_PY_VENV names another venv that has it.
# - The plugin's dependencies (requirements.txt: the SDK wasm-provisioner-sdk, pinned)
#   go into .deps with `pip install --target`, again whenever requirements.txt changes;
#   componentize-py bundles them into the component (`-p .deps`).
set -euo pipefail
cd "$(dirname "$0")"
venv="${COMPONENTIZE_PY_VENV:-.venv}"
if [ ! -e "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import componentize_py' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: -r build-requirements.txt >&2
fi
stamp=".deps/.requirements-$("$venv/bin/python" -c 'import hashlib; print(hashlib.sha256(open("requirements.txt", "rb").read()).hexdigest()[:16])')"
if [ ! -e "$stamp" ]; then
    rm -rf .deps.tmp
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        --target .deps.tmp -r requirements.txt >&2
    touch ".deps.tmp/$(basename "$stamp")"
    rm -rf .deps
    mv .deps.tmp .deps
fi
mkdir -p dist
# The world exports exactly the capabilities the plugin defines (the SDK's
# wasm_provisioner_world): written to a temporary directory beside the contract.
world="$(mktemp -d)"
trap 'rm -rf "$world"' EXIT
PYTHONPATH=.deps "$venv/bin/python" -m wasm_provisioner_world src/app.py wit "$world" >&2
"$venv/bin/python" -c 'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' \
    -d "$world" -w guest componentize -p src -p .deps app -o dist/{{name}}.wasm >&2
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
