# Every guest suite in one boot (`scripts/vm-host.sh --suite all`, what `scripts/test --hosts`
# runs): rootful Docker (focused), then Podman and rootless Docker (daemons).
rc=0
bash /payload/hosts/focused.sh || rc=1
bash /payload/hosts/daemons.sh || rc=1
exit "$rc"
