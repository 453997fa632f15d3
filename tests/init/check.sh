#!/usr/bin/env bash
# Tests of codebox-init (images/base/codebox-init*.c, docs/sandbox-init.md) inside real
# containers, locked down as codebox runs them, with the helper as PID 1 (no --init).
#
# Needs Docker and the image codebox/base:bookworm
# (docker build -t codebox/base:bookworm images/base). Builds a throwaway image on it with
# python3, strace and codebox-init compiled from this checkout (the base image may hold another
# build), runs every case below, prints one line per case, removes the image, and exits 1 if
# any case failed. Each case is a payload (Python assignments) and checks (Python asserts on
# `res`), separated by `---`; tests/init/frames.py builds the payloads and decodes the frames.
# Session cases (session mode) are Python scripts that drive a live container through a
# session client (frames.py), with a tiny test driver (tests/init/driver.py) in the image.
# Arguments, if any, name the cases to run (the others are skipped).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# A tag of its own: another worktree's run of this script may build and remove its own at the
# same time.
image=codebox-init-test-$$
work=$(mktemp -d)
failed=0
containers=()
only=("$@")

egress_server_pid=
cleanup() {
  for c in "${containers[@]}"; do docker rm -f "$c" >/dev/null 2>&1; done
  [[ -n $egress_server_pid ]] && kill "$egress_server_pid" 2>/dev/null
  docker rmi -f "$image" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# The first stage is images/base/Dockerfile's own (the build cache shares it). The second
# helper, codebox-init-small, has a 128-byte X frame buffer, to check that a text that does not
# fit is left out, never written past the buffer. The context: the helper's sources and the
# test driver of the session cases (tests/init/driver.py).
mkdir -p "$work/context"
cp "$here"/../../images/base/codebox-init.h "$here"/../../images/base/codebox-init*.c \
  "$here/driver.py" "$work/context/"
docker build -q -t "$image" -f - "$work/context" >"$work/build.log" 2>&1 <<'EOF' || { cat "$work/build.log"; exit 1; }
FROM debian:bookworm-slim AS init
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev
COPY codebox-init.h codebox-init*.c /src/
RUN flags="-std=c11 -static -O2 -Wall -Wextra -Werror -s" \
 && gcc $flags -o /codebox-init /src/codebox-init*.c && /codebox-init --selftest \
 && gcc $flags -DX_BYTES=128 -o /codebox-init-small /src/codebox-init*.c

FROM codebox/base:bookworm
RUN codebox-install python3 strace
COPY --from=init /codebox-init /codebox-init-small /usr/local/bin/
COPY driver.py /usr/local/lib/codebox-test/driver.py
ENV PYTHONDONTWRITEBYTECODE=1
EOF

locked=(--read-only --network none --user 10001:10001 --cap-drop ALL
  --security-opt no-new-privileges
  --tmpfs /workspace:rw,exec,nosuid,nodev,size=16m,mode=1777
  --tmpfs /tmp:rw,noexec,nosuid,nodev,size=16m
  -m 256m --memory-swap 256m --pids-limit 64)

# run_case NAME [docker run options] < case
# KILL_AFTER=seconds: `docker kill --signal TERM` the container then.
# TERM_INSIDE=1: first send SIGTERM to PID 1 from inside the container (docker exec), which
#   must not stop it.
# HOLD_STDIN=1: keep the container's stdin open after the payload (as a pre-started container's).
# HELPER="command...": what the container runs (default: codebox-init).
run_case() {
  local name=$1 dir=$work/$1 container=codebox-init-test-$$-$1 rc pid holder=
  shift
  if [[ ${#only[@]} -gt 0 && " ${only[*]} " != *" $name "* ]]; then
    cat >/dev/null
    return
  fi
  mkdir -p "$dir"
  cat >"$dir/case"
  if ! python3 "$here/frames.py" payload "$dir/case" >"$dir/payload"; then
    echo "FAIL $name: bad case"; failed=1; return
  fi
  containers+=("$container")
  local start=$EPOCHREALTIME
  if [[ -n ${HOLD_STDIN:-} ]]; then
    mkfifo "$dir/in"
    (cat "$dir/payload"; exec sleep 60) >"$dir/in" &
    holder=$!
  else
    ln -s payload "$dir/in"
  fi
  # shellcheck disable=SC2086 # HELPER is a command line
  docker run -i --rm --name "$container" "${locked[@]}" "$@" "$image" \
    ${HELPER:-/usr/local/bin/codebox-init} <"$dir/in" >"$dir/out" 2>"$dir/err" &
  pid=$!
  if [[ -n ${TERM_INSIDE:-} ]]; then
    for _ in $(seq 50); do
      docker exec "$container" sh -c 'kill -TERM 1' 2>/dev/null && break
      sleep 0.2
    done
  fi
  if [[ -n ${KILL_AFTER:-} ]]; then
    sleep "$KILL_AFTER"
    docker kill --signal TERM "$container" >/dev/null
  fi
  wait "$pid"
  rc=$?
  [[ -n $holder ]] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
  local elapsed
  elapsed=$(python3 -c "print(f'{$EPOCHREALTIME - $start:.2f}')")
  if python3 "$here/frames.py" verify "$dir/case" "$dir/out" "$rc" "$elapsed" "$dir/err" >"$dir/report"; then
    printf 'ok   %-32s %6ss\n' "$name" "$elapsed"
  else
    printf 'FAIL %-32s %6ss\n' "$name" "$elapsed"
    cat "$dir/report"
    [[ -s $dir/err ]] && head -c 4000 "$dir/err" | sed 's/^/      docker: /'
    failed=1
  fi
}

# session_case NAME [docker run options] < case
# A session case is a Python script driving a live container through `s` (tests/init/frames.py).
session_case() {
  local name=$1 dir=$work/$1 container=codebox-init-test-$$-$1
  shift
  if [[ ${#only[@]} -gt 0 && " ${only[*]} " != *" $name "* ]]; then
    cat >/dev/null
    return
  fi
  mkdir -p "$dir"
  cat >"$dir/case"
  containers+=("$container")
  local start=$EPOCHREALTIME elapsed
  # shellcheck disable=SC2086 # HELPER is a command line
  python3 "$here/frames.py" session "$dir/case" "$container" \
    docker run -i --rm --name "$container" "${locked[@]}" "$@" "$image" \
    ${HELPER:-/usr/local/bin/codebox-init} >"$dir/report" 2>&1
  local rc=$?
  elapsed=$(python3 -c "print(f'{$EPOCHREALTIME - $start:.2f}')")
  if [[ $rc == 0 ]]; then
    printf 'ok   %-32s %6ss\n' "$name" "$elapsed"
  else
    printf 'FAIL %-32s %6ss\n' "$name" "$elapsed"
    cat "$dir/report"
    failed=1
  fi
}

run_case hello <<'EOF'
run = ["python3", "-c", "print('hello')"]
timeout_ms = 10000
---
assert res.check is None
assert res.run.stdout == b"hello\n" and res.run.stderr == b""
assert res.run.end == "exited" and res.run.code == 0
assert 0 <= res.run.cpu_ms < 500, res.run.cpu_ms
assert res.run.peak_source == "cgroup" and res.run.peak_kb > 1000
assert res.run.oom_kills == 0 and res.run.stdout_bytes == 6 and res.run.stderr_bytes == 0
assert res.run.wall_ms < 5000 and res.entries == [] and res.warnings == []
EOF

# The payload is read ahead only as far as its records announce (a header and its value in
# about one read), never past the end record: the program still gets every byte after it.
HELPER="strace -qq -e trace=read -e signal=none -o /dev/stderr /usr/local/bin/codebox-init" \
run_case payload-in-few-reads <<'EOF'
env = ["A=1", "B=22", "C=333"]
files = [("0644", "/".join(["d" * 250] * 12) + "/deep.txt", "x" * 100000), ("0644", "a.txt", "a"),
         ("0755", "b/c.sh", "#!/bin/sh\n")]
run = ["python3", "-c", "import sys; print(open('a.txt').read(), sys.stdin.read())"]
stdin = b"after the end record"
---
assert res.run.stdout == b"a after the end record\n", res.run
reads = [l for l in res.docker_stderr.splitlines() if l.startswith("read(0,")]
# 8 records, one of them 100 kB: about one read each, more when the pipe hands over a
# chunk in pieces; one byte per read, as before, would be over 3,000 reads of 1 byte.
assert 8 <= len(reads) <= 24, reads
assert not [r for r in reads if r.split(",")[-1].split(")")[0].strip() == "1"], reads
EOF

run_case stdin-after-payload <<'EOF'
run = ["python3", "-c", "import sys; print(sys.stdin.read().upper(), end='')"]
stdin = b"abc\nxyz"
---
assert res.run.stdout == b"ABC\nXYZ" and res.run.code == 0
EOF

run_case exit-code <<'EOF'
run = ["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"]
---
assert res.run.end == "exited" and res.run.code == 3 and res.run.signal is None
assert res.run.stdout == b"out\n" and res.run.stderr == b"err\n"
EOF

run_case sigsegv <<'EOF'
run = ["python3", "-c", "import os,signal; os.kill(os.getpid(), signal.SIGSEGV)"]
---
assert res.run.end == "signaled" and res.run.signal == 11 and res.run.code is None
EOF

run_case check-fails-skips-run <<'EOF'
check = ["python3", "-c", "import sys; print('syntax error'); sys.exit(1)"]
run = ["python3", "-c", "print('should not run')"]
---
assert res.check.end == "exited" and res.check.code == 1
assert res.check.stdout == b"syntax error\n"
assert res.run is None
EOF

run_case check-then-run <<'EOF'
check = ["python3", "-c", "import sys; print(repr(sys.stdin.read()))"]
run = ["python3", "-c", "import sys; print(repr(sys.stdin.read()))"]
stdin = "for the program"
---
assert res.check.stdout == b"''\n" and res.check.code == 0
assert res.run.stdout == b"'for the program'\n" and res.run.code == 0
EOF

# check_in_run: one process is the check and then the program. It says `compiled` on fd 3 and
# waits for `run` on fd 4; what it wrote before is the check's, what it writes after the run's.
checked() {  # checked PYTHON-BEFORE PYTHON-AFTER: a run command that checks itself
  cat <<EOF
run = ["python3", "-c", """
import os, sys, time
$1
os.write(3, b"compiled\\\\n")
assert os.read(4, 16) == b"run\\\\n"
os.close(3); os.close(4)
$2
"""]
check_in_run = 1
EOF
}

run_case check-in-run < <(checked \
  'sys.stderr.write("said by the check\\n"); sys.stderr.flush(); print("out of the check", flush=True)' \
  'print("program got", sys.stdin.read()); sys.stderr.write("said by the program\\n"); sys.exit(4)'
cat <<'EOF'
stdin = "its input"
check_timeout_ms = 10000
timeout_ms = 10000
---
assert res.check.end == "exited" and res.check.code == 0, res.check
assert res.check.stdout == b"out of the check\n" and res.check.stderr == b"said by the check\n"
assert res.check.stdout_bytes == 17 and res.check.stderr_bytes == 18
assert res.run.stdout == b"program got its input\n", res.run
assert res.run.stderr == b"said by the program\n" and res.run.code == 4
assert res.run.stdout_bytes == 22 and res.run.stderr_bytes == 20
assert res.check.cpu_ms > 0
EOF
)

# A check that fails is the command's exit before it said `compiled`: the check phase's end,
# and no run phase.
run_case check-in-run-fails <<'EOF'
run = ["python3", "-c", "import sys; sys.stderr.write('SyntaxError: bad\\n'); sys.exit(1)"]
check_in_run = 1
---
assert res.check.end == "exited" and res.check.code == 1, res.check
assert res.check.stderr == b"SyntaxError: bad\n"
assert res.run is None
EOF

# Exiting 0 without a word, or saying anything but `compiled`, is a broken command: an error,
# not a check that passed, and nothing runs.
run_case check-in-run-silent-exit <<'EOF'
run = ["python3", "-c", "print('never said compiled')"]
check_in_run = 1
---
assert res.check.end == "error" and "without saying `compiled`" in res.check.error, res.check
assert res.run is None
EOF

run_case check-in-run-garbled < <(checked 'os.write(3, b"compiler\\n")' 'print("ran")'
cat <<'EOF'
---
assert res.check.end == "error" and "other than `compiled`" in res.check.error, res.check
assert res.run is None
EOF
)

# The check's limit holds until `compiled`; the program's own limit starts then.
run_case check-in-run-check-timeout <<'EOF'
run = ["python3", "-c", "import time; time.sleep(30)"]
check_in_run = 1
check_timeout_ms = 700
timeout_ms = 30000
---
assert res.check.end == "timed_out" and 700 <= res.check.wall_ms < 1500, res.check
assert res.run is None
EOF

run_case check-in-run-run-timeout < <(checked 'time.sleep(0.8)' 'time.sleep(30)'
cat <<'EOF'
check_timeout_ms = 30000
timeout_ms = 500
---
assert res.check.end == "exited" and res.check.code == 0 and res.check.wall_ms >= 800
assert res.run.end == "timed_out" and 500 <= res.run.wall_ms < 1200, res.run
EOF
)

# With a check record too, the payload is refused.
run_case check-in-run-and-check <<'EOF'
check = ["true"]
run = ["true"]
check_in_run = 1
---
assert res.fatal is not None and "check_in_run" in res.fatal, res.fatal
EOF

run_case timeout <<'EOF'
run = ["python3", "-c", "print('before the loop', flush=True)\nwhile True: pass"]
timeout_ms = 1000
---
assert res.run.end == "timed_out" and res.run.code is None
assert res.run.stdout == b"before the loop\n"
assert 1000 <= res.run.wall_ms < 1300, res.run.wall_ms
# The busy loop's CPU time is measured (how much it got depends on the machine's load).
assert 0 < res.run.cpu_ms <= res.run.wall_ms + 100, res.run
EOF

run_case cpu-one-second <<'EOF'
run = ["python3", "-c", "import time\nwhile time.process_time() < 1.0: pass"]
---
assert res.run.end == "exited" and res.run.code == 0
assert 900 <= res.run.cpu_ms <= 1200, res.run.cpu_ms
EOF

run_case cpu-of-children <<'EOF'
run = ["sh", "-c", "for i in 1 2; do python3 -c 'import time\nwhile time.process_time() < 0.5: pass' & done; wait"]
---
assert res.run.code == 0
assert 900 <= res.run.cpu_ms <= 1300, res.run.cpu_ms
EOF

run_case peak-200mb -m 512m --memory-swap 512m <<'EOF'
run = ["python3", "-c", """
b = bytearray(200 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
print('touched')
"""]
---
assert res.run.stdout == b"touched\n" and res.run.code == 0
assert res.run.peak_source == "cgroup" and res.run.peak_kb >= 204800, res.run.peak_kb
assert res.run.oom_kills == 0
EOF

run_case oom-kill -m 128m --memory-swap 128m <<'EOF'
run = ["python3", "-c", "b = bytearray(1 << 30)\nprint('survived')"]
---
assert res.run.end == "signaled" and res.run.signal == 9, res.run
assert res.run.oom_kills >= 1 and res.run.stdout == b""
EOF

orphan_case() {
  cat <<'EOF'
# The check leaves a grandchild in a session of its own that ignores SIGTERM and holds the
# check's stdout open; it must be gone before the program runs, and the check must end at once.
check = ["python3", "-c", """
import os, signal, time
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        open('bg.tmp', 'w').write(str(os.getpid()))
        os.rename('bg.tmp', 'bg.pid')
        time.sleep(60)
    os._exit(0)
os.wait()
while not os.path.exists('bg.pid'):
    time.sleep(0.01)
print('spawned', flush=True)
"""]
run = ["python3", "-c", """
import os
pid = int(open('bg.pid').read())
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())))
"""]
---
assert res.check.stdout == b"spawned\n" and res.check.code == 0
assert res.check.wall_ms < 3000, res.check.wall_ms
assert res.run.stdout == b"[]\n", res.run.stdout
assert res.elapsed < 10, res.elapsed
EOF
}
# The memory cgroup hidden: the largest process's resident set instead, OOM kills unknown.
run_case no-cgroup --tmpfs /sys/fs/cgroup:ro <<'EOF'
run = ["python3", "-c", "b = bytearray(50 * 1024 * 1024)"]
---
assert res.run.code == 0 and res.run.peak_source == "rusage" and res.run.oom_kills == -1
assert 51200 <= res.run.peak_kb < 80000, res.run.peak_kb
assert len(res.warnings) == 2, res.warnings
EOF

run_case orphan-killed-after-check < <(orphan_case)
# Not PID 1 (tini is): process groups, the subreaper and the helper's own children instead.
run_case orphan-killed-not-pid1 --init < <(orphan_case)

orphan_run_case() {
  cat <<'EOF'
run = ["sh", "-c", "(trap '' TERM; exec setsid sleep 60) & echo started"]
timeout_ms = 30000
---
assert res.run.stdout == b"started\n" and res.run.end == "exited" and res.run.code == 0
assert res.run.wall_ms < 3000 and res.elapsed < 10, res.elapsed
EOF
}
run_case orphan-does-not-hold-the-run < <(orphan_run_case)
run_case orphan-does-not-hold-not-pid1 --init < <(orphan_run_case)

fork_bomb_case() {
  cat <<'EOF'
# Every process forks as fast as it can, up to --pids-limit; the main one never exits.
run = ["python3", "-c", """
import os, time
print('bombing', flush=True)
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
"""]
timeout_ms = 2000
---
assert res.run.stdout == b"bombing\n"
# CPU is counted (the forked processes included); how much depends on the machine's load.
assert res.run.end == "timed_out" and res.run.cpu_ms > 100, res.run
assert res.elapsed < 15, res.elapsed
EOF
}
run_case fork-bomb < <(fork_bomb_case)
run_case fork-bomb-not-pid1 --init < <(fork_bomb_case)

run_case output-cap <<'EOF'
run = ["python3", "-c", "import sys; sys.stdout.write('x' * 1000000); sys.stderr.write('e' * 5000)"]
output_limit = 1000
---
assert res.run.stdout == b"x" * 1000 and res.run.stderr == b"e" * 1000
assert res.run.stdout_bytes == 1000000 and res.run.stderr_bytes == 5000
assert res.run.code == 0
EOF

run_case large-output-relayed <<'EOF'
run = ["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 8192)"]
output_limit = 4 << 20
---
assert res.run.stdout == bytes(range(256)) * 8192 and res.run.stdout_bytes == 2097152
EOF

run_case outputs <<'EOF'
collect = "outputs"
run = ["python3", "-c", """
import os
os.makedirs('outputs/sub/deeper')
os.makedirs('outputs/empty')
open('outputs/a.txt', 'w').write('hello')
open('outputs/sub/b.bin', 'wb').write(bytes(range(256)) * 400)
os.chmod('outputs/sub/b.bin', 0o640)
open('outputs/sub/deeper/empty', 'wb').close()
os.symlink('/etc/passwd', 'outputs/passwd')
os.mkfifo('outputs/fifo')
open('outputs/secret', 'w').write('s')
os.chmod('outputs/secret', 0)
open('not-an-output', 'w').write('x')
"""]
---
assert [e.path for e in res.entries] == ["outputs/a.txt", "outputs/fifo", "outputs/passwd",
    "outputs/secret", "outputs/sub/b.bin", "outputs/sub/deeper/empty"], res.entries
a, fifo, link, secret, b, empty = res.entries
assert secret.reason == "not readable: Permission denied" and secret.mode == 0 and secret.size == 1
assert a.kind == "f" and a.content == b"hello" and a.mode == 0o644 and a.reason == ""
assert a.sha256 == hashlib.sha256(b"hello").hexdigest()
assert b.content == bytes(range(256)) * 400 and b.size == 102400 and b.mode == 0o640
assert empty.content == b"" and empty.size == 0
assert link.kind == "l" and link.target == "/etc/passwd" and link.content is None
assert link.reason == "a symbolic link, not followed"
assert fifo.kind == "f" and fifo.reason == "not a regular file" and fifo.content is None
EOF

run_case outputs-caps <<'EOF'
collect = "outputs"
max_files = 3
max_file_bytes = 100
max_bytes = 150
run = ["python3", "-c", """
import os
os.mkdir('outputs')
for name, size in [('a', 50), ('b', 200), ('c', 60), ('d', 50), ('e', 10), ('f', 1)]:
    open('outputs/' + name, 'wb').write(name.encode() * size)
"""]
---
r = {e.path[8:]: e for e in res.entries}
assert sorted(r) == list("abcdef")
assert r["a"].content == b"a" * 50 and r["c"].content == b"c" * 60 and r["e"].content == b"e" * 10
assert r["b"].reason == "over the 100-byte per-file cap" and r["b"].content is None
assert r["b"].sha256 == hashlib.sha256(b"b" * 200).hexdigest() and r["b"].size == 200
assert r["d"].reason == "over the 150-byte total cap"
assert r["f"].reason == "over the 3-file cap"
EOF

run_case outputs-entry-cap <<'EOF'
collect = "outputs"
run = ["python3", "-c", """
import os
os.mkdir('outputs')
for i in range(1005):
    open('outputs/%04d' % i, 'w').close()
"""]
---
assert len(res.entries) == 1001 and res.entries[999].path == "outputs/0999"
assert sum(e.content is not None for e in res.entries) == 32
assert res.entries[32].reason == "over the 32-file cap"
rest = res.entries[-1]
assert (rest.kind, rest.path, rest.size, rest.sha256, rest.content) == ("d", "outputs", 0, "", None)
assert rest.reason == "the listing stopped in this folder at the 1000-entry cap: 5 more entries are not listed", rest.reason
assert res.warnings == [], res.warnings
EOF

# Folders count towards the cap too; the remainder is counted across folders, subfolders
# included, and named by the folder where the listing stopped.
run_case outputs-entry-cap-in-a-folder <<'EOF'
collect = "outputs"
run = ["python3", "-c", """
import os
for d, n in [('a', 5), ('b', 1000), ('c', 3)]:
    os.makedirs('outputs/' + d)
    for i in range(n):
        open('outputs/%s/%04d' % (d, i), 'w').close()
open('outputs/z', 'w').close()
"""]
---
assert len(res.entries) == 999 and res.entries[-2].path == "outputs/b/0992", res.entries[-3:]
rest = res.entries[-1]
assert rest.kind == "d" and rest.path == "outputs/b", rest
assert rest.reason == "the listing stopped in this folder at the 1000-entry cap: 12 more entries are not listed", rest.reason
EOF

# The cap applies while a folder is scanned: only the names it can still list are held, so
# 60,000 names of 250 bytes (16 MB with their pointers) need not fit a 12 MB data limit.
HELPER="prlimit --data=12000000 /usr/local/bin/codebox-init" \
run_case outputs-cap-while-scanning <<'EOF'
collect = "outputs"
run = ["sh", "-c", "mkdir outputs && cd outputs && seq -f '%0250g' 60000 | xargs touch"]
---
assert res.rc == 0 and res.fatal is None, res.fatal
assert len(res.entries) == 1001 and res.entries[999].path == "outputs/" + "%0250d" % 1000
rest = res.entries[-1]
assert rest.path == "outputs" and "cap: 59000 more entries are not listed" in rest.reason, rest
EOF

run_case outputs-too-deep <<'EOF'
collect = "outputs"
run = ["python3", "-c", """
import os
deep = 'outputs/' + '/'.join('d%02d' % i for i in range(1, 21))
os.makedirs(deep)
open(deep + '/lost.txt', 'w').write('x')
open('outputs/d01/d02/shallow.txt', 'w').write('y')
"""]
---
deep, shallow = res.entries
assert deep.kind == "d" and deep.path == "outputs/" + "/".join("d%02d" % i for i in range(1, 17)), deep
assert (deep.size, deep.sha256, deep.content) == (0, "", None)
assert deep.reason == "the folder's contents are not listed: deeper than 16 levels", deep.reason
assert shallow.path == "outputs/d01/d02/shallow.txt" and shallow.content == b"y"
EOF

run_case outputs-unreadable-folder <<'EOF'
collect = "outputs"
run = ["python3", "-c", """
import os
os.makedirs('outputs/locked')
open('outputs/locked/x', 'w').close()
os.chmod('outputs/locked', 0)
open('outputs/seen', 'w').close()
"""]
---
locked, seen = res.entries
assert locked.kind == "d" and locked.path == "outputs/locked" and locked.mode == 0, locked
assert locked.reason == "the folder's contents are not listed: Permission denied", locked.reason
assert seen.path == "outputs/seen" and seen.content == b""
EOF

run_case outputs-symlinked-away <<'EOF'
collect = "outputs"
run = ["python3", "-c", "import os; os.symlink('/etc', 'outputs')"]
---
assert len(res.entries) == 1 and res.entries[0].kind == "l" and res.entries[0].path == "outputs"
assert res.entries[0].target == "/etc"
EOF

run_case outputs-after-timeout <<'EOF'
collect = "outputs"
timeout_ms = 1000
run = ["python3", "-c", "import os, time; os.mkdir('outputs'); open('outputs/x', 'w').write('y'); time.sleep(30)"]
---
assert res.run.end == "timed_out" and res.files["outputs/x"].content == b"y"
EOF

run_case workspace-on-success <<'EOF'
collect = "workspace-on-success"
files = [("0644", "main.py", "import os\nos.mkdir('build')\n"
          "open('build/prog', 'w').write('#!/bin/sh\\necho built\\n')\n"
          "os.chmod('build/prog', 0o755)\nos.symlink('build/prog', 'prog')\n")]
run = ["python3", "main.py"]
---
assert [(e.kind, e.path) for e in res.entries] == [("d", "build"), ("f", "build/prog"),
    ("f", "main.py"), ("l", "prog")], res.entries
build, prog, main, link = res.entries
assert build.mode == 0o755
assert prog.mode == 0o755 and prog.content == b"#!/bin/sh\necho built\n"
assert main.mode == 0o644 and main.content.startswith(b"import os")
assert link.target == "build/prog"
EOF

run_case workspace-not-on-failure <<'EOF'
collect = "workspace-on-success"
run = ["python3", "-c", "open('artifact', 'w').write('x'); raise SystemExit(1)"]
---
assert res.run.code == 1 and res.entries == []
EOF

run_case workspace-over-cap <<'EOF'
collect = "workspace-on-success"
max_bytes = 1000000
run = ["python3", "-c", "open('big', 'wb').write(b'x' * 2000000)"]
---
assert res.rc == 125 and res.entries == []
assert res.fatal == "the compile stage left 2000000 bytes; the cap is 1000000", res.fatal
EOF

KILL_AFTER=2 run_case sigterm-stops <<'EOF'
collect = "outputs"
run = ["python3", "-c", "import os, time; os.mkdir('outputs'); print('sleeping', flush=True); time.sleep(30)"]
---
assert res.run.end == "stopped" and res.run.stdout == b"sleeping\n"
assert 1000 <= res.run.wall_ms < 5000 and res.entries == [] and res.rc == 0
EOF

KILL_AFTER=2 run_case sigterm-stops-not-pid1 --init <<'EOF'
run = ["sh", "-c", "echo sleeping; sleep 30"]
---
assert res.run.end == "stopped" and res.run.stdout == b"sleeping\n" and res.rc == 0
EOF

HOLD_STDIN=1 KILL_AFTER=1 run_case sigterm-while-waiting <<'EOF'
raw = b"codebox-init 1\n"
---
assert res.rc == 125 and res.fatal == "stopped (SIGTERM) while reading the payload", res.fatal
EOF

# A SIGTERM from inside the container wakes the wait for the payload but does not count; the
# one from outside must still end the wait (no read blocked with SIGTERM masked in between).
HOLD_STDIN=1 TERM_INSIDE=1 KILL_AFTER=1 run_case sigterm-after-a-signal-from-inside <<'EOF'
raw = b"codebox-init 1\n"
---
assert res.rc == 125 and res.fatal == "stopped (SIGTERM) while reading the payload", res.fatal
assert res.elapsed < 30, res.elapsed
EOF

# A text longer than its buffer (here a 128-byte X frame, built small on purpose) loses the
# lines that do not fit, whole; nothing is written past the buffer.
HELPER=/usr/local/bin/codebox-init-small run_case x-frame-text-over-its-buffer <<'EOF'
run = ["n" * 2000]
---
assert res.rc == 0 and res.run.end == "error" and res.run.error is None, res.run
assert sum(len(k) + len(v) + 2 for k, v in res.run.x.items()) < 128, res.run.x
assert res.run.stderr_bytes == 0, res.run.x
EOF

run_case program-cannot-stop-pid1 <<'EOF'
run = ["python3", "-c", "import os, signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):\n    os.kill(1, s)\nprint('still here')"]
---
assert res.run.end == "exited" and res.run.code == 0 and res.run.stdout == b"still here\n"
EOF

run_case exec-missing <<'EOF'
run = ["no-such-command", "arg"]
---
assert res.run.end == "error" and res.run.code is None
assert res.run.error == "cannot run no-such-command: No such file or directory", res.run.error
EOF

run_case exec-not-executable <<'EOF'
files = [("0644", "script.sh", "#!/bin/sh\necho hi\n")]
run = ["./script.sh"]
---
assert res.run.end == "error" and res.run.error == "cannot run ./script.sh: Permission denied"
EOF

run_case child-environment <<'EOF'
env = ["GREETING=hi", "HOME=/override", "PATH=/usr/bin:/bin"]
check = ["cat", "/proc/self/oom_score_adj"]
run = ["python3", "-c", """
import os
print(os.environ['GREETING'], os.environ['HOME'], os.environ['PATH'], os.environ['LANG'], os.getcwd())
"""]
---
assert res.check.stdout == b"1000\n"
assert res.run.stdout.split(b"\n")[0] == b"hi /override /usr/bin:/bin C.UTF-8 /workspace", res.run.stdout
EOF

run_case child-signals-fds-dumpable <<'EOF'
check = ["grep", "-E", "^(SigBlk|SigIgn|NoNewPrivs)", "/proc/self/status"]
run = ["python3", "-c", """
import os
open_fds = []
for fd in range(1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print(open_fds)
for path in ('/proc/1/fd/1', '/proc/1/environ', '/proc/1/mem'):
    try:
        open(path, 'rb').close()
        print('opened', path)
    except PermissionError:
        print('denied', path)
"""]
---
assert res.check.stdout == b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nNoNewPrivs:\t1\n", res.check.stdout
assert res.run.stdout == b"[0, 1, 2]\ndenied /proc/1/fd/1\ndenied /proc/1/environ\ndenied /proc/1/mem\n", res.run.stdout
EOF

run_case payload-files <<'EOF'
dirs = [("0700", "private"), ("0755", "a/b")]
files = [("0600", "private/key", "k"), ("0755", "a/b/run.sh", "#!/bin/sh\necho ran $1\n"),
         ("0644", "data/deep/x.txt", b"\0binary\xff")]
links = [("lnk", "a/b/run.sh")]
run = ["sh", "-c", "stat -c '%a %F %n' private private/key a a/b a/b/run.sh data data/deep data/deep/x.txt lnk && ./lnk now && od -An -c data/deep/x.txt"]
---
assert res.run.stdout.decode().split("\n")[:11] == [
    "700 directory private", "600 regular file private/key", "755 directory a",
    "755 directory a/b", "755 regular file a/b/run.sh", "755 directory data",
    "755 directory data/deep", "644 regular file data/deep/x.txt", "777 symbolic link lnk",
    "ran now", "  \\0   b   i   n   a   r   y 377"], res.run.stdout
EOF

link_redirect_case() {
  cat <<'EOF'
records = [("link", "d\0/tmp"), ("file", "0644 d/x\0escaped")]
run = ["true"]
---
assert res.rc == 125 and res.run is None
assert res.fatal.startswith("payload: cannot open the directory d"), res.fatal
EOF
}
run_case payload-link-cannot-redirect < <(link_redirect_case)

run_case payload-dotdot <<'EOF'
files = [("0644", "a/../../etc/x", "x")]
run = ["true"]
---
assert res.rc == 125 and "invalid path" in res.fatal, res.fatal
EOF

run_case payload-unknown-record <<'EOF'
records = [("bogus", "1")]
run = ["true"]
---
assert res.rc == 125 and res.fatal == "payload: unknown record `bogus`", res.fatal
EOF

run_case payload-truncated <<'EOF'
raw = b"codebox-init 1\nrun 10\nabc"
---
assert res.rc == 125 and res.fatal == "payload: the input ended before the end record", res.fatal
EOF

run_case payload-existing-file <<'EOF'
files = [("0644", "x", "1"), ("0644", "x", "2")]
---
assert res.rc == 125 and res.fatal == "payload: cannot create the file x: File exists", res.fatal
EOF

run_case no-phases <<'EOF'
collect = "outputs"
---
assert res.check is None and res.run is None and res.entries == [] and res.rc == 0
EOF

# ---- session mode (docs/sandbox-init.md, "Session mode"), with the test driver ----

session_case session-state-kept <<'EOF'
a = s.open(driver=DRIVER, timeout_ms=20000)
assert a.d == {"state": "new", "workspace_bytes": str(a.workspace_bytes)} and a.fatal is None, a
a = s.exec(cell="x = 41\nprint('hello')", timeout_ms=10000)
assert a.state == "new" and a.result is None and a.result_bytes is None, a
assert a.check.end == "exited" and a.check.code == 0 and a.check.stdout == b"", a
assert a.run.end == "exited" and a.run.code == 0 and a.run.stdout == b"hello\n", a
assert a.run.stdout_bytes == 6 and a.run.peak_source == "process" and a.run.peak_kb > 1000, a
a = s.exec(cell="x + 1", timeout_ms=10000)
assert a.state == "kept" and a.result == b"42" and a.result_bytes == 2 and a.run.stdout == b"", a
assert a.reason is None and a.error is None and a.workspace_bytes >= 0, a
EOF

session_case session-syntax-error <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="def f(:\n    pass")
assert a.check.end == "exited" and a.check.code == 1 and a.run is None, a
assert b"SyntaxError" in a.check.stderr and a.check.stderr_bytes == len(a.check.stderr), a
assert a.state == "kept" and a.result is None, a
a = s.exec(cell="x")
assert a.result == b"1" and a.state == "kept", a
EOF

session_case session-result-and-output-caps <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="print('o' * 1000)\n'r' * 5000", output_limit=100)
assert a.run.stdout == b"o" * 100 and a.run.stdout_bytes == 1001, a
assert a.result == b"'" + b"r" * 99 and a.result_bytes == 5002, a
a = s.exec(cell="'r' * 200000")
assert a.result == b"'" + b"r" * 200000 + b"'" and a.result_bytes == 200002, len(a.result)
# One R frame, within the host's largest frame (1 MiB) whatever output_limit says.
a = s.exec(cell="'r' * 1200000", output_limit=4 << 20)
assert a.result == b"'" + b"r" * ((1 << 20) - 1) and a.result_bytes == 1200002, len(a.result)
EOF

session_case session-done-error <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="raise SystemExit(4)")
assert a.run.end == "exited" and a.run.code == 4 and a.state == "kept", a
a = s.exec(cell="print('before')\n1 / 0")
assert a.run.end == "exited" and a.run.code == 1 and a.run.stdout == b"before\n", a
assert b"ZeroDivisionError" in a.run.stderr and a.result is None and a.state == "kept", a
a = s.exec(cell="import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(5)")
assert a.run.end == "signaled" and a.run.signal == 2 and a.state == "kept", a
a = s.exec(cell="x")
assert a.result == b"1", a
EOF

# What a cell starts ends with it: a child of the driver, and an orphan in a session of its own
# that ignores SIGTERM; the next cell sees no live process but its own and codebox-init (and,
# not PID 1, tini).
background_case() {
  cat <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="""
import os, signal, subprocess, time
child = subprocess.Popen(['sleep', '60'])
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        open('/tmp/bg.pid', 'w').write(str(os.getpid()))
        time.sleep(60)
    os._exit(0)
os.wait()
while not os.path.exists('/tmp/bg.pid'):
    time.sleep(0.01)
print('started', flush=True)
""", timeout_ms=20000)
assert a.run.stdout == b"started\n" and a.run.code == 0 and a.run.wall_ms < 10000, a
a = s.exec(cell="""
import os
def state(p):
    try:
        return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0]
    except OSError:
        return 'gone'
mine = {1, os.getpid(), os.getppid()}
sorted(p for p in map(int, filter(str.isdigit, os.listdir('/proc'))) if p not in mine and state(p) not in ('Z', 'gone'))
""")
assert a.result == b"[]", a
EOF
}
session_case session-background-killed < <(background_case)
session_case session-background-killed-not-pid1 --init < <(background_case)

# The run's guarantees hold for a cell: codebox-init cannot be read or signalled from it, the
# driver is the OOM killer's first choice, has fds 0 to 4 from codebox-init (0 is the cell's
# stdin while it runs) and default signal handling.
session_case session-cell-cannot-reach-pid1 <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="""
import os, signal
seen = []
for path in ('/proc/1/fd/1', '/proc/1/environ', '/proc/1/mem'):
    try:
        open(path, 'rb').close()
        seen.append('opened ' + path)
    except PermissionError:
        seen.append('denied ' + path)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
    os.kill(1, sig)
seen.append(open('/proc/self/oom_score_adj').read().strip())
seen.append(os.readlink('/proc/self/fd/0'))
seen.append(sorted(int(fd) for fd in os.listdir('/proc/self/fd') if int(fd) <= 4))
seen
""", stdin="x")
assert a.result == repr(["denied /proc/1/fd/1", "denied /proc/1/environ", "denied /proc/1/mem",
                         "1000", "/tmp/.codebox-stdin", [0, 1, 2, 3, 4]]).encode(), a
a = s.exec(cell="'still here'")
assert a.result == b"'still here'" and a.state == "kept", a
EOF

session_case session-timeout-interrupted <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 5")
a = s.exec(cell="print('spinning', flush=True)\nwhile True: pass", timeout_ms=1000)
assert a.run.end == "timed_out" and a.run.stdout == b"spinning\n", a
assert b"KeyboardInterrupt" in a.run.stderr and a.state == "kept" and a.reason is None, a
assert 1000 <= a.run.wall_ms < 10000, a
a = s.exec(cell="x")
assert a.result == b"5" and a.state == "kept", a
EOF

# A driver that ignores SIGINT is killed after interrupt_ms and started again: the state is
# lost, and the next execution runs in a fresh interpreter.
reset_case() {
  cat <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 5")
a = s.exec(cell="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
           timeout_ms=1000, interrupt_ms=500)
assert a.run.end == "timed_out" and a.state == "reset" and a.reason == "timed_out", a
assert 1500 <= a.run.wall_ms < 10000, a
a = s.exec(cell="x")
assert a.state == "new" and a.run.code == 1 and b"NameError" in a.run.stderr, a
a = s.exec(cell="x = 6\nx")
assert a.state == "kept" and a.result == b"6", a
EOF
}
session_case session-timeout-reset < <(reset_case)
session_case session-timeout-reset-not-pid1 --init < <(reset_case)

# SIGTERM from outside during an execution stops it (interrupt first: the state is kept); what
# it wrote under outputs/ comes back with the next execution, not with the stopped one.
session_case session-stop <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 7")
s.send(s.exec_request(cell="""
import os, time
os.makedirs('outputs', exist_ok=True)
open('outputs/partial.txt', 'w').write('p')
print('sleeping', flush=True)
time.sleep(30)
""", timeout_ms=30000, collect="outputs"))
time.sleep(2)
s.signal("TERM")
a = s.answer()
assert a.run.end == "stopped" and a.run.stdout == b"sleeping\n" and a.entries == [], a
assert a.state == "kept" and a.run.wall_ms < 10000, a
a = s.exec(cell="x", collect="outputs")
assert a.result == b"7" and [e.path for e in a.entries] == ["outputs/partial.txt"], a
EOF

# SIGTERM means nothing outside an execution, and a SIGTERM from inside the container (the
# cell's own) never stops anything.
session_case session-sigterm-idle-ignored <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 8")
s.signal("TERM")
time.sleep(1)
a = s.exec(cell="import os, signal, time\nos.kill(1, signal.SIGTERM)\ntime.sleep(0.5)\nx")
assert a.run.end == "exited" and a.run.code == 0 and a.result == b"8" and a.state == "kept", a
EOF

session_case session-oom -m 128m --memory-swap 128m <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="b = bytearray(1 << 30)")
assert a.run.end == "signaled" and a.run.signal == 9 and a.run.oom_kills >= 1, a
assert a.state == "reset" and a.reason == "out_of_memory", a
a = s.exec(cell="1 + 1")
assert a.state == "new" and a.result == b"2", a
EOF

session_case session-driver-exits <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="print('bye', flush=True)\nimport os\nos._exit(3)")
assert a.run.end == "exited" and a.run.code == 3 and a.run.stdout == b"bye\n", a
assert a.state == "reset" and a.reason == "driver_exited" and a.warnings == [], a
a = s.exec(cell="'x' in globals()")
assert a.state == "new" and a.result == b"False", a
EOF

