#!/usr/bin/env bash
# The root filesystem both Tessera images start from: glibc and libgcc from Debian bookworm, nothing
# else (no shell, no package manager, no CA bundle: in a pod the API server's CA comes with the
# service account). Both binaries are glibc programs; the node agent also needs glibc for the
# libnvidia-ml.so.1 that the NVIDIA container runtime injects at run time.
#
# Usage: scripts/image-rootfs.sh OUTDIR
# Used by scripts/images.sh on the host and by the `rootfs` stage of operator/Dockerfile and
# node-agent/Dockerfile, so both paths produce the same files.
# Env: DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (Debian's default; a snapshot.debian.org URL pins
# every package version), SOURCE_DATE_EPOCH (file times).
set -euo pipefail

out=${1:?usage: image-rootfs.sh OUTDIR}
suite=${DEBIAN_SUITE:-bookworm}
packages=libc6,libgcc-s1

rm -rf "$out"
mkdir -p "$(dirname "$out")"
# `extract` unpacks the packages (and what they depend on) without running anything inside, so it
# needs neither root nor a chroot; `chrootless` keeps it that way.
# The extract hook records each package as distroless images do (/var/lib/dpkg/status.d/<name>), so
# vulnerability scanners see what the image holds.
# shellcheck disable=SC2016 # expanded by mmdebstrap's hook shell
record='mkdir -p "$1"/var/lib/dpkg/status.d; for deb in "$1"/var/cache/apt/archives/*.deb; do
  name=$(dpkg-deb -f "$deb" Package); { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } >"$1"/var/lib/dpkg/status.d/"$name"; done'
mmdebstrap --quiet --mode=chrootless --variant=extract --include="$packages" --extract-hook="$record" \
  "$suite" "$out" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"}

# Keep the libraries and their copyright files; drop what only a package manager or a human reads.
# /dev is the container runtime's.
rm -rf "$out"/dev "$out"/etc/apt "$out"/etc/dpkg "$out"/var/cache "$out"/var/lib/apt "$out"/var/lib/dpkg/[!s]* \
  "$out"/var/lib/dpkg/status \
  "$out"/var/log "$out"/usr/share/lintian "$out"/usr/share/locale "$out"/usr/share/i18n \
  "$out"/usr/lib/x86_64-linux-gnu/gconv "$out"/etc/fstab "$out"/etc/hostname "$out"/etc/resolv.conf
find "$out"/usr/share/doc -type f ! -name copyright -delete

# The operator runs as 65532 (`nonroot`, as in distroless images); the node agent as root.
mkdir -p "$out"/etc "$out"/tmp
chmod 1777 "$out"/tmp
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >"$out"/etc/passwd
printf 'root:x:0:\nnonroot:x:65532:\n' >"$out"/etc/group
printf 'hosts: files dns\n' >"$out"/etc/nsswitch.conf

if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  find "$out" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
fi
