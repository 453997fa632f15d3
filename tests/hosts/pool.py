"""The pool's limit classes over /v1 in the guest: runs of two memory classes, one after
another, each with its own limit in force, served by the pool: a ready container whose limits
were changed, or (where the daemon cannot change them: Podman) one of the class's own shape,
which the pool keeps once two runs asked for it. Prints `ok`/`FAIL`; exits 1 on a failure.

usage: python3 pool.py BASE_URL
"""
import json
import re
import sys
import time
import urllib.request

base = sys.argv[1]
failed = 0


def call(method, path, body=None):
    req = urllib.request.Request(
        base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
    if path == "/metrics":
        return raw.decode()
    return json.loads(raw) if raw else {}


def check(name, cond, seen):
    global failed
    print(("ok   " if cond else "FAIL ") + f"pool: {name}" + ("" if cond else f": {json.dumps(seen)[:1500]}"))
    failed += 0 if cond else 1


def takes():
    m = call("GET", "/metrics")
    return {k: int(v) for k, v in re.findall(r'codebox_pool_takes_total\{result="(\w+)"\} (\d+)', m)}


def settle():
    """Wait until the pool stops changing (its fills ended) for 3 s, at most 120 s: under
    emulation a container takes seconds to make."""
    last, still, deadline = None, 0, time.time() + 120
    while still < 6 and time.time() < deadline:
        time.sleep(0.5)
        m = call("GET", "/metrics")
        now = re.findall(r'^codebox_pool_(?:idle\{[^}]*\}|memory_mb) (\d+)', m, re.M)
        still = still + 1 if now == last else 0
        last = now


# Memory in force, from inside: the cgroup's memory.max.
probe = "cat /sys/fs/cgroup/memory.max"
for i in range(3):
    for mb in (64, 256):
        settle()
        r = call("POST", "/v1/runs", {"language": "bash", "code": probe, "limits": {"memory_mb": mb}})
        check(f"round {i + 1}: a {mb} MB run has its limit",
              r.get("status") == "succeeded" and r.get("stdout", "").strip() == str(mb * 1024 * 1024), r)
t = takes()
print(f"     pool takes: {t}")
check("the pool served runs of both classes", t.get("hit", 0) + t.get("updated", 0) >= 2, t)
sys.exit(1 if failed else 0)