session_case session-reset-request <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="'x' in globals()", reset=1)
assert a.state == "new" and a.result == b"False", a
a = s.exec(cell="'x' in globals()", reset=0)
assert a.state == "kept" and a.result == b"False", a
EOF

session_case session-cell-stdin <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="import sys\nsys.stdin.read().upper()", stdin="some input")
assert a.result == b"'SOME INPUT'", a
a = s.exec(cell="import sys\nsys.stdin.read()")
assert a.result == b"''", a
EOF

session_case session-usage -m 512m --memory-swap 512m <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass")
assert 300 <= a.run.cpu_ms <= 1500, a.run.cpu_ms
a = s.exec(cell="import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time\\nwhile time.process_time() < 0.5: pass'])")
assert 300 <= a.run.cpu_ms <= 1500, a.run.cpu_ms
a = s.exec(cell="b = bytearray(150 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\ndel b")
assert a.run.peak_kb >= 150 * 1024, a.run.peak_kb
a = s.exec(cell="1")
assert a.run.peak_kb < 100 * 1024, a.run.peak_kb
EOF

session_case session-changed-outputs <<'EOF'
s.open(driver=DRIVER, files=[("0644", "outputs/uploaded.txt", "u0")])
a = s.exec(cell="""
import os
open('outputs/a.txt', 'w').write('a')
open('outputs/b.txt', 'w').write('b')
os.symlink('a.txt', 'outputs/link')
""", collect="outputs")
assert [e.path for e in a.entries] == ["outputs/a.txt", "outputs/b.txt", "outputs/link"], a
a = s.exec(cell="open('outputs/a.txt', 'w').write('a')\nopen('outputs/b.txt', 'w').write('B')",
           collect="outputs")
