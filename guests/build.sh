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
echo "build.sh: $count guests in $dist" >&2
echo "$dist"
