#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and kubectl from the
# pinned Go modules in this folder into a cache directory outside the clone, keyed by the modules'
# files, so a second run (and CI's fresh clone on the same machine) reuses them. Prints the bin
# directory.
#
# KUBERNETES picks the minor version: one folder per supported release (1.37, the newest, by
# default; 1.35, the oldest still supported). kwok has its own module (it pins its own k8s.io
# libraries) and is built once for all versions.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
minor=${KUBERNETES:-1.37}
mod="$here/$minor"
if [ ! -f "$mod/go.mod" ]; then
  echo "build.sh: KUBERNETES=$minor is not supported; one of: $(cd "$here" && ls -d 1.* | tr '\n' ' ')" >&2
  exit 2
fi
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
cache=${TESSERA_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/controlplane}
bin="$cache/$minor-$(hash_of "$mod/go.mod" "$mod/go.sum" "$mod/cmd/etcd/main.go")/bin"
kwok_bin="$cache/kwok-$(hash_of "$here/kwok/go.mod" "$here/kwok/go.sum")"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl)
# kwok >= 0.8 has no built-in stages: it gets kwok's own "fast" set (nodes become Ready and keep
# a lease, pods become Ready, complete, and go on deletion), taken from the pinned module so it
# always matches the binary.
stages=(node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready
  pod/fast/pod-complete pod/fast/pod-delete)
missing=()
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
[ -f "$bin/kwok-stages.yaml" ] || missing+=(kwok-stages.yaml)
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is required to build the control plane (https://go.dev/dl)" >&2; exit 1; }
echo "building ${missing[*]} (Kubernetes $minor) into $bin (first run on 2 cores: about 10 minutes with downloads; later runs reuse it)" >&2
# The exact release, from the module's own requirement, stamped into the binaries' version.
kube_version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=${minor#1.} -X $p.gitTreeState=clean"
done
# A private partial directory per run: two concurrent builds never move each other's half-written
# files into place.
partial=$(mktemp -d "$cache/.partial.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/.partial.XXXXXX"; })
trap 'rm -rf "$partial"' EXIT
mkdir -p "$bin"
for t in "${missing[@]}"; do
  start=$(date +%s)
  case $t in
    kwok)
      if [ ! -x "$kwok_bin/kwok" ]; then
        (cd "$here/kwok" && go build -mod=mod -trimpath -ldflags "-s -w" -o "$partial/kwok" sigs.k8s.io/kwok/cmd/kwok)
        mkdir -p "$kwok_bin"; mv "$partial/kwok" "$kwok_bin/kwok"
      fi
      ln -sfn "$kwok_bin/kwok" "$bin/kwok"
      ;;
    kwok-stages.yaml)
      src=$(cd "$here/kwok" && go list -mod=mod -m -f '{{.Dir}}' sigs.k8s.io/kwok)
      for s in "${stages[@]}"; do echo "---"; cat "$src/kustomize/stage/$s.yaml"; done > "$partial/$t"
      mv "$partial/$t" "$bin/$t"
      ;;
    *)
      case $t in etcd) pkg=./cmd/etcd ;; *) pkg=k8s.io/kubernetes/cmd/$t ;; esac
      (cd "$mod" && go build -mod=mod -trimpath -ldflags "$ldflags" -o "$partial/$t" "$pkg")
      mv "$partial/$t" "$bin/$t"
      ;;
  esac
  echo "  built $t in $(( $(date +%s) - start ))s" >&2
done
echo "$bin"
