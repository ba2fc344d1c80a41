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
"$venv/bin/python" -c 'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' \
    -d wit -w provisioner componentize -p src -p sdk app -o dist/{{name}}.wasm >&2
echo "build.sh: dist/{{name}}.wasm ($(wc -c < dist/{{name}}.wasm) bytes)" >&2