assert [(e.path, e.content) for e in a.entries] == [("outputs/b.txt", b"B")], a
a = s.exec(cell="None", collect="outputs", files=[("0644", "outputs/c.txt", "c")])
assert a.entries == [], a
a = s.exec(cell="open('outputs/c.txt', 'w').write('C')\nopen('outputs/uploaded.txt', 'w').write('u0')",
           collect="outputs")
assert [(e.path, e.content) for e in a.entries] == [("outputs/c.txt", b"C")], a
a = s.exec(cell="import os\nos.remove('outputs/link')\nos.symlink('b.txt', 'outputs/link')",
           collect="outputs")
assert [(e.path, e.target) for e in a.entries] == [("outputs/link", "b.txt")], a
EOF

session_case session-files-only <<'EOF'
a = s.open(files=[("0644", "data.txt", "from the opening\n")], env=["GREETING=hi"])
assert a.state == "new", a
prog = "import os, sys\nprint(os.environ['GREETING'], os.environ['EXTRA'], open('data.txt').read().strip(), sys.stdin.read().upper())\n"
a = s.exec(check=["python3", "-c", "import sys; print(repr(sys.stdin.read()))"],
           run=["python3", "main.py"], files=[("0644", "main.py", prog)], env=["EXTRA=x"],
           stdin="abc", timeout_ms=10000)
