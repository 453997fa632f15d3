#!/usr/bin/env bash
# Create the base image `debian:bookworm-slim` locally, for hosts that reach Debian's package
# mirror but no container registry. Skipped when the image is already present or can be pulled.
# Uses debootstrap (minbase) and `docker import`; takes about a minute.
set -euo pipefail

base=${CODEBOX_BASE_IMAGE:-debian:bookworm-slim}

if docker image inspect "$base" >/dev/null 2>&1; then
  echo "bootstrap-base: $base is present"
  exit 0
fi
if timeout 20 docker pull -q "$base" >/dev/null 2>&1; then
  echo "bootstrap-base: pulled $base"
  exit 0
fi

echo "bootstrap-base: no registry reachable; building $base with debootstrap"
started=$(date +%s)
if ! command -v debootstrap >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq debootstrap >/dev/null
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" >/dev/null
# Keep the image small, as the official slim image does.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$base" >/dev/null
echo "bootstrap-base: imported $base in $(( $(date +%s) - started )) s"
