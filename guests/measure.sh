#!/usr/bin/env bash
# Measures one built guest with the offline runner, for the table in guests/README.md:
# module size, a cold `guest provision` (compile) and two cached ones (--cache-dir),
# and the smallest `memoryBytes` grant (of the steps in MIBS) with which it provisions.
#
#   bash guests/measure.sh BIN MODULE 'PARAM: VALUE, ...'
#   bash guests/measure.sh target/debug/wasm-provisioner quota-dir 'maxSize: 2Gi'
set -euo pipefail
bin="$1"; module="$2"; params="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
s="$(mktemp -d)"
trap 'rm -rf "$s"' EXIT
mkdir "$s/modules" "$s/granted"
cp "$here/dist/$module.wasm" "$s/modules/"
echo "$module: $(wc -c < "$s/modules/$module.wasm") bytes"
cat > "$s/sc.yaml" <<Y
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: q}
provisioner: wasm-provisioner.dev
parameters: {module: $module, nodePath: /var/lib/quota, $params}
Y
cat > "$s/pvc.yaml" <<Y
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: d, namespace: default, uid: 5a1d7a2e-0000-4000-8000-000000000001}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
Y
grants() {
    cat > "$s/grants.yaml" <<Y
allow: { directories: [$s/granted] }
modules:
  $module:
    ${1:+limits: { memoryBytes: $1 \}}
    directories: [{ host: $s/granted, guest: /volumes, mode: read-write }]
    volumes: { hostPath: [{ pathPrefix: /var/lib/quota, directory: /volumes }] }
Y
}
provision() {
    WASM_PROVISIONER_LOG=error "$bin" guest provision --modules "$s/modules" \
        --grants "$s/grants.yaml" --class "$s/sc.yaml" --claim "$s/pvc.yaml" --cache-dir "$1" >/dev/null
}
grants ""
for run in cold cached cached; do
    start=$(date +%s%N)
    provision "$s/cache"
    echo "$module: $run provision: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
for mib in ${MIBS:-1 2 4 8 12 16 24 32 48 64}; do
    grants $((mib * 1024 * 1024))
    if provision "$s/cache-$mib" 2>/dev/null; then
        echo "$module: provisions with memoryBytes $mib MiB (not with the step before)"
        break
    fi
done
