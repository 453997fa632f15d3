# Shared by the guest suites (run inside the guest by scripts/vm-host.sh): checks that print
# `ok`/`FAIL` with what was seen, timings per step, and the closing `N passed, M failed`.
passed=0 failed=0
step_start=$(date +%s)
# Scratch files and the HTTP port of these checks (other_daemons gives each daemon its own).
tmp=/tmp port=8765
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
step() { local now; now=$(date +%s); echo "== $1 (at uptime $(cut -d' ' -f1 /proc/uptime) s, previous step $((now - step_start)) s)"; step_start=$now; }
# expect NAME JQ-FILTER JSON: the filter must answer true.
expect() {
  if printf '%s' "$3" | jq -e "$2" >/dev/null 2>&1; then ok "$1"; else bad "$1: wanted $2, report: $(printf '%s' "$3" | head -c 1500) $(head -c 600 $tmp/run.err 2>/dev/null)"; fi
}
# run_json FILE-CONTENT LANGUAGE [codebox run flags...]: the report of `codebox run --json`.
run_json() {
  local code=$1 lang=$2; shift 2
  printf '%s\n' "$code" | codebox run --json -l "$lang" "$@" - 2>"$tmp/run.err"
}
# Nothing codebox made is left on the daemon. Removal goes on in the daemon after codebox
# has asked for it ("Removal In Progress", seen under runsc on a loaded host), so it is given
# 20 s to finish, as the host's tests give it (tests/it/common.rs, assert_no_leftovers).
nothing_left() {
  local left i
  for i in $(seq 40); do
    left=$({ docker ps -aq --filter label=codebox.managed=true; docker volume ls -q --filter label=codebox.managed=true; } | wc -l)
    [ "$left" = 0 ] && break
    sleep 0.5
  done
  if [ "$left" = 0 ]; then ok "$1: nothing left"; else bad "$1: $left labelled container(s)/volume(s) left: $(docker ps -a --filter label=codebox.managed=true --format '{{.Names}} {{.Status}}')"; fi
}
finish() { echo "$passed passed, $failed failed"; [ "$failed" = 0 ]; }
wait_docker() { for i in $(seq 120); do docker info >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }

# The host: the unified hierarchy, when Docker answered, the controllers.
host_facts() {
  step "host facts"
  local fs; fs=$(stat -fc %T /sys/fs/cgroup)
  [ "$fs" = cgroup2fs ] && ok "cgroup v2 unified hierarchy" || bad "cgroup v2 unified hierarchy: /sys/fs/cgroup is $fs"
  wait_docker
  echo "     docker up at uptime $(cut -d' ' -f1 /proc/uptime) s: $(docker info --format 'Docker {{.ServerVersion}}, cgroup {{.CgroupVersion}} ({{.CgroupDriver}}), {{.SecurityOptions}}')"
  echo "     controllers: $(cat /sys/fs/cgroup/cgroup.controllers); kernel $(uname -r); $(nproc) CPUs"
  # Where the boot's time went (the guest's boot is part of every suite's budget).
  # (systemd-analyze waits for the boot to end, which this unit is part of: read the units.)
  systemctl show -p UserspaceTimestampMonotonic --value | awk '{printf "     boot: the kernel and initrd %.1f s\n", $1 / 1e6}'
  # One systemctl call for every unit (a call each costs a minute under emulation).
  systemctl show -p Id -p InactiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic \
      $(systemctl list-units --type=service --state=active,exited --no-legend --plain | awk '{print $1}') |
    awk 'BEGIN {RS = ""; FS = "\n"} {
      delete v; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      a = v["InactiveExitTimestampMonotonic"]; b = v["ActiveEnterTimestampMonotonic"]
      if (a > 0 && b >= a) printf "%.1f %.1f %s\n", (b - a) / 1e6, b / 1e6, v["Id"] }' |
    sort -rn | head -n 8 | awk '{printf "     boot: %s took %s s, up at %s s\n", $3, $1, $2}'
}