assert a.state == "new" and a.check.code == 0 and a.check.stdout == b"''\n", a
assert a.run.stdout == b"hi x from the opening ABC\n" and a.run.peak_source == "process", a
assert a.result is None and a.result_bytes is None, a
# What the program left at a file's path (a FIFO, a link to a file outside) is replaced, never
# followed or opened; a directory there fails the request and the session goes on.
a = s.exec(run=["python3", "-c", "import os; os.mkfifo('main.py.new'); os.remove('data.txt'); os.symlink('/tmp/outside', 'data.txt'); open('/tmp/outside', 'w').write('outside'); os.mkdir('dir')"],
           env=["EXTRA=y"])
assert a.state == "kept" and a.run.code == 0, a
a = s.exec(run=["python3", "-c", "import os; print(open('data.txt').read(), open('main.py.new').read(), open('/tmp/outside').read(), os.path.islink('data.txt'))"],
           files=[("0644", "data.txt", "new data"), ("0644", "main.py.new", "was a fifo")])
assert a.run.stdout == b"new data was a fifo outside False\n", a
a = s.exec(run=["true"], files=[("0644", "dir", "x")])
assert a.error == "cannot replace dir: it is a directory" and a.run is None and a.state is None, a
a = s.exec(run=["python3", "-c", "import sys; print(len(sys.stdin.read()))"])
assert a.run.stdout == b"0\n" and a.state == "kept", a
EOF

