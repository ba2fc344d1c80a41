#!/usr/bin/env bash
# Builds the bundled guests and copies them into deploy/modules/, where the kustomize
# builds make the modules ConfigMap from them (deploy/modules/kustomization.yaml, which
# deploy/ and deploy/node-local/ include), and into the Helm chart's modules/ (its
# modules.source=files); prints the first directory. The copies are build output, not
# sources: both directories' *.wasm are ignored by git. deploy/release.sh pushes them as
# OCI artifacts, which the released chart pulls by digest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dist=$(bash "$here/../guests/build.sh" | tail -n 1)
for target in "$here/modules" "$here/helm/wasm-provisioner/modules"; do
  mkdir -p "$target"
  for module in hostpath nfs-subdir; do
    # Replaced atomically and only when changed: a render may be reading it.
    if ! cmp -s "$dist/$module.wasm" "$target/$module.wasm"; then
      install -m 0644 "$dist/$module.wasm" "$target/.$module.wasm.$$"
      mv -f "$target/.$module.wasm.$$" "$target/$module.wasm"
    fi
  done
done
echo "$here/modules"
