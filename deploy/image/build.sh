#!/usr/bin/env bash
# The docker-less image build: turns a built `wasm-provisioner` binary into the same image
# as the Dockerfile (deploy/image/Dockerfile), as an image tarball, with crane
# (go-containerregistry; built and cached by deploy/tools.sh). Prints the tarball's path.
#
#   bash deploy/image/build.sh BINARY [OUT.tar] [PLATFORM]
#
# PLATFORM is linux/amd64 (the default) or linux/arm64: the platform the binary was built
# for (deploy/release.sh cross-builds the arm64 one and joins both images into an index).
#
# No container engine and no registry on the network is needed. The image is made of two
# layers on an empty base:
#   1. the runtime: /etc/passwd and /etc/group with the nonroot user 65532 (as distroless
#      has it), the shared libraries the binary links (glibc, libgcc_s: for linux/amd64 the
#      exact files `ldd` resolves on this machine, at the paths it resolves; for
#      linux/arm64, which ldd cannot load here, the binary's NEEDED libraries and its
#      interpreter from Debian's arm64 cross runtime, /usr/aarch64-linux-gnu/lib, at the
#      multiarch paths an arm64 Debian has: /lib/ld-linux-aarch64.so.1 and
#      /lib/aarch64-linux-gnu/), and the CA bundle when the machine has one;
#   2. the binary, stripped of debug info, as /wasm-provisioner.
# Then its config: entrypoint /wasm-provisioner, cmd `run`, user 65532:65532, PLATFORM,
# OCI labels source, version, title, licenses. crane edits image configs only through a
# registry, so the script runs crane's own in-memory registry on a loopback port for the
# duration, and `crane mutate -o` writes the result as a tarball (the `docker save`
# layout, with an OCI config and manifest; `docker load`, `podman load`, `ctr images
# import`, `kind load image-archive` and `crane push` take it). Layer tarballs are
# reproducible (sorted names, owner 0, mtime 0).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
binary=${1:?usage: bash deploy/image/build.sh BINARY [OUT.tar] [PLATFORM]}
platform=${3:-linux/amd64}
[ -x "$binary" ] || { echo "deploy/image/build.sh: $binary is not an executable file" >&2; exit 1; }
case "$platform" in
  linux/amd64) machine="X86-64" ;;
  linux/arm64) machine="AArch64" ;;
  *) echo "deploy/image/build.sh: platform $platform is not linux/amd64 or linux/arm64" >&2; exit 1 ;;
esac
if ! readelf -h "$binary" | grep -q "Machine:.*$machine"; then
  echo "deploy/image/build.sh: $binary is not a $machine ELF binary, as $platform needs: $(readelf -h "$binary" | grep Machine: | xargs)" >&2
  exit 1
fi
version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^repository = "\(.*\)"/\1/p' "$root/Cargo.toml")
license=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^license = "\(.*\)"/\1/p' "$root/Cargo.toml")
out=${2:-$(dirname "$binary")/wasm-provisioner-image-$version.tar}
tag="wasm-provisioner:$version"
crane=$(bash "$root/deploy/tools.sh" crane)

work=$(mktemp -d)
registry_pid=""
cleanup() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Layer 1: the runtime.
base="$work/base"
mkdir -p "$base/etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$base/etc/group"
if [ "$platform" = linux/amd64 ]; then
  libs=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
  if [ -z "$libs" ]; then
    echo "deploy/image/build.sh: ldd found no shared library in $binary (a static binary needs none; check that it runs)" >&2
  fi
  for lib in $libs; do
    mkdir -p "$base$(dirname "$lib")"
    cp -L "$lib" "$base$lib"
  done
else
  cross=/usr/aarch64-linux-gnu/lib
  interpreter=$(readelf -l "$binary" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  [ "$interpreter" = /lib/ld-linux-aarch64.so.1 ] || {
    echo "deploy/image/build.sh: $binary asks for the interpreter '$interpreter', not /lib/ld-linux-aarch64.so.1" >&2
    exit 1
  }
  mkdir -p "$base/lib/aarch64-linux-gnu"
  cp -L "$cross/ld-linux-aarch64.so.1" "$base/lib/ld-linux-aarch64.so.1"
  for lib in $(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ "$lib" = ld-linux-aarch64.so.1 ] && continue
    [ -f "$cross/$lib" ] || {
      echo "deploy/image/build.sh: $binary needs $lib, which is not in $cross (apt-get install libc6-arm64-cross libgcc-s1-arm64-cross)" >&2
      exit 1
    }
    cp -L "$cross/$lib" "$base/lib/aarch64-linux-gnu/$lib"
  done
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$base/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$base/etc/ssl/certs/"
fi
# Layer 2: the binary.
app="$work/app"
mkdir -p "$app"
strip=objcopy
[ "$platform" = linux/arm64 ] && strip=aarch64-linux-gnu-objcopy
"$strip" --strip-debug "$binary" "$app/wasm-provisioner"
chmod 0755 "$app/wasm-provisioner"

layer() { # DIR OUT: a reproducible layer tarball of DIR's contents
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort >"$work/list")
  tar -C "$1" --no-recursion --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -czf "$2" -T "$work/list"
}
layer "$base" "$work/base.tar.gz"
layer "$app" "$work/app.tar.gz"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$crane" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.1
done
staged="127.0.0.1:$port/wasm-provisioner:$version"
"$crane" append --oci-empty-base -f "$work/base.tar.gz" -f "$work/app.tar.gz" -t "$staged" \
  >/dev/null 2>>"$work/crane.log" || { cat "$work/crane.log" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
"$crane" mutate "$staged" \
  --set-platform "$platform" \
  --entrypoint /wasm-provisioner --cmd run \
  --user 65532:65532 --workdir / \
  -l "org.opencontainers.image.source=$source_url" \
  -l "org.opencontainers.image.version=$version" \
  -l "org.opencontainers.image.title=wasm-provisioner" \
  -l "org.opencontainers.image.licenses=$license" \
  -t "$tag" -o "$out.tmp.$$" >/dev/null 2>>"$work/crane.log" || { cat "$work/crane.log" >&2; exit 1; }
mv "$out.tmp.$$" "$out"
echo "$out"
