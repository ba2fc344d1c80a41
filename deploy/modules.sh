#!/usr/bin/env bash
# Builds the bundled guests and copies them into deploy/modules/, where the kustomize
# base (deploy/kustomization.yaml) makes the modules ConfigMap from them; prints that
# directory. The copies are build output, not sources: deploy/modules/*.wasm is ignored
# by git.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dist=$(bash "$here/../guests/build.sh" | tail -n 1)
mkdir -p "$here/modules"
for module in hostpath nfs-subdir; do
  install -m 0644 "$dist/$module.wasm" "$here/modules/$module.wasm"
done
echo "$here/modules"
