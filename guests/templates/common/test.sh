#!/usr/bin/env bash
# Builds the guest and runs it in wasm-provisioner's offline runner, as the host would:
# validates test/class.yaml (accepted) and test/class-typo.yaml (refused) with the
# plugin's validate-class capability, provisions test/claim.yaml of test/class.yaml (the
# directory must appear in the granted directory), checks that test/claim-too-big.yaml is
# infeasible, deletes the volume (the directory must go). WASM_PROVISIONER names the host binary (default:
# `wasm-provisioner` on PATH).
set -euo pipefail
cd "$(dirname "$0")"
bin="${WASM_PROVISIONER:-wasm-provisioner}"
if ! command -v "$bin" >/dev/null; then
    echo "test.sh: $bin not found: put wasm-provisioner on PATH or set WASM_PROVISIONER" >&2
    exit 1
fi
{{native_test}}bash build.sh

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/modules" "$scratch/volumes"
cp dist/{{name}}.wasm "$scratch/modules/"
cat > "$scratch/grants.yaml" <<GRANTS
allow: { directories: [$scratch/volumes] }
modules:
  {{name}}:
    directories: [{ host: $scratch/volumes, guest: /volumes, mode: read-write }]
    volumes:
      hostPath: [{ pathPrefix: /var/lib/{{name}}, directory: /volumes }]
GRANTS
# One compile per run (a Python or JavaScript component takes seconds):
# WASM_PROVISIONER_CACHE_DIR keeps it between runs too.
cache="${WASM_PROVISIONER_CACHE_DIR:-$scratch/cwasm}"
run() { "$bin" guest "$@" --modules "$scratch/modules" --grants "$scratch/grants.yaml" --cache-dir "$cache"; }
pv=pvc-0b6e3d4e-1111-4c3a-9d7e-000000000001

run validate --class test/class.yaml
if run validate --class test/class-typo.yaml 2> "$scratch/err"; then
    echo "test.sh: a class with a typo was accepted" >&2; exit 1
fi
grep -q "refused the StorageClass" "$scratch/err" || { echo "test.sh: expected a refusal:" >&2; cat "$scratch/err" >&2; exit 1; }
echo "test.sh: validate-class accepts test/class.yaml and refuses a typo"

run provision --class test/class.yaml --claim test/claim.yaml > "$scratch/pv.yaml"
grep -q "path: /var/lib/{{name}}/$pv" "$scratch/pv.yaml" || { echo "test.sh: unexpected PV:" >&2; cat "$scratch/pv.yaml" >&2; exit 1; }
[ -d "$scratch/volumes/$pv" ] || { echo "test.sh: provision made no directory $pv" >&2; exit 1; }
echo "test.sh: provision made $pv"

if run provision --class test/class.yaml --claim test/claim-too-big.yaml 2> "$scratch/err"; then
    echo "test.sh: a claim above maxSize was provisioned" >&2; exit 1
fi
grep -q infeasible "$scratch/err" || { echo "test.sh: expected infeasible:" >&2; cat "$scratch/err" >&2; exit 1; }
echo "test.sh: a claim above maxSize is infeasible"

run delete --class test/class.yaml --volume "$scratch/pv.yaml"
[ ! -e "$scratch/volumes/$pv" ] || { echo "test.sh: delete left $pv" >&2; exit 1; }
echo "test.sh: delete removed $pv"
echo "test.sh: all offline checks passed"
