#!/usr/bin/env bash
# Several codebox servers as one (SPEC section 15), measured: a throwaway PostgreSQL, then 1, 2
# and 3 `codebox serve --transport http` servers sharing it behind Debian's nginx, each
# measured by `codebox bench --url` through nginx; first the shared queue alone
# (`codebox bench --shared-queue`) on the same database. Prints a table.
#
#   scripts/cluster-bench.sh [--binary PATH] [--n RUNS] [--clients K] [--queue-n RUNS]
#                            [--servers "1 2 3"] [LANG]
#
# Everything is on this machine and its Docker daemon: PostgreSQL listens on a Unix socket
# in a temporary folder only (no TCP port), the servers and nginx on 127.0.0.1. Everything
# started here is stopped by its PID (servers by SIGTERM, which drains them and removes their
# containers), and the temporary folder is removed, also when the script fails or is
# interrupted. Needs PostgreSQL's server (scripts/ensure-postgres.sh), nginx
# (scripts/ensure-nginx.sh), curl, and the language's image (`codebox images build`).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release/codebox
n=120
clients=16
queue_n=600
servers_list="1 2 3"
lang=bash
while [ $# -gt 0 ]; do
  case $1 in
    --binary) bin=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --queue-n) queue_n=$2; shift 2 ;;
    --servers) servers_list=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "cluster-bench: unknown flag $1" >&2; exit 2 ;;
    *) lang=$1; shift ;;
  esac
done
[ -x "$bin" ] || { echo "cluster-bench: no codebox binary at $bin (cargo build --release, or --binary PATH)" >&2; exit 1; }
"$root/scripts/ensure-postgres.sh"
"$root/scripts/ensure-nginx.sh"
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

work=$(mktemp -d /tmp/codebox-cluster-bench.XXXXXX)
chmod 755 "$work"
pg_pid=
pids=()

# Stop what this script started, by PID: nginx and the servers (SIGTERM, then wait), then
# PostgreSQL; remove the folder.
stop_started() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
cleanup() {
  stop_started
  if [ -n "$pg_pid" ]; then
    as_pg "$pgbin/pg_ctl" stop -m fast -w -D "$work/pg/data" >/dev/null 2>&1 \
      || kill -KILL "$pg_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# PostgreSQL refuses to run as root: then it runs as nobody.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() { # URL LOG: until URL answers, up to 60 s; else the end of LOG
  local i
  for i in $(seq 600); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "cluster-bench: $1 did not answer; the end of $2:" >&2
  tail -20 "$2" >&2 || true
  return 1
}

# The throwaway PostgreSQL: its socket in $work/pg, no TCP.
mkdir "$work/pg"
[ "$(id -u)" -ne 0 ] || chown nobody: "$work/pg"
as_pg "$pgbin/initdb" --no-sync --auth=trust --encoding=UTF8 --locale=C -U codebox \
  -D "$work/pg/data" >/dev/null
as_pg "$pgbin/pg_ctl" start -w -D "$work/pg/data" -l "$work/pg/log" \
  -o "-k $work/pg -c listen_addresses='' -p 5432 -c fsync=off -c synchronous_commit=off" >/dev/null
pg_pid=$(head -1 "$work/pg/data/postmaster.pid")
socket=${work//\//%2F}%2Fpg
database() { # NAME: a new database, its history.url
  "$pgbin/createdb" -h "$work/pg" -U codebox "$1"
  echo "postgres://codebox@$socket:5432/$1"
}

head -c 32 /dev/urandom | base64 >"$work/token"
head -c 32 /dev/urandom | base64 >"$work/cluster.secret"
mkdir "$work/bench"
# Every codebox process here: this repository's languages, its own data directory, no
# config file of the user's. (`exec`: a server started as `codebox ... &` is its own PID.)
codebox() { # DATA_DIR ARGS...
  local data=$1
  shift
  exec env -u CODEBOX_CONFIG -u CODEBOX_TOKEN CODEBOX_DATA_DIR="$data" CODEBOX_LOG=warn \
    "$bin" --languages "$root/languages.toml" "$@"
}

echo "codebox cluster bench: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $bin"
echo
echo "== the shared queue alone"
queue_url=$(database queue)
(codebox "$work/bench" bench --shared-queue --n "$queue_n" --set "history.url=$queue_url")

rows=()
for count in $servers_list; do
  url=$(database "servers$count")
  upstreams=
  for k in $(seq "$count"); do
    port=$(free_port)
    data="$work/s$count-$k"
    mkdir "$data"
    codebox "$data" serve --transport http --listen "127.0.0.1:$port" \
      --token-file "$work/token" --set "history.url=$url" \
      --set "cluster.advertise_url=http://127.0.0.1:$port" \
      --set "cluster.secret_file=$work/cluster.secret" >"$data/log" 2>&1 &
    pids+=($!)
    wait_for "http://127.0.0.1:$port/healthz" "$data/log"
    upstreams+="        server 127.0.0.1:$port max_fails=0;"$'\n'
  done
  # nginx as tests/it/cluster.rs configures it: round robin, keepalive, no buffering.
  nport=$(free_port)
  nginx_dir="$work/nginx$count"
  mkdir "$nginx_dir"
  user=
  [ "$(id -u)" -ne 0 ] || user="user root;"
  cat >"$nginx_dir/nginx.conf" <<EOF
$user
worker_processes 1;
daemon off;
pid $nginx_dir/nginx.pid;
error_log $nginx_dir/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $nginx_dir/body;
    proxy_temp_path $nginx_dir/proxy;
    fastcgi_temp_path $nginx_dir/fastcgi;
    uwsgi_temp_path $nginx_dir/uwsgi;
    scgi_temp_path $nginx_dir/scgi;
    upstream codebox {
$upstreams        keepalive 32;
    }
    server {
        listen 127.0.0.1:$nport;
        client_max_body_size 32m;
        location / {
            proxy_pass http://codebox;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }
    }
}
EOF
  /usr/sbin/nginx -p "$nginx_dir" -c "$nginx_dir/nginx.conf" 2>"$nginx_dir/stderr" &
  pids+=($!)
  wait_for "http://127.0.0.1:$nport/healthz" "$nginx_dir/error.log"

  echo
  echo "== $count server(s) behind nginx"
  out=$(codebox "$work/bench" bench --url "http://127.0.0.1:$nport" --token-file "$work/token" \
    --clients "$clients" --n "$n" "$lang") || true
  echo "$out"
  rate=$(grep -oP '[0-9.]+(?= runs/s)' <<<"$out" || echo "-")
  median=$(grep -oP 'median \K[0-9]+(?= ms)' <<<"$out" || echo "-")
  spread=$(psql -h "$work/pg" -U codebox -d "servers$count" -Atc \
    "SELECT string_agg(n::text, '/' ORDER BY n DESC) FROM (SELECT COUNT(*) AS n FROM runs GROUP BY instance) c")
  rows+=("$(printf '| %d | %s | %s ms | %s |' "$count" "$rate" "$median" "$spread")")
  stop_started
done

echo
echo "$n $lang runs from $clients clients through nginx (load now $(cut -d' ' -f1-3 /proc/loadavg)):"
echo "| servers | runs/s | median latency | runs per server (warm-up included) |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
