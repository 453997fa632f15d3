#!/usr/bin/env bash
# Make sure a Docker daemon answers. On a machine with none, install Debian's docker.io and
# start dockerd in the background (log: ${CODEBOX_DOCKERD_LOG:-/var/log/codebox-dockerd.log}).
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-docker: no dockerd here; installing docker.io from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

log=${CODEBOX_DOCKERD_LOG:-/var/log/codebox-dockerd.log}
echo "ensure-docker: starting dockerd (log: $log)" >&2
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "ensure-docker: daemon is up ($(docker version --format '{{.Server.Version}}'))" >&2
    exit 0
  fi
  sleep 1
done
echo "ensure-docker: dockerd did not answer within 60 s; see $log" >&2
exit 1
