#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and kubectl from the pinned Go
# modules in this folder into a cache directory outside the clone, keyed by go.mod + go.sum, so a
# second run (and CI's fresh clone on the same machine) reuses them. Prints the bin directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
key=$(cat "$here/go.mod" "$here/go.sum" "$here/cmd/etcd/main.go" | sha256sum | cut -c1-16)
cache=${TESSERA_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/controlplane}
bin="$cache/$key/bin"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl)
missing=()
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is required to build the control plane (https://go.dev/dl)" >&2; exit 1; }
echo "building ${missing[*]} into $bin (first run on 2 cores: about 8 minutes with downloads; later runs reuse it)" >&2
mkdir -p "$bin.partial"
kube_version=v1.33.13
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=33 -X $p.gitTreeState=clean"
done
cd "$here"
for t in "${missing[@]}"; do
  case $t in
    etcd) pkg=./cmd/etcd ;;
    kwok) pkg=sigs.k8s.io/kwok/cmd/kwok ;;
    *) pkg=k8s.io/kubernetes/cmd/$t ;;
  esac
  start=$(date +%s)
  go build -mod=mod -trimpath -ldflags "$ldflags" -o "$bin.partial/$t" "$pkg"
  echo "  built $t in $(( $(date +%s) - start ))s" >&2
  mkdir -p "$bin"; mv "$bin.partial/$t" "$bin/$t"
done
rmdir "$bin.partial" 2>/dev/null || true
echo "$bin"
