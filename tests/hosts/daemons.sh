# The other daemons (run inside the guest by `scripts/vm-host.sh --suite daemons`): the
# same outcomes and a session through rootless Docker and through Podman's Docker-compatible
# API, each reached with DOCKER_HOST and nothing else changed. The images come on the
# payload disk (tests/hosts/daemons.images) and are loaded into each daemon's own store.
. /payload/hosts/lib.sh
for i in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 1; done

# suite LABEL: the doctor, the outcomes, a session and the leftovers through $DOCKER_HOST.
suite() {
  local label=$1
  step "$label: loading the images"
  local t; t=$(date +%s)
  if docker load -q -i /payload/images.tar >/tmp/load.log 2>&1; then
    ok "$label: images loaded in $(( $(date +%s) - t )) s"
  else
    bad "$label: docker load: $(tail -n 3 /tmp/load.log)"; return
  fi
  step "$label: codebox doctor"
  local out; out=$(codebox doctor 2>&1); echo "$out" | grep -v 'missing: run' | sed 's/^/     /'
  if echo "$out" | grep FAIL | grep -v 'missing: run' | grep -q .; then
    bad "$label doctor: a posture or host check failed"
  else
    ok "$label doctor: every posture check passes"
  fi
  step "$label: outcomes and usage"
  outcomes "$label"
  step "$label: a session over /v1"
  codebox serve --transport http --listen 127.0.0.1:8765 --no-auth >/tmp/serve.log 2>&1 &
  local serve=$!
  for i in $(seq 60); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8765/v1/languages")' 2>/dev/null && break; sleep 1; done
  python3 /payload/hosts/session.py http://127.0.0.1:8765 "$label" && ok "$label session" || bad "$label session"
  kill "$serve"; wait "$serve" 2>/dev/null
  nothing_left "$label"
}

step "Podman (rootful): starting its Docker-compatible API"
systemctl start podman.socket
export DOCKER_HOST=unix:///run/podman/podman.sock
for i in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
if docker info >/dev/null 2>&1; then
  ok "Podman API up: $(docker version --format '{{.Server.Version}}' 2>&1)"
  suite podman
  systemctl stop podman.socket podman.service 2>/dev/null
else
  bad "Podman's API did not answer: $(journalctl -u podman.socket -u podman.service --no-pager | tail -n 10)"
fi

step "rootless Docker: starting it"
loginctl enable-linger rootless
for i in $(seq 60); do [ -S /run/user/1000/bus ] && break; sleep 1; done
echo "     user manager delegates: $(cat /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/cgroup.controllers 2>&1)"
runuser -u rootless -- env XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
  systemd-run --user --unit=dockerd-rootless -p Delegate=yes \
  -E PATH=/usr/share/docker.io/contrib:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
  /usr/share/docker.io/contrib/dockerd-rootless.sh
export DOCKER_HOST=unix:///run/user/1000/docker.sock
for i in $(seq 180); do docker info >/dev/null 2>&1 && break; sleep 1; done
if docker info >/dev/null 2>&1; then
  ok "rootless Docker up: $(docker info --format 'cgroup {{.CgroupVersion}} ({{.CgroupDriver}}) {{.SecurityOptions}}')"
  suite rootless
else
  bad "rootless Docker did not start: $(runuser -u rootless -- env XDG_RUNTIME_DIR=/run/user/1000 journalctl --user -u dockerd-rootless --no-pager 2>&1 | tail -n 15)"
fi
runuser -u rootless -- env XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus systemctl --user stop dockerd-rootless 2>/dev/null

unset DOCKER_HOST
finish
