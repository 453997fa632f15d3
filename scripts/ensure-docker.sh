#!/usr/bin/env bash
# Make sure a Docker daemon answers. On a machine with none, install Debian's docker.io and
# start dockerd in the background (log: ${CODEBOX_DOCKERD_LOG:-/var/log/codebox-dockerd.log}).
#
#   --with-runsc   also install gVisor (Debian's runsc) and register it with the daemon as the
#                  runtime `runsc`, for `sandbox.runtime = "runsc"`. A running daemon reloads
#                  its runtimes (SIGHUP); nothing else about it changes.
#
# runsc is registered with `--network=none`: codebox containers have no network anyway, and
# without it this runsc refuses containers whose network mode is none ("cannot run with
# network enabled in root network namespace"). And with `--host-uds=open`: a container codebox
# lets out (an install step, or programs under `sandbox.egress_hosts`) reaches codebox's egress
# proxy only through a Unix socket in a host directory mounted into it, which gVisor refuses
# to connect to without it (codebox mounts no other host path, so nothing else is opened). Not with `--oci-seccomp`: this runsc then
# refuses every thread (codebox's `clone` rule, a masked comparison, never matches inside it),
# so under runsc the program meets gVisor's own kernel instead of codebox's seccomp profile.
set -euo pipefail

with_runsc=0
for arg in "$@"; do
  case "$arg" in
    --with-runsc) with_runsc=1 ;;
    *) echo "ensure-docker: unknown option $arg (known: --with-runsc)" >&2; exit 2 ;;
  esac
done

install_packages() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "$@" >/dev/null
}

# Register runsc in /etc/docker/daemon.json, keeping whatever else is there.
register_runsc() {
  command -v runsc >/dev/null 2>&1 || install_packages runsc
  mkdir -p /etc/docker
  python3 - "$(command -v runsc)" <<'EOF'
import json, os, sys
path = "/etc/docker/daemon.json"
config = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        config = json.load(f)
want = {"path": sys.argv[1], "runtimeArgs": ["--network=none", "--host-uds=open"]}
if config.get("runtimes", {}).get("runsc") == want:
    sys.exit(0)
config.setdefault("runtimes", {})["runsc"] = want
tmp = path + ".codebox-tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("ensure-docker: registered runsc in " + path, file=sys.stderr)
EOF
}

if [ "$with_runsc" = 1 ]; then
  register_runsc
fi

if docker info >/dev/null 2>&1; then
  # The daemon's runtimes as loaded must match what daemon.json now says.
  if [ "$with_runsc" = 1 ] && ! docker info --format '{{json .Runtimes.runsc}}' | grep -q -- '"--network=none","--host-uds=open"\]'; then
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [ -z "$pid" ]; then
      echo "ensure-docker: runsc is registered in /etc/docker/daemon.json, but the daemon's pid is unknown: restart it to load runsc" >&2
      exit 1
    fi
    echo "ensure-docker: reloading the daemon's runtimes (SIGHUP to $pid)" >&2
    kill -HUP "$pid"
    for _ in $(seq 1 20); do
      docker info --format '{{json .Runtimes.runsc}}' | grep -q -- '"--network=none","--host-uds=open"\]' && exit 0
      sleep 0.5
    done
    echo "ensure-docker: the daemon did not pick up runsc; see its log" >&2
    exit 1
  fi
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-docker: no dockerd here; installing docker.io from Debian" >&2
  install_packages docker.io
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
