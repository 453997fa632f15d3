#!/usr/bin/env bash
# The console in a real browser: Debian's headless Chromium and chromium-driver (installed by
# scripts/ensure-chromium.sh), driven by PyPI's selenium (pinned, into target/console-venv),
# against the real binary on loopback with a token. A second loopback port serves an empty
# page of another origin. Screenshots go to target/console-shots/; the ones in docs/ were taken
# by this test with CODEBOX_CONSOLE_SHOTS=docs (run it so to refresh them). Needs
# Docker with the python and gcc images built. Ends with `console: N passed, M failed`.
#
# Usage: tests/console/run.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/console"
binary="${1:-$root/target/debug/codebox}"
venv="${CODEBOX_CONSOLE_VENV:-$root/target/console-venv}"
shots="${CODEBOX_CONSOLE_SHOTS:-$root/target/console-shots}"
case "$shots" in /*) ;; *) shots="$root/$shots" ;; esac
mkdir -p "$shots"

SELENIUM=selenium==4.50.0

bash "$root/scripts/ensure-chromium.sh"
. "$root/tests/harness.sh"
venv_with "$venv" "$SELENIUM"
build_unless_given $#

token=$(new_token)
serve data "" CODEBOX_TOKEN="$token"
mkdir -p "$work/other"
echo '<!doctype html><title>another origin</title>' >"$work/other/index.html"
"$venv/bin/python" -u -m http.server 0 --bind 127.0.0.1 --directory "$work/other" >"$work/other.log" 2>&1 &
pids+=($!)
other=""
for _ in $(seq 1 100); do
  port=$(sed -n 's#^Serving HTTP on 127.0.0.1 port \([0-9]*\).*#\1#p' "$work/other.log" | head -1)
  [ -n "$port" ] && other="http://127.0.0.1:$port" && break
  sleep 0.1
done
[ -n "$other" ] || { echo "the other origin's server did not start" >&2; cat "$work/other.log" >&2; exit 1; }

"$venv/bin/python" "$here/console_test.py" "$url" "$token" "$other" "$shots"