# doctor LABEL: every posture and host check passes (images not in the guest aside); the
# doctor names the cgroup version and AppArmor's state.
doctor() {
  step "$1: codebox doctor"
  local out; out=$(codebox doctor 2>&1)
  echo "$out" | grep -v 'missing: run' | sed 's/^/     /'
  echo "$out" | grep -q 'cgroup v2' && ok "$1 doctor names cgroup v2" || bad "$1 doctor names cgroup v2"
  echo "$out" | grep -qi 'apparmor' && ok "$1 doctor names AppArmor's state" || bad "$1 doctor names AppArmor's state"
  if echo "$out" | grep FAIL | grep -v 'missing: run' | grep -q .; then
    bad "$1 doctor: a posture or host check failed"
  else
    ok "$1 doctor: every posture and host check passes (only images the guest lacks are missing)"
  fi
}

# The outcomes and usage every host must give, through `codebox run` (bash's image).
outcomes() { # $1: a label for the daemon
  step "$1: outcomes and usage"
  local r
  r=$(run_json 'echo hello' bash)
  expect "$1 hello" '.status == "succeeded" and .stdout == "hello\n"' "$r"
  r=$(run_json 'echo out; exit 3' bash)
  expect "$1 exit 3" '.status == "failed" and .exit_code == 3' "$r"
  r=$(run_json 'sleep 60' bash --timeout-seconds 2)
  expect "$1 timeout" '.status == "timed_out"' "$r"
  r=$(run_json 'kill -SEGV $$' bash)
  expect "$1 a signal" '.status == "failed" and .signal == "SIGSEGV"' "$r"
  oom "$1"
  # CPU: a busy loop; memory: a 40 MB file in the (memory-backed) working directory.
  r=$(run_json 'i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; head -c 40000000 /dev/zero > big; ls -s big' bash --memory-mb 256 --timeout-seconds 120)
  expect "$1 usage: CPU measured" '.status == "succeeded" and (.usage.cpu_time_ms // 0) > 100' "$r"
  expect "$1 usage: peak memory measured" '(.usage.peak_memory_kb // 0) > 40000' "$r"
}
oom() { # $1: label, then codebox run flags
  local label=$1; shift
  # tail buffers /dev/zero's one endless line: under a 64 MB limit the memory cgroup kills it.
  local r; r=$(run_json 'tail /dev/zero' bash --memory-mb 64 --timeout-seconds 120 "$@")
  if [ "${CODEBOX_SANDBOX_RUNTIME:-}" = runsc ] && [ "${name:-}" = podman ]; then
    # Podman (4.3, conmon 2.1.6) records no OOM kill under gVisor: the memory cgroup kills
    # gVisor's kernel, Podman says only "exited 137". The limit holds; codebox says why it
    # cannot name the outcome, and the doctor says so before any run.
    expect "$label OOM at 64 MB is sandbox_error naming Podman's limitation" \
      '.status == "sandbox_error" and (.message // "" | test("under gVisor on Podman"))' "$r"
    return
  fi
  expect "$label OOM at 64 MB is out_of_memory" '.status == "out_of_memory"' "$r"
  if [ "${CODEBOX_SANDBOX_RUNTIME:-}" = runsc ]; then
    # gVisor's OOM kills the whole sandbox, codebox-init with it: no usage is reported (as on
    # the cgroup v1 host); the outcome is what counts.
    echo "     $label: OOM usage: $(printf '%s' "$r" | jq -c .usage)"
    return
  fi
  expect "$label OOM peak within the limit" '(.usage.peak_memory_kb // 0) > 30000 and (.usage.peak_memory_kb // 0) <= 65536' "$r"
}

# serve_start / serve_stop: `codebox serve` over HTTP on loopback, with extra --set flags.
serve_start() {
  codebox serve --transport http --listen 127.0.0.1:$port --no-auth "$@" >"$tmp/serve.log" 2>&1 &
  serve=$!
  for i in $(seq 90); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v1/languages')" 2>/dev/null && return 0; sleep 1; done
  echo "     serve did not answer: $(tail -n 5 $tmp/serve.log)"
}
serve_stop() { kill "$serve"; wait "$serve" 2>/dev/null; }

# The whole suite's ten languages: bash's image has bash, awk, sql and jq; classic has forth,
# rexx, icon and algol68.
ten_languages="bash awk sql jq lua tcl forth rexx icon algol68"

