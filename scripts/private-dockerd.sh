#!/usr/bin/env bash
# A private, throwaway Docker daemon beside the machine's own, for tests that must not touch
# the shared one (TLS, faults) and for measurements. Everything it has lives under one folder:
#
#   DIR/data      --data-root, on a tmpfs of its own (so a test can make its disk full)
#   DIR/exec      --exec-root (its containerd, runtime state)
#   DIR/netns     its network namespace (slirp4netns gives it outbound access)
#   DIR/docker.sock, DIR/dockerd.pid, DIR/dockerd.log, DIR/daemon.json (empty: the machine's
#                 /etc/docker/daemon.json is not read)
#   DIR/tls       with --tls PORT: a CA, and the daemon's certificate for 127.0.0.1 (the
#                 host's 127.0.0.1:PORT is forwarded to the daemon)
#   DIR/client    ca.pem, cert.pem, key.pem: a client certificate (DOCKER_CERT_PATH)
#   DIR/client-nocert  ca.pem only
#
# It changes nothing on the host's network: it runs in a network namespace of its own (see
# make_netns), with no bridge, no iptables rules and no masquerading there either. It runs in
# a mount namespace of its own too, where each --hide PATH is an empty tmpfs: it cannot see
# codebox's files there (the repository, the programs, the data directories), as a daemon
# on another machine could not.
#
#   private-dockerd.sh start DIR [--tls PORT] [--data-mb N] [--load IMAGE]...
#                                [--load-archive FILE]... [--hide PATH]...
#                                      --load: `docker save IMAGE` from the machine's daemon;
#                                      --load-archive: a `docker save` archive made once for
#                                      several daemons (each image's layers read once)
#   private-dockerd.sh restart DIR     start the daemon again on the same folders
#   private-dockerd.sh stop DIR        stop it (by PID), unmount and remove DIR; idempotent
#   private-dockerd.sh keep DIR PID    stop DIR once process PID has ended (run it detached);
#                                      stop also removes the folder named in DIR/also-remove
#   private-dockerd.sh fill DIR        make the daemon's disk full (shrink its tmpfs to what
#                                      it holds)
#   private-dockerd.sh unfill DIR      give it its size back
#
# DIR must be short (a unix socket path is at most 107 bytes), and outside what --hide hides:
# mktemp -d /run/cbd.XXXXXX.
set -euo pipefail

die() { echo "private-dockerd: $*" >&2; exit 1; }

[ $# -ge 2 ] || die "usage: $0 start|restart|stop|keep DIR [...]"
cmd=$1; dir=${2%/}; shift 2

sock() { echo "unix://$dir/docker.sock"; }
pid_of_daemon() { [ -s "$dir/dockerd.pid" ] && cat "$dir/dockerd.pid" || true; }
# Running, and not a zombie (this machine's PID 1 may never reap the daemon it inherits).
running() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && ! awk '{ exit $3 != "Z" }' "/proc/$1/stat"; }
alive() { running "$(pid_of_daemon)"; }

# The daemon's own network namespace, kept as DIR/netns: started with --bridge=none in the
# host's namespace, dockerd deletes the host's docker0 (Moby's configureNetworking calls
# removeDefaultBridgeInterface), which breaks the machine's own daemon. slirp4netns gives the
# namespace outbound access from user space (image builds reach Debian's mirror) and forwards
# 127.0.0.1:PORT on the host to the daemon's TLS port; the host's interfaces, routes and
# iptables rules are never touched.
make_netns() {
  command -v slirp4netns >/dev/null || die "slirp4netns is missing (apt-get install slirp4netns)"
  touch "$dir/netns"
  unshare --net="$dir/netns" true
  nsenter --net="$dir/netns" ip link set lo up
  setsid slirp4netns --configure --mtu=65520 --disable-host-loopback --netns-type=path \
    --api-socket "$dir/slirp.sock" "$dir/netns" tap0 >"$dir/slirp.log" 2>&1 < /dev/null &
  for _ in $(seq 1 40); do [ -S "$dir/slirp.sock" ] && return 0; sleep 0.25; done
  die "slirp4netns did not start (see $dir/slirp.log)"
}

# Forward 127.0.0.1:PORT on the host to PORT in the daemon's namespace.
forward_port() {
  python3 - "$dir/slirp.sock" "$1" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
port = int(sys.argv[2])
s.sendall(json.dumps({"execute": "add_hostfwd", "arguments": {
    "proto": "tcp", "host_addr": "127.0.0.1", "host_port": port, "guest_port": port}}).encode())
answer = json.loads(s.recv(4096))
sys.exit("slirp4netns: %s" % answer if "error" in answer else 0)
PY
}

