#!/usr/bin/env bash
# Container images for the operator and the node agent, built from this workspace and Debian
# packages with whichever engine the machine has (buildah, podman or docker), written as OCI archives
# under target/images/. Usage:
#   scripts/images.sh build   # cargo build, root filesystem, both images, OCI archives
#   scripts/images.sh check   # each binary runs inside its image; users, labels, sizes
#
# Each image is its Dockerfile (operator/Dockerfile, node-agent/Dockerfile) built with the `build`
# and `rootfs` stages replaced by named build contexts: the binary cargo built here and the root
# filesystem from scripts/image-rootfs.sh. `docker build` of the same file runs those two stages in
# containers instead; the last stage, which makes the image, is the same text.
#
# Env: PROFILE (release; `make test` uses dev, the binaries it already built), ENGINE (auto),
# IMAGE_PREFIX (tessera: tessera/operator, tessera/node-agent), IMAGE_TAG (v<workspace version>),
# DEBIAN_SUITE, DEBIAN_MIRROR (see image-rootfs.sh), SKIP_CARGO=1 (binaries already built).
# Reproducible: file times and the image's creation time are the last commit's time
# (SOURCE_DATE_EPOCH), so the same commit, packages and binaries give the same image ID.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-build}
profile=${PROFILE:-release}
prefix=${IMAGE_PREFIX:-tessera}
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
# Images of other profiles than release are tagged as such, so nobody pushes a `make test` build.
tag=${IMAGE_TAG:-v$version$([ "$profile" = release ] || echo "-$profile")}
out=target/images
components=(operator node-agent)

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'images: %s\n' "$*" >&2; exit 1; }

binary_of() { case $1 in operator) echo tessera-operator ;; node-agent) echo node-agent ;; esac; }
package_of() { case $1 in operator) echo tessera-operator ;; node-agent) echo tessera-node-agent ;; esac; }
# operator.oci.tar for release; operator-dev.oci.tar for `make test`'s, so neither overwrites the other.
archive_of() { echo "$out/$1$([ "$profile" = release ] || echo "-$profile").oci.tar"; }

# --- the engine -------------------------------------------------------------------------------
# buildah keeps its own storage under target/images (vfs: works in containers and needs no
# kernel features; a build touches nothing of the user's engine state).
pick_engine() {
  if [ -n "${ENGINE:-}" ] && [ "$ENGINE" != auto ]; then echo "$ENGINE"; return; fi
  if command -v buildah >/dev/null; then echo buildah; return; fi
  if command -v podman >/dev/null && podman info >/dev/null 2>&1; then echo podman; return; fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  die "no container engine: install buildah (Debian/Ubuntu: apt-get install buildah mmdebstrap), podman, or docker with a running daemon"
}
engine=$(pick_engine)
buildah_() {
  buildah --root "$PWD/$out/storage" --runroot "$PWD/$out/run" --storage-driver vfs "$@"
}

# build COMPONENT IMAGE: the Dockerfile with the `build` and `rootfs` stages as named contexts.
engine_build() {
  local c=$1 image=$2 ctx=(--build-context "build=$out/ctx/$1" --build-context "rootfs=$out/ctx/rootfs")
  local args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created"
    --build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" -f "$c/Dockerfile" -t "$image")
  case $engine in
    buildah) buildah_ build --quiet --timestamp "$SOURCE_DATE_EPOCH" --identity-label=false "${ctx[@]}" "${args[@]}" "$out/ctx/empty" >/dev/null ;;
    podman) podman build --quiet --timestamp "$SOURCE_DATE_EPOCH" --identity-label=false "${ctx[@]}" "${args[@]}" "$out/ctx/empty" >/dev/null ;;
    docker) docker buildx build --quiet --load "${ctx[@]}" "${args[@]}" "$out/ctx/empty" >/dev/null ;;
  esac
}

