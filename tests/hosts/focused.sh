# The focused guest suite (run inside the guest by `scripts/vm-host.sh --suite focused`): on
# the unified cgroup v2 hierarchy with rootful Docker, codebox's outcomes, usage, the doctor's
# posture probe, a session's state, interrupt and OOM recovery, and nothing left.
. /payload/hosts/lib.sh

step "host facts"
fs=$(stat -fc %T /sys/fs/cgroup)
[ "$fs" = cgroup2fs ] && ok "cgroup v2 unified hierarchy" || bad "cgroup v2 unified hierarchy: /sys/fs/cgroup is $fs"
for i in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 1; done
echo "     docker up at uptime $(cut -d' ' -f1 /proc/uptime) s: $(docker info --format 'Docker {{.ServerVersion}}, cgroup {{.CgroupVersion}} ({{.CgroupDriver}}), {{.SecurityOptions}}')"
echo "     controllers: $(cat /sys/fs/cgroup/cgroup.controllers); kernel $(uname -r)"

step "codebox doctor"
out=$(codebox doctor 2>&1); echo "$out" | grep -v 'missing: run' | sed 's/^/     /'
echo "$out" | grep -q 'cgroup v2' && ok "doctor names cgroup v2" || bad "doctor names cgroup v2"
echo "$out" | grep -qi 'apparmor' && ok "doctor names AppArmor's state" || bad "doctor names AppArmor's state"
if echo "$out" | grep FAIL | grep -v 'missing: run' | grep -q .; then
  bad "doctor: a posture or host check failed"
else
  ok "doctor: every posture check passes (images other than bash's are not in the guest)"
fi

step "outcomes and usage (rootful Docker, runc)"
outcomes rootful

step "a session over /v1"
codebox serve --transport http --listen 127.0.0.1:8765 --no-auth >/tmp/serve.log 2>&1 &
serve=$!
for i in $(seq 60); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8765/v1/languages")' 2>/dev/null && break; sleep 1; done
python3 /payload/hosts/session.py http://127.0.0.1:8765 rootful && ok "rootful session" || bad "rootful session"
kill "$serve"; wait "$serve" 2>/dev/null
step "leftovers"
nothing_left rootful
finish
