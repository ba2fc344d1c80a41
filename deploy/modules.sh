#!/usr/bin/env bash
# Builds the bundled guests and copies them into deploy/modules/, where the kustomize
# builds make the modules ConfigMap from them (deploy/modules/kustomization.yaml, which
# deploy/ and deploy/node-local/ include); prints that directory. The copies are build
# output, not sources: deploy/modules/*.wasm is ignored by git.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dist=$(bash "$here/../guests/build.sh" | tail -n 1)
mkdir -p "$here/modules"
for module in hostpath nfs-subdir; do
  # Replaced atomically and only when changed: a render may be reading it.
  if ! cmp -s "$dist/$module.wasm" "$here/modules/$module.wasm"; then
    install -m 0644 "$dist/$module.wasm" "$here/modules/.$module.wasm.$$"
    mv -f "$here/modules/.$module.wasm.$$" "$here/modules/$module.wasm"
  fi
done
echo "$here/modules"
