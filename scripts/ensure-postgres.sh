#!/usr/bin/env bash
# Make sure PostgreSQL's server programs (initdb, pg_ctl) are installed, from Debian's
# packages: the history tests start throwaway clusters of their own with them
# (tests/it/pg_cluster.rs). Idempotent and quick when they are there. No cluster of the
# package's own is created and no service is started.
set -euo pipefail

if compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-postgres: PostgreSQL's server is not installed; as root: apt-get install postgresql" >&2
  exit 1
fi
echo "ensure-postgres: installing postgresql from Debian" >&2
mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/codebox-tests.conf
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