launch() {
  # A pid file of a killed daemon stops a new one from starting, and one of its containerd
  # (killed with it, possibly not yet reaped) makes the new daemon wait for it in vain.
  alive || rm -f "$dir/dockerd.pid"
  running "$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null)" ||
    rm -f "$dir/exec/containerd/containerd.pid"
  local args=(--config-file "$dir/daemon.json" --data-root "$dir/data" --exec-root "$dir/exec"
    --pidfile "$dir/dockerd.pid" -H "$(sock)"
    --bridge=none --iptables=false --ip-masq=false --ip6tables=false)
  if [ -s "$dir/tls-port" ]; then
    args+=(-H "tcp://0.0.0.0:$(cat "$dir/tls-port")" --tlsverify
      --tlscacert "$dir/tls/ca.pem" --tlscert "$dir/tls/server-cert.pem"
      --tlskey "$dir/tls/server-key.pem")
  fi
  # Its own session (a terminal's signals reach it only through stop), its own network
  # namespace, and a mount namespace of its own in which the --hide paths are empty.
  # shellcheck disable=SC2016
  setsid nsenter --net="$dir/netns" unshare --mount --propagation private -- bash -c '
    while IFS= read -r p; do mount -t tmpfs -o size=1m,mode=0755 codebox-hidden "$p"; done < "$0"
    exec dockerd "$@"' "$dir/hide" "${args[@]}" >>"$dir/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 120); do
    if docker -H "$(sock)" version >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  tail -n 20 "$dir/dockerd.log" >&2
  echo "private-dockerd: dockerd in $dir did not answer within 30 s" >&2
  return 1
}

make_certs() {
  local port=$1 t="$dir/tls"
  mkdir -p "$t" "$dir/client" "$dir/client-nocert"
  command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
  (
    cd "$t"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=codebox test CA" \
      -keyout ca-key.pem -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout server-key.pem -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
      -extfile server.ext -out server-cert.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=codebox client" \
      -keyout key.pem -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
      -extfile client.ext -out cert.pem 2>/dev/null
  )
  cp "$t/ca.pem" "$t/cert.pem" "$t/key.pem" "$dir/client/"
  cp "$t/ca.pem" "$dir/client-nocert/"
  chmod 0600 "$dir/client/key.pem" "$t/ca-key.pem" "$t/server-key.pem"
  echo "$port" > "$dir/tls-port"
}

# Every process that belongs to this daemon's folder (its dockerd, containerd, shims,
# slirp4netns), or only those whose command line names a path under ${1:-DIR/}.
own_processes() {
  local p under=${1:-$dir/}
  for p in /proc/[0-9]*; do
    if { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -qF -- "$under"; then
      basename "$p"
    fi
  done
}

stop() {
  [ -d "$dir" ] || return 0
  # A daemon killed with SIGKILL leaves its shims and their containers running: started
  # again, it stops them, and can then remove them.
  if ! alive && [ -n "$(own_processes "$dir/exec/")" ] && [ -S "$dir/docker.sock" ]; then
    launch >/dev/null 2>&1 || true
  fi
  if alive; then
    local pid; pid=$(pid_of_daemon)
    kill -CONT "$pid" 2>/dev/null || true
    local ids
    ids=$(timeout 30 docker -H "$(sock)" ps -aq 2>/dev/null || true)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      timeout 60 docker -H "$(sock)" rm -f $ids >/dev/null 2>&1 || true
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 80); do running "$pid" || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # Whatever is left of it: its containerd, shims.
  local p
  for p in $(own_processes); do
    [ "$p" = "$$" ] || kill -KILL "$p" 2>/dev/null || true
  done
  # Deepest mounts first: container root filesystems, shm, the data tmpfs.
  local mounts m
  mounts=$(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  # A folder of the caller's to go with the daemon (its test files).
  if [ -s "$dir/also-remove" ]; then rm -rf "$(cat "$dir/also-remove")"; fi
  rm -rf "$dir"
}

case "$cmd" in
  start)
    [ -d "$dir" ] || die "$dir does not exist (mktemp -d /tmp/cbd.XXXXXX)"
    command -v dockerd >/dev/null || die "dockerd is missing (scripts/ensure-docker.sh installs it)"
    port=""; data_mb=1536; load=(); archives=(); : > "$dir/hide"
    while [ $# -gt 0 ]; do
      case "$1" in
        --tls) port=$2; shift 2 ;;
        --data-mb) data_mb=$2; shift 2 ;;
        --load) load+=("$2"); shift 2 ;;
        --load-archive) archives+=("$2"); shift 2 ;;
        --hide) echo "$2" >> "$dir/hide"; shift 2 ;;
        *) die "unknown option $1" ;;
      esac
    done
    mkdir -p "$dir/data" "$dir/exec"
    echo '{}' > "$dir/daemon.json"
    make_netns
    mount -t tmpfs -o "size=${data_mb}m,mode=0711" codebox-private-dockerd "$dir/data"
    echo "$data_mb" > "$dir/data-mb"
    if [ -n "$port" ]; then make_certs "$port"; forward_port "$port"; fi
    launch || exit 1
    for image in "${load[@]}"; do
      docker save "$image" | docker -H "$(sock)" load >/dev/null
    done
    for archive in "${archives[@]}"; do
      docker -H "$(sock)" load -i "$archive" >/dev/null
    done
    ;;
  restart)
    alive && die "the daemon in $dir still runs"
    launch || exit 1
    ;;
  stop)
    stop
    ;;
  fill)
    used=$(df -k --output=used "$dir/data" | tail -n 1 | tr -d ' ')
    mount -o "remount,size=${used}k" "$dir/data"
    ;;
  unfill)
    mount -o "remount,size=$(cat "$dir/data-mb")m" "$dir/data"
    ;;
  keep)
    [ $# -ge 1 ] || die "keep DIR PID"
    while running "$1"; do sleep 1; done
    stop
    ;;
  *)
    die "unknown command $cmd"
    ;;
esac