read_case() {
  cat <<'EOF'
s.open(driver=DRIVER, files=[("0644", "data.bin", bytes(range(100))), ("0600", "sub/b.txt", "b"),
                             ("0644", "sub/a.txt", "aa")], dirs=[("0755", "sub/deeper")],
       links=[("lnk", "sub"), ("sub/out", "/etc/passwd")])
s.exec(cell="import os\nos.mkfifo('fifo')")
a = s.read("data.bin", offset=10, max_bytes=5)
(e,) = a.entries
assert (e.kind, e.path, e.size, e.mode, e.reason) == ("f", "data.bin", 100, 0o644, "range 5"), a
assert e.sha256 == hashlib.sha256(bytes(range(100))).hexdigest() and a.content == bytes(range(10, 15)), a
assert a.error is None and a.state is None and a.workspace_bytes > 0, a
a = s.read("data.bin", offset=95, max_bytes=100)
assert a.content == bytes(range(95, 100)) and a.entries[0].reason == "range 5", a
a = s.read("data.bin")
assert a.content == bytes(range(100)) and a.entries[0].reason == "range 100", a
a = s.read("data.bin", offset=200)
assert a.content == b"" and a.entries[0].size == 100 and a.entries[0].reason == "range 0", a
a = s.read("sub")
assert [(e.kind, e.path, e.size, e.reason, e.target) for e in a.entries] == [
    ("d", "sub", 0, "", ""), ("f", "sub/a.txt", 2, "listed", ""),
    ("f", "sub/b.txt", 1, "listed", ""), ("d", "sub/deeper", 0, "", ""),
    ("l", "sub/out", 11, "a symbolic link, not followed", "/etc/passwd")], a
assert a.content == b"", a
a = s.read(".")
assert [e.path for e in a.entries] == [".", "data.bin", "fifo", "lnk", "sub"], a
assert a.files["fifo"].reason == "not a regular file", a
a = s.read("lnk")
assert [(e.kind, e.path, e.target) for e in a.entries] == [("l", "lnk", "sub")] and a.content == b"", a
a = s.read("lnk/a.txt")
assert a.error == "lnk/a.txt: lnk is a symbolic link, not followed" and a.entries == [], a
a = s.read("sub/out")
assert a.entries[0].kind == "l" and a.content == b"", a
a = s.read("fifo")
assert a.entries[0].reason == "not a regular file", a
a = s.read("missing/x")
assert a.error == "missing/x: No such file or directory", a
a = s.read("missing")
assert a.error == "missing: No such file or directory", a
a = s.read("../etc/passwd")
assert "invalid path" in a.error, a
a = s.exec(cell="1")
assert a.result == b"1", a
EOF
}
session_case session-read < <(read_case)

