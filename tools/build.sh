#!/usr/bin/env bash
# Builds one pinned Go tool (helm, promtool) from the module in tools/NAME/ into a cache directory
# outside the clone, keyed by that go.mod + go.sum and the build flags, so a second run (and CI's
# fresh clone on the same machine) reuses it. Prints the binary's path. tools/NAME/tools.go names
# the command (and says how to move the pin). Usage: tools/build.sh helm|promtool|gpu-feature-discovery
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: tools/build.sh helm|promtool|gpu-feature-discovery}
case $name in
  helm)
    pkg=helm.sh/helm/v4/cmd/helm
    tags=
    version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" {print $3}' "$here/helm/go.mod")
    ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
    ;;
  promtool)
    pkg=github.com/prometheus/prometheus/cmd/promtool
    # promtool's service-discovery plugins are for `promtool check` against live targets, which we
    # never do; without them the build is smaller, and one of them (nomad) is not served by the proxy.
    tags=remove_all_sd
    module=$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3}' "$here/promtool/go.mod")
    # Module v0.316.0 is Prometheus 3.16.0.
    version=$(echo "$module" | sed -E 's/^v0\.([0-9])([0-9]+)\.([0-9]+)$/\1.\2.\3/')
    ldflags="-s -w -X github.com/prometheus/common/version.Version=$version"
    ;;
  gpu-feature-discovery)
    # NVIDIA's GPU feature discovery, run over the simulated libnvidia-ml.so.1 by
    # e2e/tests/gpu_feature_discovery.rs. go-nvml loads the library with dlopen: cgo, and a C
    # compiler, are needed (CGO_ENABLED=1, Go's default when one is installed).
    pkg=github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery
    export CGO_ENABLED=1
    command -v cc >/dev/null || command -v gcc >/dev/null ||
      { echo "tools/build.sh: $name needs a C compiler (cgo): install gcc" >&2; exit 1; }
    tags=
    version=$(awk '$1 == "require" && $2 == "github.com/NVIDIA/k8s-device-plugin" {print $3}' "$here/$name/go.mod")
    ldflags="-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$version"
    ;;
  *) echo "tools/build.sh: unknown tool $name (helm, promtool, gpu-feature-discovery)" >&2; exit 2 ;;
esac
dir=$here/$name
# Keyed by what decides the binary: the pinned modules and the build flags.
key=$( (cat "$dir/go.mod" "$dir/go.sum"; echo "$pkg|$tags|$ldflags") | sha256sum | cut -c1-16)
cache=${TESSERA_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/tools}
bin="$cache/$name-$key/$name"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "tools/build.sh: Go >= 1.26 is required to build $name (https://go.dev/dl)" >&2; exit 1; }
echo "building $name $version into $(dirname "$bin") (first run only; later runs reuse it)" >&2
mkdir -p "$(dirname "$bin")"
start=$(date +%s)
# A private partial file, renamed when complete: a concurrent or killed build never leaves a
# half-written binary under the cached name.
trap 'rm -f "$bin.partial.$$"' EXIT
(cd "$dir" && go build -mod=mod -trimpath -tags "$tags" -ldflags "$ldflags" -o "$bin.partial.$$" "$pkg")
mv "$bin.partial.$$" "$bin"
echo "  built $name in $(( $(date +%s) - start ))s" >&2
echo "$bin"
