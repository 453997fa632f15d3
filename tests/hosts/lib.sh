# Shared by the guest suites (run inside the guest by scripts/vm-host.sh): checks that print
# `ok`/`FAIL` with what was seen, timings per step, and the closing `N passed, M failed`.
passed=0 failed=0
step_start=$(date +%s)
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
step() { local now; now=$(date +%s); echo "== $1 (at uptime $(cut -d' ' -f1 /proc/uptime) s, previous step $((now - step_start)) s)"; step_start=$now; }
# expect NAME JQ-FILTER JSON: the filter must answer true.
expect() {
  if printf '%s' "$3" | jq -e "$2" >/dev/null 2>&1; then ok "$1"; else bad "$1: wanted $2, report: $(printf '%s' "$3" | head -c 1500)"; fi
}
# run_json FILE-CONTENT LANGUAGE [codebox run flags...]: the report of `codebox run --json`.
run_json() {
  local code=$1 lang=$2; shift 2
  printf '%s\n' "$code" | codebox run --json -l "$lang" "$@" - 2>/tmp/run.err
}
# Nothing codebox made is left on the daemon.
nothing_left() {
  local left
  left=$({ docker ps -aq --filter label=codebox.managed=true; docker volume ls -q --filter label=codebox.managed=true; } | wc -l)
  if [ "$left" = 0 ]; then ok "$1: nothing left"; else bad "$1: $left labelled container(s)/volume(s) left: $(docker ps -a --filter label=codebox.managed=true --format '{{.Names}} {{.Status}}')"; fi
}
finish() { echo "$passed passed, $failed failed"; [ "$failed" = 0 ]; }

# The outcomes and usage every host must give, through `codebox run` (bash's image).
outcomes() { # $1: a label for the daemon
  local r
  r=$(run_json 'echo hello' bash)
  expect "$1 hello" '.status == "succeeded" and .stdout == "hello\n"' "$r"
  r=$(run_json 'echo out; exit 3' bash)
  expect "$1 exit 3" '.status == "failed" and .exit_code == 3' "$r"
  r=$(run_json 'sleep 60' bash --timeout-seconds 2)
  expect "$1 timeout" '.status == "timed_out"' "$r"
  # tail buffers /dev/zero's one endless line: under a 64 MB limit the memory cgroup kills it.
  r=$(run_json 'tail /dev/zero' bash --memory-mb 64 --timeout-seconds 120)
  expect "$1 OOM at 64 MB is out_of_memory" '.status == "out_of_memory"' "$r"
  expect "$1 OOM peak within the limit" '(.usage.peak_memory_kb // 0) > 30000 and (.usage.peak_memory_kb // 0) <= 65536' "$r"
  # CPU: a busy loop; memory: a 40 MB file in the (memory-backed) working directory.
  r=$(run_json 'i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; head -c 40000000 /dev/zero > big; ls -s big' bash --memory-mb 256 --timeout-seconds 120)
  expect "$1 usage: CPU measured" '.status == "succeeded" and (.usage.cpu_time_ms // 0) > 100' "$r"
  expect "$1 usage: peak memory measured" '(.usage.peak_memory_kb // 0) > 40000' "$r"
}