# A request that is not understood is answered by D error=...; the session goes on. Only an
# input that cannot be followed is fatal.
session_case session-malformed-requests <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 3")
for request, error in [
    (s.exec_request(cell="1", records=[("bogus", b"x")]), "unknown record `bogus`"),
    (s.exec_request(cell="1", records=[("cell", b"2")]), "the cell record appears twice"),
    (s.exec_request(cell="1", records=[("path", b"x")]), "an exec request has no path record"),
    (s.exec_request(cell="1", timeout_ms="soon"), "the timeout_ms record is not a decimal number"),
    (s.exec_request(cell="1", collect="workspace-on-success"), "collect is `workspace-on-success`, not none or outputs"),
    (s.exec_request(cell="1", reset=2), "the reset record is not 0 or 1"),
    (s.exec_request(run=["true"]), "a stateful session's exec request has no run record"),
    (s.exec_request(), "a stateful session's exec request needs a cell record"),
    (s.exec_request(cell="1", files=[("0644", "../x", "x")]), 'file record: invalid path "../x" (relative, at most 4096 bytes, no empty, `.` or `..` component)'),
    (s.exec_request(cell="1", records=[("stdin", b"")], check=["true"]), "a stateful session's exec request has no check record"),
    (b"file 3\nabcend 0\n", "a request begins with an exec or read record, not `file`"),
    (b"end 0\n", "a request begins with an exec or read record, not end"),
    (b"exec 2\nxyend 0\n", "the exec record is not empty"),
    (b"read 0\nend 0\n", "a read request needs a path record"),
    (b"read 0\npath 1\nxcell 1\nxend 0\n", "a read request has no cell record"),
]:
    a = s.request(request)
    assert a.error == error and a.state is None and a.run is None, (request, a)