pool() { # $1: label
  step "$1: the pool's limit classes over /v1"
  serve_start --set 'pool.sizes={ bash = 1 }'
  python3 /payload/hosts/pool.py "http://127.0.0.1:$port" && ok "$1 pool: two limit classes" || bad "$1 pool: two limit classes: $(grep -i -E 'warn|error' $tmp/serve.log | tail -n 5)"
  serve_stop
}

# gvisor LABEL: under runsc, the doctor (runsc registered, the posture probe), OOM at 64 MB
# (the limit is in force), three languages' smoke samples.
gvisor() {
  local label="$1 under gVisor (runsc)"
  export CODEBOX_SANDBOX_RUNTIME=runsc
  doctor "$label"
  step "$label: OOM"
  oom "$label"
  CODEBOX_RUNS_MAX_CONCURRENT_RUNS=2 smoke "$label" bash lua tcl
  unset CODEBOX_SANDBOX_RUNTIME
}

# refused LABEL TEXT: with runsc as the daemon gives it now, codebox refuses to run (a run,
# and the doctor), saying TEXT: containers would not get gVisor, or would get no limits.
refused() {
  step "$1: runsc as the daemon gives it is refused"
  if echo 'echo hi' | CODEBOX_SANDBOX_RUNTIME=runsc codebox run -l bash - >/dev/null 2>"$tmp/refused.err"; then
    bad "$1: a run under runsc was not refused"
  elif grep -q -- "$2" "$tmp/refused.err"; then
    ok "$1: a run under runsc is refused: $(head -c 700 $tmp/refused.err)"
  else
    bad "$1: a run under runsc failed without saying \"$2\": $(head -c 700 $tmp/refused.err)"
  fi
  if CODEBOX_SANDBOX_RUNTIME=runsc codebox doctor 2>&1 | grep FAIL | grep -q -- "$2"; then
    ok "$1: the doctor fails it, saying so"
  else
    bad "$1: the doctor does not fail it with \"$2\""
  fi
}

session() { # $1: label
  step "$1: a session over /v1"
  serve_start
  python3 /payload/hosts/session.py http://127.0.0.1:$port "$1" && ok "$1 session" || bad "$1 session"
  serve_stop
}

# smoke LABEL LANG...: `codebox smoke` of those languages, all passing.
smoke() {
  local label=$1; shift
  step "$label: smoke samples of $*"
  local out; out=$(codebox smoke "$@" 2>&1)
  echo "$out" | grep -v '^ok' | tail -n 40 | sed 's/^/     /'
  local summary; summary=$(echo "$out" | tail -n 1)
  if echo "$summary" | grep -q ' 0 failed$'; then ok "$label smoke ($*): $summary"; else bad "$label smoke ($*): $summary"; fi
}

