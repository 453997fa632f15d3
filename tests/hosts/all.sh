# The whole guest suite, what `scripts/test --hosts` runs (`scripts/vm-host.sh --suite all`):
# first what the focused suite checks (so its time can be read off this one), then ten
# languages' smoke samples, three under gVisor, the pool's limit classes, crun against runc,
# and the same outcomes, session, samples, pool and gVisor case through Podman and rootless
# Docker.
. /payload/hosts/lib.sh
focused_start=$(date +%s)
echo "     the suite starts at uptime $(cut -d' ' -f1 /proc/uptime) s"
rootful
nothing_left rootful
other_daemons smoke podman rootless
echo "     the focused suite's checks took $(( $(date +%s) - focused_start )) s"

gvisor rootful
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
smoke rootful $ten_languages
pool rootful
nothing_left rootful
# One daemon at a time: each runs ten languages' samples, which under emulation takes both
# of the guest's vCPUs.
other_daemons full podman
other_daemons full rootless
echo "     the whole suite's checks took $(( $(date +%s) - focused_start )) s"
finish