engine_save() { # IMAGE ARCHIVE
  rm -f "$2"
  case $engine in
    buildah) buildah_ push --quiet "$1" "oci-archive:$2:$1" ;;
    podman) podman save --quiet --format oci-archive -o "$2" "$1" ;;
    docker) docker save -o "$2" "$1" ;; # Docker >= 25 writes an OCI image layout
  esac
}

engine_load() { # ARCHIVE IMAGE
  case $engine in
    buildah) buildah_ pull --quiet "oci-archive:$1" >/dev/null ;;
    podman) podman load --quiet -i "$1" >/dev/null ;;
    docker) docker load --quiet -i "$1" >/dev/null ;;
  esac
}

engine_inspect() { # IMAGE GO-TEMPLATE-ON-OCI-CONFIG (.User, .Labels ...)
  case $engine in
    buildah) buildah_ inspect --type image --format "{{.OCIv1.Config$2}}" "$1" ;;
    podman | docker) $engine image inspect --format "{{.Config$2}}" "$1" ;;
  esac
}

# Bytes of an archive's blobs once decompressed: the image's unpacked size, whatever the engine.
unpacked_size() {
  local blob total=0
  for blob in $(tar -tf "$1" | grep '^blobs/[^/]*/.'); do
    total=$((total + $(tar -xOf "$1" "$blob" | { gzip -dc 2>/dev/null || cat; } | wc -c)))
  done
  echo "$total"
}

# run IMAGE ARGS...: the image's entrypoint with ARGS in the image's filesystem, as the image's user.
# With buildah as root this chroots into the mounted image: `buildah run --isolation chroot` loses
# a short program's output now and then (about 1 run in 25 here), which would make `make test` flaky.
engine_run() {
  local image=$1 entrypoint
  shift
  entrypoint=$(engine_inspect "$image" '.Entrypoint' | tr -d '[]')
  case $engine in
    buildah)
      local c rc=0 user
      c=$(buildah_ from --quiet --pull-never "$image")
      if [ "$(id -u)" = 0 ]; then
        user=$(engine_inspect "$image" '.User')
        env -i PATH=/usr/local/bin:/usr/bin:/bin "$(command -v chroot)" --userspec="${user:-0:0}" "$(buildah_ mount "$c")" "$entrypoint" "$@" || rc=$?
        buildah_ umount "$c" >/dev/null
      else
        buildah_ run --isolation chroot "$c" -- "$entrypoint" "$@" || rc=$?
      fi
      buildah_ rm "$c" >/dev/null
      return $rc
      ;;
    podman | docker) $engine run --rm --network none "$image" "$@" ;;
  esac
}

# --- build ------------------------------------------------------------------------------------
build() {
  command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (Debian/Ubuntu: apt-get install mmdebstrap)"
  local dir=$profile
  [ "$profile" = dev ] && dir=debug
  local bins=${CARGO_TARGET_DIR:-target}/$dir
  if [ -z "${SKIP_CARGO:-}" ]; then
    say "cargo build --profile $profile (operator, node agent)"
    ${CARGO:-cargo} build --locked --profile "$profile" -p tessera-operator -p tessera-node-agent --bins
  fi

  rm -rf "$out/ctx"
  mkdir -p "$out/ctx/empty"
  say "root filesystem from Debian $DEBIAN_SUITE (scripts/image-rootfs.sh)"
  scripts/image-rootfs.sh "$out/ctx/rootfs/out/rootfs"
  for c in "${components[@]}"; do
    local b
    b=$(binary_of "$c")
    [ -x "$bins/$b" ] || die "$bins/$b is missing: build it (cargo build --profile $profile -p $(package_of "$c"))"
    install -D -m 0755 "$bins/$b" "$out/ctx/$c/out/bin/$b"
    touch --date="@$SOURCE_DATE_EPOCH" "$out/ctx/$c/out/bin/$b" "$out/ctx/$c/out/bin" "$out/ctx/$c/out"
  done

  for c in "${components[@]}"; do
    local image=$prefix/$c:$tag archive
    archive=$(archive_of "$c")
    say "$engine: $image -> $archive"
    engine_build "$c" "$image"
    engine_save "$image" "$archive"
  done
  say "push: skopeo copy oci-archive:$(archive_of operator) docker://REGISTRY/tessera/operator:$tag (README: Install on a real cluster)"
}

