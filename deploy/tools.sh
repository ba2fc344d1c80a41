#!/usr/bin/env bash
# Builds the install tools the tests and CI use, from their Go modules, and prints their
# paths: crane (go-containerregistry: the docker-less image build, and the tests' local
# registry), helm, kustomize and oras (the tests push modules as wasm OCI artifacts); and,
# on request only, cosign (deploy/release.sh signs the release with it).
#
#   bash deploy/tools.sh            # builds the first four; prints "NAME PATH" per line
#   bash deploy/tools.sh helm       # builds one; prints its path alone
#
# Each tool is pinned by its own small module under deploy/tools/NAME/ (a `tool` line in
# go.mod, every dependency's hash in go.sum; one module per tool, so their dependencies
# never meet in one build list). The binaries are cached outside the repository, keyed on
# that go.mod and go.sum, like the control-plane launcher (tests/controlplane/build.sh);
# Go's build and module caches make a rebuild cheap. WASM_PROVISIONER_CACHE moves the
# cache. Cold on 2 cores: crane ~1 min, kustomize ~1 min, helm ~4 min, oras ~1 min,
# cosign ~15 min (measured under load).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${WASM_PROVISIONER_CACHE:-$HOME/.cache/wasm-provisioner}/tools"

build() {
  local name=$1 dir="$here/tools/$1"
  if [ ! -f "$dir/go.mod" ]; then
    echo "deploy/tools.sh: unknown tool '$name' (known: crane, helm, kustomize, oras, cosign)" >&2
    return 1
  fi
  local key binary package version ldflags=""
  package=$(sed -n 's/^tool //p' "$dir/go.mod")
  # The module that provides the tool, and its pinned version, for `version` output.
  version=$(cd "$dir" && go list -mod=readonly -f '{{.Module.Version}}' "$package")
  case "$name" in
    helm)
      # As helm's Makefile does: the default Kubernetes version (`helm template` without
      # --kube-version, lint) is the client-go it was built with, not v1.20.
      local k8s_minor
      k8s_minor=$(cd "$dir" && go list -mod=readonly -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
      ldflags="-X helm.sh/helm/v3/internal/version.version=$version"
      for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
      done
      ;;
    kustomize) ldflags="-X sigs.k8s.io/kustomize/api/provenance.version=$version" ;;
    crane) ldflags="-X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$version" ;;
  esac
  # The key covers what decides the binary: the pinned modules and the link flags.
  key=$( (cat "$dir/go.mod" "$dir/go.sum"; echo "$ldflags") | sha256sum | cut -c1-16)
  binary="$cache/$name-$key"
  if [ -x "$binary" ]; then
    echo "$binary"
    return 0
  fi
  mkdir -p "$cache"
  echo "building $name $version (cached afterwards in $cache)" >&2
  local started
  started=$(date +%s)
  (cd "$dir" && go build -mod=readonly -trimpath -ldflags "-s -w $ldflags" -o "$binary.tmp.$$" "$package")
  mv "$binary.tmp.$$" "$binary"
  # Older builds of this tool (other keys) are dead weight.
  find "$cache" -maxdepth 1 -name "$name-*" ! -name "$(basename "$binary")" -delete
  echo "built $binary in $(( $(date +%s) - started ))s" >&2
  echo "$binary"
}

if [ $# -eq 1 ]; then
  build "$1"
else
  for name in crane kustomize helm oras; do
    echo "$name $(build "$name")"
  done
fi
