# The set-up the shell suites share (tests/api, tests/console, tests/e2e), sourced by them:
# a pinned virtual environment under target/, codebox servers on free loopback ports, and
# a cleanup that ends only the processes the suite started, by PID, and removes its files.
# Needs `root` (the repository) and `binary` set by the caller.

# venv_with DIR REQUIREMENT...: the virtual environment at DIR, made if missing, with the
# requirements installed (pip does nothing for what is already there).
venv_with() {
  local dir=$1
  shift
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir"
  fi
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
}

# build_unless_given ARGC: build codebox when the caller was given no binary.
build_unless_given() {
  if [ "$1" -eq 0 ]; then
    (cd "$root" && cargo build --quiet)
  fi
}

# A scratch folder and the PIDs to end at exit.
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# serve NAME FLAG [VAR=VALUE...]: start `codebox serve --transport http FLAG` on a free
# loopback port, its data in $work/NAME, with those variables; sets `url` to its base.
serve() {
  local name=$1 flag=$2
  shift 2
  mkdir -p "$work/$name"
  env CODEBOX_DATA_DIR="$work/$name" "$@" "$binary" serve --transport http \
    --listen 127.0.0.1:0 ${flag:+"$flag"} >"$work/$name.stdout" 2>"$work/$name.log" </dev/null &
  pids+=($!)
  url=""
  for _ in $(seq 1 300); do
    url=$(sed -n 's#^codebox: serving MCP at \(http://[0-9.:]*\)/mcp.*#\1#p' "$work/$name.log" | head -1)
    if [ -n "$url" ]; then
      return
    fi
    sleep 0.1
  done
  echo "the $name server did not start:" >&2
  cat "$work/$name.log" >&2
  return 1
}

# A fresh bearer token.
new_token() {
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'
}
