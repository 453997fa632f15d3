#!/usr/bin/env bash
# The APIs for programs against clients nobody here wrote, through the real binary on
# loopback: npm's piston-client against /api/v2 (a --no-auth server: the client cannot send
# a token), PyPI's websockets against Piston's /api/v2/connect, the official Judge0 Python
# SDK against the Judge0 routes and plain curl against
# /v1 (a server with a token), and the OpenAPI document checked by openapi-spec-validator.
# Installs the pinned clients into target/ (PyPI and npm), builds codebox if needed. Needs
# Docker with the python, gcc and java images built. Ends with `N passed, M failed`.
#
# Usage: tests/api/run.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/api"
binary="${1:-$root/target/debug/codebox}"
venv="${CODEBOX_API_VENV:-$root/target/api-venv}"
node_dir="$root/target/api-node"

# Pinned: the versions these checks were written against.
JUDGE0_SDK=judge0==0.0.8
SPEC_VALIDATOR=openapi-spec-validator==0.9.0
WEBSOCKETS=websockets==15.0.1
PISTON_CLIENT=piston-client@1.0.2

. "$root/tests/harness.sh"
venv_with "$venv" "$JUDGE0_SDK" "$SPEC_VALIDATOR" "$WEBSOCKETS"
mkdir -p "$node_dir"
if [ ! -f "$node_dir/node_modules/piston-client/package.json" ] ||
   ! grep -q '"version": "1.0.2"' "$node_dir/node_modules/piston-client/package.json"; then
  npm install --prefix "$node_dir" --no-audit --no-fund --silent "$PISTON_CLIENT"
fi
build_unless_given $#

token=$(new_token)
serve token "" CODEBOX_TOKEN="$token"
with_token=$url
# piston-client sends no authorization header: a --no-auth server, on loopback only.
serve open --no-auth
open=$url

total_passed=0
total_failed=0
tally() {
  local log=$1
  local line
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  total_passed=$((total_passed + $(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")))
  total_failed=$((total_failed + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
}
run() {
  local name=$1
  shift
  echo "== $name"
  if ! "$@" 2>&1 | tee "$work/$name.out"; then
    grep -qE '[0-9]+ passed, [0-9]+ failed' "$work/$name.out" || echo "$name: 0 passed, 1 failed" >>"$work/$name.out"
  fi
  tally "$work/$name.out"
}

run curl bash "$here/v1_curl.sh" "$with_token" "$token"
run openapi "$venv/bin/python" "$here/openapi_check.py" "$with_token" "$token"
run judge0 "$venv/bin/python" "$here/judge0_client.py" "$with_token" "$token"
run piston-ws "$venv/bin/python" "$here/piston_ws.py" "$with_token" "$token"
# An ES module resolves packages from its own folder: run a copy beside node_modules.
cp "$here/piston_client.mjs" "$node_dir/"
run piston node "$node_dir/piston_client.mjs" "$open"
echo "api clients: $total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