a = s.exec(cell="x")
assert a.result == b"3" and a.state == "kept", a
# env records (the host sends the language's with every execution) are ignored: the driver has
# the opening's environment.
a = s.exec(cell="import os\nos.environ.get('A')", env=["A=1"])
assert a.error is None and a.result is None and a.state == "kept", a
a = s.request(b"hello\n")
assert a.fatal == "request: a record header is not `<name> <length>`", a
EOF

session_case session-driver-missing <<'EOF'
a = s.open(driver=["no-such-driver"])
assert a.fatal == "the session's driver cannot start: cannot run no-such-driver: No such file or directory", a
EOF

session_case session-driver-dies-at-start <<'EOF'
a = s.open(driver=["python3", "-c", "import sys; print('boom', file=sys.stderr); sys.exit(2)"])
assert a.fatal == "the session's driver cannot start: the driver exited with code 2 before it said ready; the end of its stderr: boom ", a
EOF

session_case session-driver-not-ready <<'EOF'
a = s.open(driver=["sleep", "60"], timeout_ms=1000)
assert a.fatal == "the session's driver cannot start: the driver did not say ready within 1000 ms", a
assert a.elapsed < 10, a.elapsed
EOF

# A driver that cannot be started again: the execution says the interpreter was reset (its
# state is gone), with driver_exited and the reason, and the next one starts it afresh.
session_case session-driver-restart-fails <<'EOF'
s.open(driver=["sh", "-c", "test -e nostart && exit 2; exec python3 /usr/local/lib/codebox-test/driver.py"])
s.exec(cell="x = 1")
a = s.exec(cell="open('nostart', 'w').close()\nimport os\nos._exit(3)")
assert a.state == "reset" and a.reason == "driver_exited", a
a = s.exec(cell="1")
assert a.state == "reset" and a.reason == "driver_exited", a
assert a.error.startswith("cannot start the driver: the driver exited with code 2"), a
assert s.docker_exec("rm", "/workspace/nostart").returncode == 0
a = s.exec(cell="'x' in globals()")
assert a.state == "new" and a.result == b"False", a
EOF

# A file checked by name and swapped for a FIFO (kept full by a writer) before it is opened:
# the opened descriptor is checked again, so a read never reads a FIFO, and answers. strace
# holds each of codebox-init's openat calls for 300 ms, so that the swap lands between the
# check and the open for about half of the reads.
HELPER="strace -qq -o /dev/null -e trace=openat -e inject=openat:delay_enter=300000 /usr/local/bin/codebox-init" \
session_case session-read-swapped-fifo --init <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="""
import os, threading, time
open('f', 'w').write('regular')
os.mkfifo('p')
w = os.open('p', os.O_RDWR)
def fill():
    while True:
        os.write(w, b'x' * 65536)
def swap():
    while True:
        open('r.new', 'w').write('regular')
        os.rename('r.new', 'f')
        time.sleep(0.2)
        os.link('p', 'p.new')
        os.rename('p.new', 'f')
        time.sleep(0.2)
threading.Thread(target=fill, daemon=True).start()
threading.Thread(target=swap, daemon=True).start()
""")
assert a.error is None and a.run.code == 0, a
seen = set()
for _ in range(20):
    a = s.read("f", timeout=10)
    assert a.error is None and len(a.entries) == 1, a
    (e,) = a.entries
    seen.add(e.reason)
    assert (e.reason, a.content) in (("range 7", b"regular"), ("not a regular file", b"")), a
