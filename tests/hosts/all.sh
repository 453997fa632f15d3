# The whole guest suite, what `scripts/test --hosts` runs (`scripts/vm-host.sh --suite all`):
# first what the focused suite checks (so its time can be read off this one), then ten
# languages' smoke samples, three under gVisor, the pool's limit classes, crun against runc,
# and the outcomes and a session through Podman and rootless Docker.
. /payload/hosts/lib.sh
focused_start=$(date +%s)
echo "     the suite starts at uptime $(cut -d' ' -f1 /proc/uptime) s"
rootful
nothing_left rootful
other_daemons smoke podman rootless
echo "     the focused suite's checks took $(( $(date +%s) - focused_start )) s"

step "rootful under gVisor (runsc): OOM"
CODEBOX_SANDBOX_RUNTIME=runsc oom runsc
CODEBOX_SANDBOX_RUNTIME=runsc smoke runsc bash lua tcl
# Every guarantee under crun: the doctor's posture probes and every outcome with its usage.
CODEBOX_SANDBOX_RUNTIME=crun doctor crun
CODEBOX_SANDBOX_RUNTIME=crun outcomes crun
CODEBOX_SANDBOX_RUNTIME=crun session crun
# Run by run, not bench by bench: under emulation the host's load moves a whole bench's
# figures by 2-10 times, which would hide any difference between the runtimes.
step "crun against runc, run by run"
python3 -u /payload/hosts/runtimes.py 8 && ok "crun against runc measured" || bad "crun against runc measured"
step "codebox bench (its host accounting on cgroup v2)"
codebox bench bash --n 5 2>&1 | grep -v "^ *$" | sed 's/^/     /'
smoke rootful bash awk sql jq lua tcl forth rexx icon algol68
step "the pool's limit classes over /v1"
serve_start --set 'pool.sizes={ bash = 1 }'
python3 /payload/hosts/pool.py "http://127.0.0.1:$port" && ok "pool: two limit classes" || bad "pool: two limit classes"
serve_stop
nothing_left rootful
other_daemons full podman rootless
echo "     the whole suite's checks took $(( $(date +%s) - focused_start )) s"
finish
