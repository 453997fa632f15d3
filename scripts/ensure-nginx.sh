#!/usr/bin/env bash
# Make sure Debian's nginx is installed: the cluster tests (tests/it/cluster_nginx.rs) put one
# in front of several codebox servers, with a config and a loopback port of their own, as an
# unprivileged-port process that the test starts and stops. Idempotent and quick when it is
# there. The package's own service is not started (it would take port 80).
set -euo pipefail

if [ -x /usr/sbin/nginx ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-nginx: nginx is not installed; as root: apt-get install nginx-light" >&2
  exit 1
fi
echo "ensure-nginx: installing nginx from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
# No service start during the install (policy-rc.d exit 101: "action forbidden").
made_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  made_policy=1
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
if [ -n "$made_policy" ]; then
  rm -f /usr/sbin/policy-rc.d
fi
test -x /usr/sbin/nginx
