#!/usr/bin/env bash
# End-to-end test with the official MCP Python SDK: makes its own virtual environment,
# installs `mcp` from PyPI into it, builds codebox if needed, and runs mcp_e2e.py over stdio
# and HTTP. Needs Docker with the python and gcc images built. Exits non-zero on any failure.
#
# Usage: tests/e2e/run.sh [BINARY] [--transport stdio|http|both]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${CODEBOX_E2E_VENV:-$root/target/e2e-venv}"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    export CODEBOX_BIN="$1"
    shift
fi
binary="${CODEBOX_BIN:-$root/target/debug/codebox}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check mcp
if [ -z "${CODEBOX_BIN:-}" ]; then
    (cd "$root" && cargo build --quiet)
fi
exec "$venv/bin/python" "$root/tests/e2e/mcp_e2e.py" --binary "$binary" "$@"
