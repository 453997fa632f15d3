#!/bin/bash
# The guest's daemons besides rootful Docker (run inside the guest, from the payload disk):
#   daemon.sh start podman|rootless   start it; print the DOCKER_HOST to use once it answers
#   daemon.sh stop podman|rootless
#   daemon.sh runtimes                register runsc and crun with rootful Docker and reload it
# The boot that loads the images (scripts/vm-host.sh) and the suites both use it; a change
# here re-makes the guest's images layer.
user_env=(env XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus)
case "$1 ${2:-}" in
  "start podman")
    systemctl start podman.socket || exit 1
    host=unix:///run/podman/podman.sock ;;
  "stop podman")
    systemctl stop podman.socket podman.service; exit 0 ;;
  "start rootless")
    loginctl enable-linger rootless
    for i in $(seq 60); do [ -S /run/user/1000/bus ] && break; sleep 1; done
    runuser -u rootless -- "${user_env[@]}" systemd-run --user --unit=dockerd-rootless -p Delegate=yes \
      -E PATH=/usr/share/docker.io/contrib:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      /usr/share/docker.io/contrib/dockerd-rootless.sh >/dev/null 2>&1 || exit 1
    host=unix:///run/user/1000/docker.sock ;;
  "stop rootless")
    runuser -u rootless -- "${user_env[@]}" systemctl --user stop dockerd-rootless 2>/dev/null
    loginctl disable-linger rootless; exit 0 ;;
  "runtimes ")
    # Debian's runsc as the host registers it (scripts/ensure-docker.sh), with systemd's
    # cgroups (Docker on cgroup v2 uses the systemd driver); Debian's crun.
    mkdir -p /etc/docker
    cat > /etc/docker/daemon.json <<'JSON'
{
  "runtimes": {
    "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--systemd-cgroup"]},
    "crun": {"path": "/usr/bin/crun"}
  }
}
JSON
    kill -HUP "$(cat /run/docker.pid)"
    for i in $(seq 30); do
      docker info --format '{{json .Runtimes}}' | grep -q crun && exit 0; sleep 1
    done
    echo "daemon.sh: Docker did not load the runtimes" >&2; exit 1 ;;
  *) echo "usage: daemon.sh start|stop podman|rootless, or daemon.sh runtimes" >&2; exit 2 ;;
esac
for i in $(seq 180); do DOCKER_HOST=$host docker info >/dev/null 2>&1 && { echo "$host"; exit 0; }; sleep 1; done
echo "daemon.sh: $2 did not answer at $host within 180 s" >&2
if [ "$2" = rootless ]; then
  runuser -u rootless -- "${user_env[@]}" journalctl --user -u dockerd-rootless --no-pager 2>&1 | tail -n 15 >&2
else
  journalctl -u podman.socket -u podman.service --no-pager | tail -n 15 >&2
fi
exit 1
