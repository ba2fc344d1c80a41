#!/usr/bin/env bash
# Builds dist/{{name}}.wasm with componentize-py (pinned in requirements.txt), installed
# into .venv on first use. COMPONENTIZE_PY_VENV names another venv that has it.
set -euo pipefail
cd "$(dirname "$0")"
venv="${COMPONENTIZE_PY_VENV:-.venv}"
if [ ! -e "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import componentize_py' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: -r requirements.txt >&2
fi
mkdir -p dist
# The world exports exactly the capabilities the plugin defines (see
# sdk/wasm_provisioner_world.py): written to a temporary directory beside the contract.
world="$(mktemp -d)"
trap 'rm -rf "$world"' EXIT
"$venv/bin/python" sdk/wasm_provisioner_world.py src/app.py wit "$world" >&2
"$venv/bin/python" -c 'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' \
    -d "$world" -w guest componentize -p src -p sdk app -o dist/{{name}}.wasm >&2
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