assert seen == {"range 7", "not a regular file"}, seen
EOF

# The cell forges a reply on fd 4: the driver broke the protocol and is replaced.
session_case session-driver-breaks-protocol <<'EOF'
s.open(driver=DRIVER)
s.exec(cell="x = 1")
a = s.exec(cell="import os\nos.write(4, b'done ok\\nextra\\n')\nimport time\ntime.sleep(5)")
assert a.state == "reset" and a.reason == "driver_exited", a
assert a.warnings == ["the driver wrote after its answer to the cell"], a
a = s.exec(cell="'x' in globals()")
assert a.state == "new" and a.result == b"False", a
EOF

# ---- the egress relay (codebox-init-egress.c) ----
# A stand-in for codebox's proxy on the host: a Unix socket server in a folder of its own that
# answers each connection, once the client's end of file came, with what it got; the folder is
# mounted read-only where codebox mounts it. The relay runs only when CODEBOX_EGRESS says so.
egress=$work/egress
mkdir -m 0711 "$egress"
python3 - "$egress/proxy.sock" <<'PY' &
import os, socketserver, sys
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        got = b""
        while chunk := self.request.recv(65536):
            got += chunk
        self.request.sendall(b"proxy got %d bytes: " % len(got) + got[:40])
socketserver.ThreadingUnixStreamServer.daemon_threads = True
socketserver.ThreadingUnixStreamServer.request_queue_size = 16
server = socketserver.ThreadingUnixStreamServer(sys.argv[1], Echo)
os.chmod(sys.argv[1], 0o666)
server.serve_forever()
PY
egress_server_pid=$!
for _ in $(seq 50); do [[ -S $egress/proxy.sock ]] && break; sleep 0.1; done
relay_on=(-v "$egress:/run/codebox-egress:ro" -e CODEBOX_EGRESS=127.0.0.1:3128=/run/codebox-egress/proxy.sock)

egress_relay_case() {
  cat <<'EOF'
# Each connection to the container's 127.0.0.1:3128 reaches the Unix socket, both ways, with a
# half-close passed on (the answer comes after the client's end of file); more connections
# at once than the relay's 64 slots all get through; 1 MB goes up. The helper's records, exit
# status and processes are as without it, and the program does not see CODEBOX_EGRESS.
run = ["python3", "-c", """
import os, socket, sys
def ask(data):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    s.close()
    return got
print(ask(b"hello relay").decode())
print(ask(b"x" * 1000000)[:30].decode())
conns = []
for i in range(100):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"conn %d" % i)
    s.shutdown(socket.SHUT_WR)
    conns.append(s)
answers = []
for s in conns:
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    answers.append(got)
print(sum(a == b"proxy got %d bytes: conn %d" % (len(b"conn %d" % i), i) for i, a in enumerate(answers)))
print("CODEBOX_EGRESS" in os.environ, sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()))
print(len(os.listdir("/proc/1/task")))
sys.exit(3)
"""]
timeout_ms = 60000
---
out = res.run.stdout.decode().splitlines()
assert len(out) == 5 and out[0] == "proxy got 11 bytes: hello relay", (out, res.run.stderr[-1500:])
assert out[1] == "proxy got 1000000 bytes: xxxxx", out
assert out[2] == "100", (out, res.run.stderr)
assert out[3] == "False [1]", out
assert out[4] == "2", out
assert res.run.end == "exited" and res.run.code == 3, res.run
# (gVisor hides the memory cgroup: its two warnings say so; none is the relay's.)
assert not [w for w in res.warnings if "cgroup" not in w], res.warnings
EOF
}
run_case egress-relay "${relay_on[@]}" < <(egress_relay_case)

run_case egress-relay-off-without-the-variable -v "$egress:/run/codebox-egress:ro" <<'EOF'
run = ["python3", "-c", """
import os, socket
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5)
    print("connected")
except OSError as e:
    print(type(e).__name__)
print(len(os.listdir("/proc/1/task")))
"""]
---
assert res.run.stdout == b"ConnectionRefusedError\n1\n", res.run
EOF

# The proxy not there: each connection is ended at once; the run goes on.
run_case egress-relay-proxy-missing -e CODEBOX_EGRESS=127.0.0.1:3128=/run/nothing/proxy.sock <<'EOF'
run = ["python3", "-c", """
import socket
for _ in range(3):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    try:
        s.sendall(b"GET / HTTP/1.1\\r\\n\\r\\n")
        print(repr(s.recv(100)))
    except OSError as e:
        print(type(e).__name__)
"""]
timeout_ms = 20000
---
lines = res.run.stdout.splitlines()
assert res.run.code == 0 and len(lines) == 3, res.run
assert all(l in (b"b''", b"ConnectionResetError", b"BrokenPipeError") for l in lines), res.run
EOF

run_case egress-relay-malformed -e CODEBOX_EGRESS=localhost:3128 <<'EOF'
run = ["true"]
---
assert res.fatal is not None and res.fatal.startswith("the egress relay (CODEBOX_EGRESS) cannot start:"), res.fatal
assert res.run is None
EOF

# A session's driver and cells reach it the same way.
session_case egress-relay-session "${relay_on[@]}" <<'EOF'
s.open(driver=DRIVER)
a = s.exec(cell="import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\ns.sendall(b'cell')\ns.shutdown(socket.SHUT_WR)\ns.recv(100)")
assert a.result == b"b'proxy got 4 bytes: cell'", a
a = s.exec(cell="import os\nlen(os.listdir('/proc/1/task'))")
assert a.result == b"2", a
EOF

# ---- under gVisor (runsc), where the daemon has it ----
# gVisor (release 20221219) follows a symbolic link to a directory opened with O_DIRECTORY |
# O_NOFOLLOW; these check that no link is followed there either. Its sentry's own threads count
# against the pids limit: 64 is too few for a session there (it dies after a few executions),
# so these run with 256, the configuration's default.
if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
  run_case payload-link-cannot-redirect-runsc --runtime runsc < <(link_redirect_case)
  session_case session-read-runsc --runtime runsc --pids-limit 256 < <(read_case)
  # gVisor reaches a host Unix socket only when runsc runs with --host-uds=open (or all).
  if docker info --format '{{json .Runtimes.runsc}}' | grep -q -- '--host-uds=\(open\|all\)'; then
    run_case egress-relay-runsc --runtime runsc --pids-limit 256 "${relay_on[@]}" < <(egress_relay_case)
  else
    echo "skip egress-relay-runsc: runsc is not registered with --host-uds=open"
  fi
  session_case session-state-runsc --runtime runsc --pids-limit 256 <<'EOF'
# Where the high-water mark cannot be reset (no clear_refs), peak_kb is left out.
s.open(driver=DRIVER)
a = s.exec(cell="x = 2\nx")
assert a.state == "new" and a.result == b"2" and a.run.peak_kb is None, a
assert a.run.x.get("peak_source") is None, a
a = s.exec(cell="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
           timeout_ms=1000, interrupt_ms=500)
assert a.run.end == "timed_out" and a.state == "reset" and a.reason == "timed_out", a
a = s.exec(cell="'x' in globals()")
assert a.state == "new" and a.result == b"False", a
EOF
else
  echo "skip the runsc cases: the daemon has no runsc runtime"
fi

leftover=$(docker ps -aq --filter "name=codebox-init-test-$$-")
if [[ -n $leftover ]]; then
  echo "FAIL containers left behind: $leftover"
  failed=1
fi
if [[ $failed != 0 ]]; then
  echo "codebox-init: some cases FAILED"
  exit 1
fi
echo "codebox-init: all cases passed"