# The same checks through another daemon, reached with DOCKER_HOST and nothing else changed.
# other_daemon NAME smoke|full
other_daemon() {
  local name=$1 depth=$2
  step "$name: starting it"
  local host
  if [ "$name" = rootless ]; then
    # gVisor registered the only way it starts under rootless Docker: with --ignore-cgroups
    # (without it: "OCI runtime create failed: creating container: systemd error: Permission
    # denied"). Its containers then get no limits (a 64 MB run grew past 700 MB), so codebox
    # must refuse it (refused, below).
    mkdir -p /home/rootless/.config/docker
    echo '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--ignore-cgroups"]}}}' \
      > /home/rootless/.config/docker/daemon.json
    chown -R rootless: /home/rootless/.config
  fi
  if ! host=$(bash /payload/hosts/daemon.sh start "$name" 2>"$tmp/daemon.err"); then
    bad "$name did not start: $(tail -n 15 $tmp/daemon.err)"; return
  fi
  export DOCKER_HOST=$host
  ok "$name up at $host: $(docker version --format '{{.Server.Version}}' 2>&1), $(docker info --format 'cgroup {{.CgroupVersion}} ({{.CgroupDriver}}) {{.SecurityOptions}}' 2>&1)"
  doctor "$name"
  if [ "$depth" = full ]; then
    outcomes "$name"
    session "$name"
    # Two runs at a time (not four): under emulation a daemon behind its API socket attaches
    # slowly, and four at once pushed some past their start deadline.
    CODEBOX_RUNS_MAX_CONCURRENT_RUNS=2 smoke "$name" $ten_languages
    pool "$name"
    if [ "$name" = podman ]; then
      # Podman 4.3 runs every container under its default runtime (crun), whatever the
      # container names: gVisor only as Podman's default.
      refused podman "cannot be honoured"
      printf '[engine]\nruntime = "runsc"\n' > /etc/containers/containers.conf
      systemctl stop podman.service   # its socket starts it again, with the new default
      gvisor podman
      rm /etc/containers/containers.conf; systemctl stop podman.service
    else
      # gVisor starts under rootless Docker only with --ignore-cgroups, which drops the
      # limits: codebox refuses it.
      refused rootless "ignore-cgroups"
    fi
  else
    step "$name: smoke"
    local r
    r=$(run_json 'echo hello' bash)
    expect "$name hello" '.status == "succeeded" and .stdout == "hello\n"' "$r"
    r=$(run_json 'echo out; exit 3' bash)
    expect "$name exit 3" '.status == "failed" and .exit_code == 3' "$r"
    oom "$name"
  fi
  nothing_left "$name"
  unset DOCKER_HOST
  bash /payload/hosts/daemon.sh stop "$name"
}

# other_daemons smoke|full NAME...: other_daemon of each at once. Each is a chain of calls that
# wait on its own daemon, which under emulation keeps about one of the guest's two vCPUs busy;
# their output is printed in order once all are done, their counts added to this shell's.
other_daemons() {
  local depth=$1; shift
  step "$* at once ($depth)"
  local name n=0 pids=() counts
  for name in "$@"; do
    n=$((n + 1)); mkdir -p "/tmp/$name"
    ( tmp=/tmp/$name port=$((8765 + n)) passed=0 failed=0
      other_daemon "$name" "$depth"
      echo "COUNTS $passed $failed" ) > "/tmp/$name.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for name in "$@"; do
    grep -v '^COUNTS ' "/tmp/$name.out"
    counts=$(sed -n 's/^COUNTS //p' "/tmp/$name.out")
    if [ -z "$counts" ]; then bad "$name: its checks ended without their counts"; continue; fi
    passed=$((passed + ${counts% *})); failed=$((failed + ${counts#* }))
  done
}

# The rootful part both suites share: the host, the doctor, the outcomes, a session, one gVisor
# case (the whole suite has gVisor's OOM and smoke samples too).
rootful() {
  host_facts
  step "runtimes: runsc and crun registered with Docker"
  if bash /payload/hosts/daemon.sh runtimes 2>"$tmp/daemon.err"; then
    ok "runsc and crun registered: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
  else
    bad "registering runsc and crun: $(cat $tmp/daemon.err)"
  fi
  doctor rootful
  outcomes rootful
  session rootful
  step "rootful under gVisor (runsc)"
  local r
  r=$(CODEBOX_SANDBOX_RUNTIME=runsc run_json 'echo hello' bash)
  expect "runsc hello" '.status == "succeeded" and .stdout == "hello\n"' "$r"
  if ! printf '%s' "$r" | jq -e '.status == "succeeded"' >/dev/null 2>&1; then
    # Which part failed: runsc with cgroupfs paths instead of systemd's, and runsc by hand.
    jq '.runtimes["runsc-cgroupfs"] = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}' \
      /etc/docker/daemon.json > /tmp/daemon.json && cp /tmp/daemon.json /etc/docker/daemon.json
    kill -HUP "$(cat /run/docker.pid)"; sleep 3
    r=$(CODEBOX_SANDBOX_RUNTIME=runsc-cgroupfs run_json 'echo hello' bash)
    echo "     runsc without --systemd-cgroup: $(printf '%s' "$r" | head -c 600) $(head -c 600 $tmp/run.err)"
    echo "     docker run under runsc: $(docker run --rm --runtime runsc --network none codebox/bash:5.2 echo hi 2>&1 | tail -n 3)"
  fi
}
