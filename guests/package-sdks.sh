#!/usr/bin/env bash
# Packages the three guest SDKs as their registries would ship them, into OUT_DIR:
#
#   bash guests/package-sdks.sh OUT_DIR
#
#   wasm-provisioner-sdk-<v>.crate   `cargo package` of guests/sdk (crates.io), and
#   wasm-provisioner-sdk-<v>/        that crate unpacked (a path for `guest new --sdk-path`)
#   wasm_provisioner_sdk-<v>-py3-none-any.whl   the Python SDK (PyPI), built by the
#                                    pinned setuptools of guests/python/sdk/pyproject.toml
#   wasm-provisioner-sdk-<v>.tgz     `npm pack` of guests/js/sdk (npm)
#
# Each is checked: it holds what it must (the crate its WIT, the wheel both modules, the
# tarball the SDK and its build) at the version of the workspace. The Python build
# backend is installed once into a venv under ~/.cache/wasm-provisioner/ (keyed by the
# pin); the crate is packaged without verification (`--no-verify`: the tests build a
# project against the unpacked crate instead). Prints OUT_DIR on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: package-sdks.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cache="${WASM_PROVISIONER_CACHE:-$HOME/.cache/wasm-provisioner}"
export CARGO_TARGET_DIR="${GUESTS_TARGET_DIR:-$cache/guests-target}"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS RUSTC_WORKSPACE_WRAPPER

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -n 1)"
fail() { echo "package-sdks.sh: $*" >&2; exit 1; }

# Rust: the crate, then unpacked. --allow-dirty: the package is the working tree.
(cd "$here" && cargo package --quiet --locked --no-verify --allow-dirty -p wasm-provisioner-sdk) >&2
crate="$CARGO_TARGET_DIR/package/wasm-provisioner-sdk-$version.crate"
[ -f "$crate" ] || fail "cargo package made no $crate"
cp "$crate" "$out/"
rm -rf "$out/wasm-provisioner-sdk-$version"
tar -xzf "$out/wasm-provisioner-sdk-$version.crate" -C "$out"
for file in Cargo.toml README.md src/lib.rs src/quantity.rs wit/provisioner.wit; do
    [ -f "$out/wasm-provisioner-sdk-$version/$file" ] || fail "the crate lacks $file"
done
path_deps="$(cargo metadata --quiet --offline --no-deps --format-version 1 \
    --manifest-path "$out/wasm-provisioner-sdk-$version/Cargo.toml" |
    python3 -c 'import json, sys; print(" ".join(d["name"] for p in json.load(sys.stdin)["packages"] for d in p["dependencies"] if d.get("path")))')"
[ -z "$path_deps" ] || fail "the crate has path dependencies: $path_deps"

# Python: a wheel, built in a copy (setuptools writes build/ and *.egg-info beside the
# sources) by the backend pinned in pyproject.toml.
backend="$(sed -n 's/^requires = \["\(setuptools==[0-9.]*\)"\]$/\1/p' "$here/python/sdk/pyproject.toml")"
[ -n "$backend" ] || fail "guests/python/sdk/pyproject.toml pins no setuptools==X in [build-system] requires"
venv="$cache/python-packaging-$(echo "$backend" | sha256sum | cut -c1-16)"
if [ ! -e "$venv/.installed" ]; then
    rm -rf "$venv.tmp.$$"
    python3 -m venv "$venv.tmp.$$"
    "$venv.tmp.$$/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: "$backend" >&2
    touch "$venv.tmp.$$/.installed"
    rm -rf "$venv"
    mv "$venv.tmp.$$" "$venv"
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -r "$here/python/sdk" "$scratch/python-sdk"
rm -rf "$scratch/python-sdk/tests" "$scratch/python-sdk/__pycache__" "$scratch/python-sdk/build" \
    "$scratch/python-sdk/"*.egg-info
"$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -w "$out" "$scratch/python-sdk" >&2
wheel="$out/wasm_provisioner_sdk-$version-py3-none-any.whl"
[ -f "$wheel" ] || fail "pip wheel made no $wheel"
listing="$(python3 -m zipfile -l "$wheel")"
for module in wasm_provisioner_sdk.py wasm_provisioner_world.py; do
    grep -q " *$module " <<<"$listing" || fail "the wheel lacks $module"
done

# JavaScript: npm pack (no dependencies to install; the toolchain is a peer).
js_version="$(node -p "require('$here/js/sdk/package.json').version")"
[ "$js_version" = "$version" ] || fail "guests/js/sdk/package.json is $js_version, the workspace $version"
(cd "$out" && npm pack --silent "$here/js/sdk") >/dev/null
tgz="$out/wasm-provisioner-sdk-$version.tgz"
[ -f "$tgz" ] || fail "npm pack made no $tgz"
# (Listed first: `tar | grep -q` fails under pipefail when grep stops reading early.)
listing="$(tar -tzf "$tgz")"
for file in wasm-provisioner-sdk.js componentize.mjs world.wit package.json; do
    grep -qx "package/$file" <<<"$listing" || fail "the npm package lacks $file"
done

echo "package-sdks.sh: $(cd "$out" && ls -d wasm-provisioner-sdk-* wasm_provisioner_sdk-* | tr '\n' ' ')" >&2
echo "$out"
