"""A bash session over /v1 in the guest: state kept across executions, a timeout interrupts
and keeps the state, an out-of-memory kill gives a fresh interpreter in the same session, and
the session closes. Prints `ok`/`FAIL` lines; exits 1 on any failure.

usage: python3 session.py BASE_URL LABEL
"""
import json
import sys
import urllib.request

base, label = sys.argv[1], sys.argv[2]
failed = 0


def call(method, path, body=None):
    req = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
    return json.loads(raw) if raw else {}


def check(name, cond, seen):
    global failed
    if cond:
        print(f"ok   {label} session: {name}")
    else:
        failed += 1
        print(f"FAIL {label} session: {name}: {json.dumps(seen)[:1500]}")


s = call("POST", "/v1/sessions", {"language": "bash", "limits": {"memory_mb": 64}})
sid = s.get("session_id")
check("created", bool(sid), s)
if sid:
    def run(code, **limits):
        body = {"language": "bash", "code": code, "session_id": sid}
        if limits:
            body["limits"] = limits
        return call("POST", "/v1/runs", body)

    r = run("x=41")
    check("first execution", r.get("status") == "succeeded", r)
    r = run("echo $((x+1))")
    check("state kept", r.get("stdout") == "42\n" and (r.get("session") or {}).get("state") == "kept", r)
    r = run("sleep 60", timeout_seconds=2)
    check("timeout interrupts", r.get("status") == "timed_out", r)
    r = run("echo $x")
    check("state after the timeout", r.get("status") == "succeeded", r)
    print(f"     after the timeout x={r.get('stdout')!r} state={(r.get('session') or {}).get('state')}")
    kept = "x=41\n" if r.get("stdout") == "41\n" else "x=unset\n"
    r = run("tail /dev/zero", timeout_seconds=120)
    state = (r.get("session") or {}).get("state")
    check("OOM is out_of_memory", r.get("status") == "out_of_memory", r)
    r = run('echo "x=${x:-unset}"')
    # The state the OOM's report gave is the state the next execution finds.
    want = "x=unset\n" if state == "reset" else kept
    check(f"after the OOM (state {state}) the session runs on as reported",
          r.get("status") == "succeeded" and r.get("stdout") == want, r)
    d = call("DELETE", f"/v1/sessions/{sid}")
    check("closed", "error" not in d, d)
sys.exit(1 if failed else 0)
