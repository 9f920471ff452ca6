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
if ! [[ $minor =~ ^1\.[0-9]+$ ]] || [ ! -f "$mod/go.mod" ]; then
  echo "build.sh: KUBERNETES=$minor is not supported; one of: $(cd "$here" && ls -d 1.* | tr '\n' ' ')" >&2
  exit 2
fi
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
cache=${TESSERA_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/controlplane}
# kwok >= 0.8 has no built-in stages: it gets kwok's own "fast" set (nodes become Ready and keep
# a lease, pods become Ready, complete, and go on deletion), taken from the pinned module so it
# always matches the binary.
stages=(node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready
  pod/fast/pod-complete pod/fast/pod-delete)
bin="$cache/$minor-$(hash_of "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "$mod/cmd/etcd/main.go")/bin"
# kwok and its stages live apart, keyed by kwok's own module (and the stage list), shared by every
# minor; each minor's bin holds links to them, checked below, so a kwok bump is never missed.
kwok_dir="$cache/kwok-$(echo "${stages[*]}" | hash_of "$here/kwok/go.mod" "$here/kwok/go.sum" "$here/kwok/tools.go" -)"
mkdir -p "$cache"
# One build at a time per minor: a second run waits, then finds the binaries built.
exec 9>"$cache/.lock-$minor"
flock 9
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
missing=()
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
for f in kwok kwok-stages.yaml; do
  [ "$(readlink "$bin/$f" 2>/dev/null)" = "$kwok_dir/$f" ] && [ -f "$kwok_dir/$f" ] || missing+=("$f")
done
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is required to build the control plane (https://go.dev/dl)" >&2; exit 1; }
echo "building ${missing[*]} (Kubernetes $minor) into $bin (first run on 2 cores: 15 to 30 minutes with downloads, longer while other builds run; later runs reuse it)" >&2
# The exact release, from the module's own requirement, stamped into the binaries' version.
kube_version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
[ -n "$kube_version" ] || { echo "build.sh: no 'k8s.io/kubernetes vX.Y.Z' requirement in $mod/go.mod" >&2; exit 1; }
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
      if [ ! -x "$kwok_dir/kwok" ]; then
        (cd "$here/kwok" && go build -mod=mod -trimpath -ldflags "-s -w" -o "$partial/kwok" sigs.k8s.io/kwok/cmd/kwok)
        mkdir -p "$kwok_dir"; mv "$partial/kwok" "$kwok_dir/kwok"
      fi
      ln -sfn "$kwok_dir/kwok" "$bin/kwok"
      ;;
    kwok-stages.yaml)
      if [ ! -f "$kwok_dir/$t" ]; then
        src=$(cd "$here/kwok" && go mod download sigs.k8s.io/kwok && go list -mod=mod -m -f '{{.Dir}}' sigs.k8s.io/kwok)
        [ -n "$src" ] && [ -d "$src/kustomize/stage" ] || { echo "build.sh: kwok's stages not found in the Go module cache ($src)" >&2; exit 1; }
        for s in "${stages[@]}"; do echo "---"; cat "$src/kustomize/stage/$s.yaml"; done > "$partial/$t"
        mkdir -p "$kwok_dir"; mv "$partial/$t" "$kwok_dir/$t"
      fi
      ln -sfn "$kwok_dir/$t" "$bin/$t"
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
