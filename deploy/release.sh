#!/usr/bin/env bash
# Builds every release artifact of wasm-provisioner, pushes them to a registry and writes
# them to a directory (docs/release.md says what each is and how to verify it):
#
#   bash deploy/release.sh OUT_DIR REGISTRY
#
# REGISTRY is host[:port][/path], such as ghcr.io/wasm-provisioner or 127.0.0.1:5000 (a
# registry on the loopback, or with RELEASE_INSECURE=1, is spoken to over plain HTTP).
# Credentials are the registry's usual docker config (~/.docker/config.json).
#
# What it makes, in OUT_DIR:
#   wasm-provisioner-image-VERSION.oci.tar  the image as an OCI image layout (tar) whose
#       index holds linux/amd64 and linux/arm64; pushed as REGISTRY/wasm-provisioner:VERSION
#   wasm-provisioner-VERSION.tgz   the Helm chart (`helm package`, values.schema.json and
#       README.md inside), its values naming the image and the bundled modules by digest
#       in REGISTRY, with the release's public key that the host checks the modules'
#       signatures against; pushed as oci://REGISTRY/charts/wasm-provisioner
#   modules/NAME.wasm              the bundled modules, each pushed as a wasm OCI artifact
#       (one application/wasm layer, config application/vnd.wasm.config.v0+json) as
#       REGISTRY/modules/NAME:VERSION
#   wasm-provisioner-VERSION-linux-ARCH.cdx.json  the image's SBOM per platform (CycloneDX,
#       cargo-cyclonedx: the crates linked into the binary), each also attached to its
#       platform's image manifest in the registry
#   cosign.pub, *.sig              the signatures (cosign, a key pair: COSIGN_KEY and
#       COSIGN_PASSWORD name the release key; without COSIGN_KEY an ephemeral key pair is
#       made and only its public half kept): the image index, each module and the chart
#       in the registry (no transparency log upload), SHA256SUMS as a blob
#   release.json                   every pushed reference with its digest
#   SHA256SUMS                     sha256 of every file above (sha256sum -c SHA256SUMS)
#
# The binaries: linux/amd64 is this machine's build (the debug profile, dependencies at
# opt-level 1, as CI builds it; WASM_PROVISIONER_BINARY_AMD64 names one already built),
# linux/arm64 a cross build with Debian's gcc-aarch64-linux-gnu as linker (installed with
# apt-get when missing) into WASM_PROVISIONER_CROSS_TARGET_DIR (default
# ~/.cache/wasm-provisioner/target-cross; WASM_PROVISIONER_BINARY_ARM64 names one
# already built). WASM_PROVISIONER_PROFILE=release builds both with the release profile.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
usage="usage: bash deploy/release.sh OUT_DIR REGISTRY"
out=${1:?$usage}
registry=${2:?$usage}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
registry=${registry%/}
registry_host=${registry%%/*}
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasm-provisioner/target}"
cross_dir="${WASM_PROVISIONER_CROSS_TARGET_DIR:-$HOME/.cache/wasm-provisioner/target-cross}"
profile="${WASM_PROVISIONER_PROFILE:-debug}"
version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
started=$(date +%s)
say() { echo "release: $* ($(( $(date +%s) - started ))s)" >&2; }

insecure=false
case "$registry_host" in
  localhost | localhost:* | 127.* | \[::1\]*) insecure=true ;;
esac
[ "${RELEASE_INSECURE:-}" = 1 ] && insecure=true
crane_flags=() oras_flags=() helm_flags=() cosign_flags=()
if $insecure; then
  crane_flags=(--insecure) oras_flags=(--plain-http) helm_flags=(--plain-http)
  cosign_flags=(--allow-insecure-registry --allow-http-registry)
fi

crane=$(bash deploy/tools.sh crane)
helm=$(bash deploy/tools.sh helm)
oras=$(bash deploy/tools.sh oras)
cosign=$(bash deploy/tools.sh cosign)

if [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
  echo "deploy/release.sh: $out is not empty: a release directory holds one release (remove it or name another)" >&2
  exit 1
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the binaries -----------------------------------------------------------------------
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)
amd64=${WASM_PROVISIONER_BINARY_AMD64:-}
if [ -z "$amd64" ]; then
  say "building linux/amd64 ($profile)"
  # The same command as tests/run.sh and CI, so a warm target dir builds nothing.
  if [ "$profile" = release ]; then
    cargo build -q --locked --release -p wasm-provisioner --bin wasm-provisioner
  else
    cargo test -q --workspace --locked --no-run
  fi
  amd64="$CARGO_TARGET_DIR/$profile/wasm-provisioner"
fi
arm64=${WASM_PROVISIONER_BINARY_ARM64:-}
if [ -z "$arm64" ]; then
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -f /usr/aarch64-linux-gnu/lib/libc.so.6 ]; then
    say "installing Debian's aarch64 cross toolchain (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
  fi
  rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1
  say "building linux/arm64 ($profile, cross, in $cross_dir)"
  # A clean environment: the same build whoever runs the script (CI's clippy wrapper, or
  # the variables `cargo test` gives a test that runs it, would make cargo rebuild).
  env -i PATH="$PATH" HOME="$HOME" \
    ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} \
    ${RUSTUP_TOOLCHAIN:+RUSTUP_TOOLCHAIN="$RUSTUP_TOOLCHAIN"} \
    CARGO_TARGET_DIR="$cross_dir" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    cargo build -q --locked "${cargo_profile[@]}" --target aarch64-unknown-linux-gnu \
    -p wasm-provisioner --bin wasm-provisioner
  arm64="$cross_dir/aarch64-unknown-linux-gnu/$profile/wasm-provisioner"
fi

# --- the image: one per platform, joined in an index ------------------------------------
image="$registry/wasm-provisioner"
for platform in linux/amd64 linux/arm64; do
  arch=${platform#linux/}
  binary=$amd64
  [ "$arch" = arm64 ] && binary=$arm64
  say "image $platform"
  bash deploy/image/build.sh "$binary" "$work/image-$arch.tar" "$platform" >/dev/null
  "$crane" push "${crane_flags[@]}" "$work/image-$arch.tar" "$image:$version-$arch" >/dev/null 2>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
done
amd64_digest=$("$crane" digest "${crane_flags[@]}" "$image:$version-amd64")
arm64_digest=$("$crane" digest "${crane_flags[@]}" "$image:$version-arm64")
"$crane" index append "${crane_flags[@]}" -m "$image@$amd64_digest" -m "$image@$arm64_digest" \
  -t "$image:$version" >/dev/null 2>"$work/crane.log" || { cat "$work/crane.log" >&2; exit 1; }
image_digest=$("$crane" digest "${crane_flags[@]}" "$image:$version")
rm -rf "$work/layout"
"$crane" pull "${crane_flags[@]}" --format oci "$image@$image_digest" "$work/layout" 2>"$work/crane.log" ||
  { cat "$work/crane.log" >&2; exit 1; }
tar -C "$work/layout" --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name \
  -cf "$out/wasm-provisioner-image-$version.oci.tar" .
say "image $image@$image_digest (amd64 $amd64_digest, arm64 $arm64_digest)"

# --- the bundled modules as wasm OCI artifacts -------------------------------------------
modules_dir=$(bash deploy/modules.sh | tail -n 1)
mkdir -p "$out/modules"
created=$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
declare -A module_refs=()
for module in hostpath nfs-subdir; do
  cp "$modules_dir/$module.wasm" "$out/modules/$module.wasm"
  layer=$(sha256sum "$out/modules/$module.wasm" | cut -d' ' -f1)
  # The wasm OCI artifact's config (CNCF TAG Runtime's wasm artifact layout).
  printf '{"created":"%s","author":"wasm-provisioner","architecture":"wasm","os":"wasip2","layerDigests":["sha256:%s"]}' \
    "$created" "$layer" >"$work/$module.config.json"
  (cd "$out/modules" && "$oras" push "${oras_flags[@]}" --no-tty \
    --config "$work/$module.config.json:application/vnd.wasm.config.v0+json" \
    --annotation "org.opencontainers.image.created=$created" \
    --annotation "org.opencontainers.image.version=$version" \
    --annotation "org.opencontainers.image.source=https://github.com/wasm-provisioner/wasm-provisioner" \
    "$registry/modules/$module:$version" "$module.wasm:application/wasm") >"$work/oras.log" 2>&1 ||
    { cat "$work/oras.log" >&2; exit 1; }
  digest=$("$crane" digest "${crane_flags[@]}" "$registry/modules/$module:$version")
  module_refs[$module]="$registry/modules/$module@$digest"
  say "module ${module_refs[$module]}"
done

# --- the SBOM of the image's binary -------------------------------------------------------
cyclonedx_version=0.5.9
cyclonedx_root="$HOME/.cache/wasm-provisioner/cargo-cyclonedx-$cyclonedx_version"
if [ ! -x "$cyclonedx_root/bin/cargo-cyclonedx" ]; then
  say "installing cargo-cyclonedx $cyclonedx_version (cached in $cyclonedx_root)"
  cargo install -q --locked cargo-cyclonedx --version "$cyclonedx_version" --root "$cyclonedx_root"
fi
# One SBOM per platform (the host crate's normal dependencies for that target; build
# dependencies left out: they are not in the image), each attached to its platform's
# image manifest.
sboms=()
for arch in amd64 arm64; do
  case $arch in amd64) target=x86_64-unknown-linux-gnu digest=$amd64_digest ;; arm64) target=aarch64-unknown-linux-gnu digest=$arm64_digest ;; esac
  sbom="wasm-provisioner-$version-linux-$arch.cdx.json"
  PATH="$cyclonedx_root/bin:$PATH" cargo cyclonedx -q --manifest-path host/Cargo.toml --format json \
    --spec-version 1.5 --no-build-deps --target "$target" --override-filename "sbom.$$" >/dev/null
  mv "host/sbom.$$.json" "$out/$sbom"
  # (and beside every other workspace member's: only the host's is the image's)
  find . -maxdepth 3 -name "sbom.$$.json" -not -path './target/*' -delete
  (cd "$out" && "$oras" attach "${oras_flags[@]}" --no-tty --artifact-type application/vnd.cyclonedx+json \
    "$image@$digest" "$sbom:application/vnd.cyclonedx+json") >"$work/oras.log" 2>&1 ||
    { cat "$work/oras.log" >&2; exit 1; }
  sboms+=("$sbom")
  say "SBOM $sbom ($(grep -c '"bom-ref"' "$out/$sbom") entries), attached to the linux/$arch image"
done

# --- the signing key (its public half goes into the chart) -----------------------------------
if [ -n "${COSIGN_KEY:-}" ]; then
  key=$COSIGN_KEY
  [ -n "${COSIGN_PASSWORD+set}" ] || { echo "deploy/release.sh: COSIGN_KEY needs COSIGN_PASSWORD (empty for a key without one)" >&2; exit 1; }
  COSIGN_PASSWORD="$COSIGN_PASSWORD" "$cosign" public-key --key "$key" >"$out/cosign.pub"
else
  say "no COSIGN_KEY: signing with an ephemeral key pair (only cosign.pub is kept)"
  (cd "$work" && COSIGN_PASSWORD="" "$cosign" generate-key-pair >/dev/null 2>&1)
  key="$work/cosign.key"
  export COSIGN_PASSWORD=""
  cp "$work/cosign.pub" "$out/cosign.pub"
fi
# --- the chart: its values name the image and the modules by digest ----------------------
chart="$work/chart/wasm-provisioner"
mkdir -p "$work/chart"
cp -RL deploy/helm/wasm-provisioner "$chart"
rm -f "$chart"/modules/*.wasm
python3 - "$chart/values.yaml" "$registry_host" "${image#"$registry_host"/}" "$image_digest" \
  "$insecure" "${module_refs[hostpath]}" "${module_refs[nfs-subdir]}" "$out/cosign.pub" <<'EOF'
import re, sys
path, host, repository, digest, insecure, hostpath, nfs, public_key = sys.argv[1:]
text = open(path).read()
def replace(pattern, new):
    global text
    text, n = re.subn(pattern, new, text, count=1, flags=re.M)
    if n != 1:
        sys.exit(f"deploy/release.sh: values.yaml has no line matching {pattern!r}")
replace(r'^(image:\n(?:  #.*\n)*)  registry: ""$', rf'\1  registry: "{host}"')
replace(r'^(image:\n(?:  .*\n)*?)  repository: wasm-provisioner$', rf'\1  repository: {repository}')
replace(r'^(image:\n(?:  .*\n)*?)  digest: ""$', rf'\1  digest: "{digest}"')
replace(r'^  source: files$', '  source: oci')
replace(r'^  oci: \{\}$', f'  oci:\n    hostpath: "{hostpath}"\n    nfs-subdir: "{nfs}"')
# The bundled modules are verified against the release's key.
replace(r'^  signatures: \{\}$', '  signatures:\n    allOf: [{ publicKey: /etc/wasm-provisioner/keys/release.pub }]')
key = "".join("    " + line + "\n" for line in open(public_key).read().strip().splitlines())
replace(r'^signatureKeys: \{\}$', "signatureKeys:\n  release: |\n" + key.rstrip("\n").replace("\\", "\\\\"))
if insecure == "true":
    replace(r'^registries: \[\]$', f'registries:\n  - {{ host: "{host}", insecure: true }}')
open(path, "w").write(text)
EOF
"$helm" package "$chart" --destination "$out" >/dev/null
chart_tgz="wasm-provisioner-$version.tgz"
"$helm" push "${helm_flags[@]}" "$out/$chart_tgz" "oci://$registry/charts" >"$work/helm.log" 2>&1 ||
  { cat "$work/helm.log" >&2; exit 1; }
chart_digest=$(sed -n 's/^Digest: //p' "$work/helm.log")
say "chart oci://$registry/charts/wasm-provisioner:$version@$chart_digest"

# --- signatures -----------------------------------------------------------------------------
sign() {
  "$cosign" sign --yes --key "$key" --tlog-upload=false "${cosign_flags[@]}" "$1" >"$work/cosign.log" 2>&1 ||
    { cat "$work/cosign.log" >&2; exit 1; }
}
sign "$image@$image_digest"
for module in hostpath nfs-subdir; do sign "${module_refs[$module]}"; done
sign "$registry/charts/wasm-provisioner@$chart_digest"
say "signed the image, the modules and the chart in $registry"

# --- what was pushed, the checksums, and their signature --------------------------------------
python3 - "$out/release.json" <<EOF
import json, sys
json.dump({
    "version": "$version",
    "registry": "$registry",
    "image": {"reference": "$image@$image_digest", "tag": "$image:$version",
              "platforms": {"linux/amd64": "$amd64_digest", "linux/arm64": "$arm64_digest"},
              "layout": "wasm-provisioner-image-$version.oci.tar",
              "sboms": {"linux/amd64": "${sboms[0]}", "linux/arm64": "${sboms[1]}"}},
    "modules": {"hostpath": "${module_refs[hostpath]}", "nfs-subdir": "${module_refs[nfs-subdir]}"},
    "chart": {"reference": "oci://$registry/charts/wasm-provisioner", "version": "$version",
              "digest": "$chart_digest", "package": "$chart_tgz"},
    "signatures": {"key": "cosign.pub", "checksums": "SHA256SUMS.sig"},
}, open(sys.argv[1], "w"), indent=2)
EOF
(cd "$out" && find . -type f ! -name SHA256SUMS ! -name SHA256SUMS.sig -printf '%P\n' | LC_ALL=C sort |
  xargs sha256sum >SHA256SUMS)
"$cosign" sign-blob --yes --key "$key" --tlog-upload=false --output-signature "$out/SHA256SUMS.sig" \
  "$out/SHA256SUMS" >"$work/cosign.log" 2>&1 || { cat "$work/cosign.log" >&2; exit 1; }
chmod 0644 "$out/SHA256SUMS.sig"
say "done: $(wc -l <"$out/SHA256SUMS") files in $out/SHA256SUMS, signed (SHA256SUMS.sig, cosign.pub)"
echo "$out"
