#!/usr/bin/env bash
# Builds the control-plane launcher (upstream etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler linked into one binary) and prints its path.
#
# The binary is cached outside the repository, keyed on the launcher's sources and
# go.sum, so a warm machine reuses it and a change to either rebuilds it. Go's own build
# and module caches (GOCACHE, GOMODCACHE) make a rebuild after a small change a relink.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${WASM_PROVISIONER_CACHE:-$HOME/.cache/wasm-provisioner}/controlplane"
key=$(cat "$here/go.mod" "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-16)
binary="$cache/controlplane-$key"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$cache"
cd "$here"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$version"
echo "building the control-plane launcher for Kubernetes $version (cold: 10-20 min on 2 cores)" >&2
started=$(date +%s)
go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$binary.tmp.$$" .
mv "$binary.tmp.$$" "$binary"
# Older launchers (other keys) are dead weight: keep the three newest (checkouts of
# different commits on one machine share this cache).
ls -t "$cache"/controlplane-* 2>/dev/null | grep -v '\.tmp\.' | tail -n +4 | xargs -r rm -f
echo "built $binary in $(( $(date +%s) - started ))s" >&2
echo "$binary"
