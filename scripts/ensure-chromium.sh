#!/usr/bin/env bash
# Make sure Debian's headless Chromium and its WebDriver (chromium-driver) are installed: the
# console's browser test (tests/console/run.sh) drives them with selenium. Idempotent and
# quick when they are there. Nothing is started.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-chromium: chromium is not installed; as root: apt-get install chromium chromium-driver" >&2
  exit 1
fi
echo "ensure-chromium: installing chromium and chromium-driver from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