# --- check ------------------------------------------------------------------------------------
expect() { # WHAT PATTERN COMMAND...: COMMAND succeeds and prints PATTERN
  local what=$1 pattern=$2 output
  shift 2
  output=$("$@" 2>&1) || die "$what: exit $?: $output"
  grep -q -- "$pattern" <<<"$output" || die "$what: output lacks '$pattern': $output"
  say "ok: $what"
}

check() {
  for c in "${components[@]}"; do
    [ -f "$(archive_of "$c")" ] || die "$(archive_of "$c") is missing: run scripts/images.sh build"
    engine_load "$(archive_of "$c")" "$prefix/$c:$tag"
  done
  local op=$prefix/operator:$tag agent=$prefix/node-agent:$tag
  expect "operator --help in its image" "Usage:" engine_run "$op" --help
  expect "operator mig fit in its image" "fits on H100-80GB" engine_run "$op" mig fit --gpu H100-80GB 3g.40gb=2
  local user
  user=$(engine_inspect "$op" '.User')
  [[ $user =~ ^[1-9][0-9]*(:[0-9]+)?$ ]] || die "operator image user is '$user', want a numeric non-root UID (runAsNonRoot)"
  say "ok: operator image user $user"

  expect "node-agent --help in its image" "Usage:" engine_run "$agent" --help
  # The agent drives simulated GPUs inside its image, and without a driver NVML fails with a clear
  # error (libnvidia-ml.so.1 not found) instead of a crash.
  expect "node-agent drives simulated GPUs in its image" "catalog: matches" \
    engine_run "$agent" probe --backend sim --sim-state /tmp/sim.json --sim-gpus H100-80GB
  local nvml rc=0
  nvml=$(engine_run "$agent" probe --backend nvml 2>&1) || rc=$?
  if [ "$rc" = 0 ] || ! grep -q "initialise NVML" <<<"$nvml" || grep -q panicked <<<"$nvml"; then
    die "node-agent probe --backend nvml without a driver: want a clear NVML error, got exit $rc: $nvml"
  fi
  say "ok: node-agent without a driver: $(grep -m1 'initialise NVML' <<<"$nvml")"

  for c in "${components[@]}"; do
    local image=$prefix/$c:$tag v r
    v=$(engine_inspect "$image" '.Labels')
    grep -q "org.opencontainers.image.version:$version" <<<"$v" || die "$image: no version label $version: $v"
    r=$(sed -n 's/.*org.opencontainers.image.revision:\([^ ]*\).*/\1/p' <<<"$v")
    [ -n "$r" ] && [ "$r" != unknown ] || die "$image: no revision label: $v"
    printf 'size: %-28s %6s MB unpacked, %6s MB archive %s (version %s, revision %s, manifest %s)\n' "$image" \
      "$(numfmt --to-unit=1000000 --format=%.1f "$(unpacked_size "$(archive_of "$c")")")" \
      "$(numfmt --to-unit=1000000 --format=%.1f "$(stat -c %s "$(archive_of "$c")")")" "$(archive_of "$c")" "$version" "$r" \
      "$(tar -xOf "$(archive_of "$c")" index.json | grep -o 'sha256:[0-9a-f]*' | head -1)"
  done
}

# The last commit's time and revision; "-dirty" when the tree differs from it.
git() { command git -c safe.directory="$PWD" "$@"; } # a checkout owned by another user
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision=$revision-dirty
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
export DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}

case $mode in
  build) build ;;
  check) check ;;
  *) die "usage: scripts/images.sh build | check" ;;
esac
