"""The pool's limit classes over /v1 in the guest: runs of two memory classes, one after
another, each served by the pool (a ready container of its own shape, or one whose limits
were changed), each with its own limit in force. Prints `ok`/`FAIL`; exits 1 on a failure.

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


# Memory in force, from inside: the cgroup's memory.max.
probe = "cat /sys/fs/cgroup/memory.max"
for i in range(2):
    for mb in (64, 256):
        time.sleep(3)  # the pool refills between runs
        r = call("POST", "/v1/runs", {"language": "bash", "code": probe, "limits": {"memory_mb": mb}})
        check(f"round {i + 1}: a {mb} MB run has its limit",
              r.get("status") == "succeeded" and r.get("stdout", "").strip() == str(mb * 1024 * 1024), r)
t = takes()
print(f"     pool takes: {t}")
check("the pool served runs of both classes", t.get("hit", 0) + t.get("updated", 0) >= 2, t)
sys.exit(1 if failed else 0)
