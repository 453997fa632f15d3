#!/usr/bin/env bash
# Everything a fresh machine needs before codebox can run: a Docker daemon and the base image.
# Idempotent and quick when both are already there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/ensure-docker.sh"
bash "$here/images/bootstrap-base.sh"
