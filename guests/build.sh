#!/usr/bin/env bash
# Builds every guest crate (release, wasm32-wasip2) and copies each component to
# guests/dist/<name>.wasm. Prints the dist directory on its last line.
#
# Cargo's target directory is $GUESTS_TARGET_DIR (default
# ~/.cache/wasm-provisioner/guests-target), outside the clone, so caches survive fresh
# clones; an inherited CARGO_TARGET_DIR (the host's) is deliberately not used. A warm
# run is a cargo no-op plus a few file compares.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target=wasm32-wasip2
export CARGO_TARGET_DIR="${GUESTS_TARGET_DIR:-$HOME/.cache/wasm-provisioner/guests-target}"
# Flags meant for the host build (or set by a parent cargo) would change and rebuild the
# guests; guests build with their own profile only.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET \
    CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS

libdir="$(rustc --print target-libdir --target "$target" 2>/dev/null || true)"
if [ -z "$libdir" ] || [ ! -d "$libdir" ]; then
    if command -v rustup >/dev/null; then
        rustup target add "$target" >&2
    else
        echo "build.sh: the Rust target $target is missing and rustup is not installed" >&2
        exit 1
    fi
fi

cd "$here"
cargo build --release --locked --target "$target" --workspace >&2

# Every cdylib crate of the workspace is a guest; its component is <crate_name>.wasm.
dist="$here/dist"
mkdir -p "$dist"
out="$CARGO_TARGET_DIR/$target/release"
count=0
for manifest in */Cargo.toml */*/Cargo.toml; do
    # templates/ holds `guest new`'s projects, not members of this workspace.
    case "$manifest" in templates/*) continue ;; esac
    grep -q 'crate-type = \["cdylib"\]' "$manifest" || continue
    name="$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1)"
    built="$out/${name//-/_}.wasm"
    if [ ! -f "$built" ]; then
        echo "build.sh: $manifest built no $built" >&2
        exit 1
    fi
    # Replace atomically and only when changed: tests may be reading dist/ concurrently.
    if ! cmp -s "$built" "$dist/$name.wasm"; then
        cp "$built" "$dist/.$name.wasm.$$"
        mv -f "$dist/.$name.wasm.$$" "$dist/$name.wasm"
    fi
    count=$((count + 1))
done

# Python and JavaScript guests: each toolchain is pinned (python/requirements.txt,
# js/package-lock.json) and installed once into $cache, outside the clone; a guest is
# rebuilt only when its sources, the SDK, the WIT or the toolchain changed (a cold
# componentize takes 30-60 s; the built component is cached by a digest of its inputs).
cache="${WASM_PROVISIONER_CACHE:-$HOME/.cache/wasm-provisioner}"
mkdir -p "$cache/polyglot-guests"

digest() { cat "$@" | sha256sum | cut -c1-16; }

# install_atomically DIR COMMAND...: runs COMMAND in DIR.tmp.$$ and renames it to DIR,
# so an interrupted install never looks finished.
install_atomically() {
    local dir="$1"; shift
    [ -e "$dir/.installed" ] && return 0
    rm -rf "$dir.tmp.$$"
    mkdir -p "$dir.tmp.$$"
    (cd "$dir.tmp.$$" && "$@") >&2
    touch "$dir.tmp.$$/.installed"
    rm -rf "$dir"
    mv "$dir.tmp.$$" "$dir"
}

# put_in_dist NAME BUILT: copies BUILT to dist/NAME.wasm atomically, when changed.
put_in_dist() {
    if ! cmp -s "$2" "$dist/$1.wasm"; then
        cp "$2" "$dist/.$1.wasm.$$"
        mv -f "$dist/.$1.wasm.$$" "$dist/$1.wasm"
    fi
    count=$((count + 1))
}

for tool in python3 node npm; do
    if ! command -v "$tool" >/dev/null; then
        echo "build.sh: $tool is missing: the Python and JavaScript guests need python3 (3.10+), node (20.6+: js/sdk/componentize.mjs registers module hooks) and npm" >&2
        exit 1
    fi
done

# componentize-py into a venv keyed by the requirements file.
python_venv="$cache/componentize-py-$(digest python/requirements.txt)"
install_venv() {
    python3 -m venv . && ./bin/pip install --quiet --disable-pip-version-check \
        --only-binary :all: -r "$here/python/requirements.txt"
}
install_atomically "$python_venv" install_venv
# The venv was made in a temporary directory: run its tools through its python.
componentize_py=("$python_venv/bin/python" -c
    'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())')

# Each Python guest is built for its own world: contract 0.2's `plugin` plus an export
# per optional capability its plugin implements (python/sdk/wasm_provisioner_world.py
# reads the app and writes the world; the SDK checks it again during the build).
for app in python/*/app.py; do
    guest_dir="$(dirname "$app")"
    name="$(basename "$guest_dir")"
    [ "$name" = sdk ] && continue
    key="$(digest python/requirements.txt ../wit/0.2.0/*.wit python/sdk/*.py "$guest_dir"/*.py)"
    built="$cache/polyglot-guests/$name-py-$key.wasm"
    if [ ! -f "$built" ]; then
        echo "build.sh: componentize-py $guest_dir" >&2
        world="$(mktemp -d)"
        if ! python3 python/sdk/wasm_provisioner_world.py "$app" ../wit/0.2.0 "$world" >&2 ||
            ! "${componentize_py[@]}" -d "$world" -w guest componentize \
                -p "$guest_dir" -p python/sdk app -o "$built.tmp.$$" >&2; then
            rm -rf "$world" "$built.tmp.$$"
            echo "build.sh: building $guest_dir failed" >&2
            exit 1
        fi
        rm -rf "$world"
        mv -f "$built.tmp.$$" "$built"
    fi
    put_in_dist "$name" "$built"
done

# componentize-js into node_modules keyed by the lock file (npm ci: exactly the lock).
node_modules="$cache/js-node-modules-$(digest js/package-lock.json)"
install_npm() {
    cp "$here/js/package.json" "$here/js/package-lock.json" . &&
        npm ci --no-audit --no-fund --loglevel=error
}
install_atomically "$node_modules" install_npm
ln -sfn "$node_modules/node_modules" js/node_modules

for app in js/*/app.js; do
    guest_dir="$(dirname "$app")"
    name="$(basename "$guest_dir")-js"
    key="$(digest js/package-lock.json js/sdk/componentize.mjs js/sdk/world.wit ../wit/0.2.0/*.wit js/sdk/*.js "$guest_dir"/*.js)"
    built="$cache/polyglot-guests/$name-$key.wasm"
    if [ ! -f "$built" ]; then
        echo "build.sh: componentize-js $guest_dir" >&2
        # componentize.mjs finds the plugin's capabilities and exports exactly those.
        # The app imports the SDK as `wasm-provisioner-sdk`: the one beside componentize.mjs.
        node js/sdk/componentize.mjs "$app" "$built.tmp.$$" ../wit/0.2.0 >&2
        mv -f "$built.tmp.$$" "$built"
    fi
    put_in_dist "$name" "$built"
done

echo "build.sh: $count guests in $dist" >&2
echo "$dist"
