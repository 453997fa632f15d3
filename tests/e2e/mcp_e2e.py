#!/usr/bin/env python3
"""End-to-end check of codebox with the official MCP Python SDK.

Starts the built binary twice: over stdio, and over Streamable HTTP with a bearer token.
Through the tools it gets, for Python and C++, every terminal status a program can cause:
succeeded, failed, compile_error, timed_out, out_of_memory and stopped (stop_run on a running
run), and checks get_result's long-poll. Ends with a line `N passed, M failed`; exits non-zero
on any failure.

Usage: mcp_e2e.py --binary target/debug/codebox [--transport stdio|http|both]
"""

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

PROGRAMS = {
    "python": {
        "succeeded": ("print('hello')", None),
        "failed": ("import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)", None),
        "compile_error": ("def broken(:\n    pass", None),
        "timed_out": ("print('before', flush=True)\nwhile True: pass", {"timeout_seconds": 2}),
        "out_of_memory": ("a = []\nwhile True: a.append(bytearray(10**7))", {"memory_mb": 64}),
        "stopped": ("import time\nprint('begun', flush=True)\ntime.sleep(120)", {"timeout_seconds": 300}),
    },
    "cpp": {
        "succeeded": ('#include <iostream>\nint main() { std::cout << "hello\\n"; }', None),
        "failed": ("int main() { return 3; }", None),
        "compile_error": ("int main() { return }", None),
        "timed_out": ("int main() { volatile unsigned long i = 0; for (;;) i++; }", {"timeout_seconds": 2}),
        "out_of_memory": (
            "#include <cstring>\n#include <vector>\n"
            "int main() { std::vector<char*> v; for (;;) { char* p = new char[1 << 20]; "
            "std::memset(p, 1, 1 << 20); v.push_back(p); } }",
            {"memory_mb": 64},
        ),
        "stopped": ("#include <unistd.h>\nint main() { sleep(120); }", {"timeout_seconds": 300}),
    },
}


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    async def check(self, name, coro):
        started = time.monotonic()
        try:
            await coro
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            self.failed += 1
            print(f"FAIL {name}: {e}", flush=True)
            traceback.print_exc(limit=2)
        else:
            self.passed += 1
            print(f"ok   {name} ({time.monotonic() - started:.1f} s)", flush=True)


def structured(result):
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise AssertionError(f"tool error: {text}")
    return result.structured_content


def expect(cond, message):
    if not cond:
        raise AssertionError(message)


async def get_status(session, language, status):
    code, limits = PROGRAMS[language][status]
    args = {"language": language, "code": code}
    if limits:
        args["limits"] = limits
    if status != "stopped":
        progress = []

        async def on_progress(done, total, message):
            progress.append((done, total, message))

        report = structured(await session.call_tool("run_code", args, progress_callback=on_progress))
        if status == "timed_out":
            expect(progress, "no progress notifications during a 2 s run")
            expect(all(b[0] > a[0] for a, b in zip(progress, progress[1:])), f"progress not increasing: {progress}")
        expect(report["status"] == status, f"expected {status}, got {report['status']}: {report['message']}")
        expect(report["language"] == language, f"language {report['language']}")
        if status == "succeeded":
            expect(report["stdout"] == "hello\n", f"stdout {report['stdout']!r}")
        if status == "failed":
            expect(report["exit_code"] == 3, f"exit_code {report['exit_code']}")
        if status == "compile_error":
            expect(report["compile"] and report["compile"]["stderr"], "compiler output missing")
        return
    # stopped: start, wait until the program runs, stop it, then long-poll the final report.
    started = structured(await session.call_tool("start_run", args))
    run_id = started["run_id"]
    expect(started["status"] in ("queued", "running"), f"start_run status {started['status']}")
    deadline = time.monotonic() + 60
    while True:
        r = structured(await session.call_tool("get_result", {"run_id": run_id, "wait_seconds": 1}))
        expect(r["status"] in ("queued", "running"), f"run ended early: {r['status']} {r['message']}")
        if r["status"] == "running" and r["stage"] is None and r["duration_ms"] > 1500:
            break
        expect(time.monotonic() < deadline, "the run never started")
    stopped = structured(await session.call_tool("stop_run", {"run_id": run_id}))
    expect(stopped["status"] == "stopped", f"stop_run gave {stopped['status']}: {stopped['message']}")
    again = structured(await session.call_tool("stop_run", {"run_id": run_id}))
    expect(again["status"] == "stopped", "stop_run on a finished run changed it")
    polled = structured(await session.call_tool("get_result", {"run_id": run_id, "wait_seconds": 5}))
    expect(polled == stopped, "get_result differs from stop_run's report")


async def long_poll(session):
    started = structured(await session.call_tool(
        "start_run", {"language": "python", "code": "import time\ntime.sleep(1.5)\nprint(6 * 7)"}))
    r = structured(await session.call_tool("get_result", {"run_id": started["run_id"], "wait_seconds": 60}))
    expect(r["status"] == "succeeded" and r["stdout"] == "42\n", f"long-poll gave {r['status']}")


async def errors(session):
    r = await session.call_tool("run_code", {"language": "python", "code": "1", "limits": {"memory_mb": 999999}})
    expect(r.is_error, "over-ceiling memory must be a tool error")
    text = " ".join(getattr(c, "text", "") for c in r.content)
    expect("limits.memory_mb" in text, f"error does not name the field: {text}")
    r = await session.call_tool("get_result", {"run_id": "does-not-exist"})
    expect(r.is_error, "unknown run id must be a tool error")


PLOT = """
import os
import matplotlib.pyplot as plt
os.makedirs("outputs")
plt.plot([1, 4, 9, 16])
plt.savefig("outputs/plot.png")
open("outputs/squares.csv", "w").write("n,sq\\n1,1\\n2,4\\n")
"""


async def plot(session):
    result = await session.call_tool("run_code", {"language": "python", "code": PLOT,
                                                   "limits": {"timeout_seconds": 60}})
    report = structured(result)
    expect(report["status"] == "succeeded", f"plot run: {report['status']} {report['stderr']}")
    files = {f["path"]: f for f in report["files"]}
    expect(set(files) == {"outputs/plot.png", "outputs/squares.csv"}, f"files {list(files)}")
    images = [c for c in result.content if c.type == "image"]
    expect(len(images) == 1 and images[0].mime_type == "image/png", f"image blocks {images}")
    png = files["outputs/plot.png"]
    expect(png["content_base64"] is None and png["omitted_reason"] == "sent as a content block",
           f"the plot's bytes travel twice: {png['omitted_reason']}")
    expect(hashlib.sha256(base64.b64decode(images[0].data)).hexdigest() == png["sha256"],
           "image data differs")
    resources = [c for c in result.content if c.type == "resource"]
    expect(len(resources) == 1 and resources[0].resource.text == "n,sq\n1,1\n2,4\n",
           f"resources {resources}")
    text = " ".join(c.text for c in result.content if c.type == "text")
    expect(images[0].data[:64] not in text, "the text content repeats the image's base64")


async def catalog_and_history(session):
    tools = await session.list_tools()
    names = sorted(t.name for t in tools.tools)
    expect(names == ["close_session", "create_session", "get_execution_history", "get_result",
                     "list_sessions", "list_supported_languages", "read_session_file", "run_code",
                     "start_run", "stop_run"], f"tools {names}")
    cat = structured(await session.call_tool("list_supported_languages", {}))
    ids = [l["language"] for l in cat["languages"]]
    expect("python" in ids and "cpp" in ids, f"languages {ids}")
    python = next(l for l in cat["languages"] if l["language"] == "python")
    expect("numpy" in python["packages"], f"python packages {python['packages']}")
    standard = {"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6",
                "uri", "uri-reference", "uuid", "regex"}
    def formats(node):
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                yield node["format"]
            for v in node.values():
                yield from formats(v)
        elif isinstance(node, list):
            for v in node:
                yield from formats(v)
    for t in tools.tools:
        odd = {f for s in (t.input_schema, t.output_schema or {}) for f in formats(s)} - standard
        expect(not odd, f"{t.name} uses non-standard formats {odd}")


async def history(session):
    hist = structured(await session.call_tool("get_execution_history", {"limit": 100, "language": "cpp"}))
    runs = hist["runs"]
    expect(len(runs) >= 6, f"history has {len(runs)} cpp runs")
    expect(all(r["language"] == "cpp" for r in runs), "language filter ignored")
    stamps = [r["created_at"] for r in runs]
    expect(stamps == sorted(stamps, reverse=True), "history is not newest first")
    stopped = structured(await session.call_tool("get_execution_history", {"status": "stopped"}))
    expect(stopped["runs"] and all(r["status"] == "stopped" for r in stopped["runs"]), "status filter")


async def sessions(session):
    """A session, as an agent uses one: load, inspect, transform, plot, read a file."""
    csv = "x,y\n" + "".join(f"{i},{i * i}\n" for i in range(100))
    s = structured(await session.call_tool("create_session", {
        "language": "python", "files": [{"path": "data.csv", "content": csv}]}))
    sid = s["session_id"]
    expect(sid.startswith("cbx_") and s["stateful"], f"session {s}")
    expect(s["idle_timeout_seconds"] == 600 and s["max_lifetime_seconds"] == 3600, f"{s}")

    async def cell(code, **extra):
        return structured(await session.call_tool("run_code", {"session_id": sid, "code": code, **extra}))

    r = await cell("import pandas as pd\ndf = pd.read_csv('data.csv')\nlen(df)")
    expect(r["status"] == "succeeded" and r["result"] == "100", f"load: {r['status']} {r['result']} {r['stderr']}")
    expect(r["session"]["execution_count"] == 1 and r["session"]["state"] == "new", f"{r['session']}")
    r = await cell("df['z'] = df.x + df.y\nint(df.z.sum())")
    expect(r["result"] == str(sum(i + i * i for i in range(100))), f"transform: {r['result']}")
    expect(r["session"]["state"] == "kept", f"{r['session']}")
    plotted = await session.call_tool("run_code", {"session_id": sid, "code":
        "import os, matplotlib.pyplot as plt\nos.makedirs('outputs', exist_ok=True)\nplt.plot(df.x, df.y)\ndf.to_csv('outputs/z.csv')"})
    report = structured(plotted)
    images = [c for c in plotted.content if c.type == "image"]
    expect(len(images) == 1, f"the open figure as an image: {[f['path'] for f in report['files']]}")
    read = await session.call_tool("read_session_file", {"session_id": sid, "path": "outputs/z.csv"})
    meta = structured(read)
    expect(meta["size_bytes"] > 1000 and meta["content_base64"] is None, f"read: {meta}")
    resources = [c for c in read.content if c.type == "resource"]
    expect(resources and resources[0].resource.text.startswith(",x,y,z"), "the file's text")
    listed = structured(await session.call_tool("list_sessions", {}))
    expect(any(x["session_id"] == sid and x["executions"] == 3 for x in listed["sessions"]), f"{listed}")
    closed = structured(await session.call_tool("close_session", {"session_id": sid}))
    expect(closed["closed"] and closed["executions"] == 3, f"{closed}")
    later = await session.call_tool("run_code", {"session_id": sid, "code": "1"})
    expect(later.is_error, "a closed session must refuse")
    text = " ".join(getattr(c, "text", "") for c in later.content)
    expect(f"session {sid} was closed" in text, f"the error names the end: {text}")


async def suite(session, transport, results):
    await session.initialize()
    await results.check(f"{transport}: tools and catalog", catalog_and_history(session))
    for language in PROGRAMS:
        for status in PROGRAMS[language]:
            await results.check(f"{transport}: {language} {status}", get_status(session, language, status))
    await results.check(f"{transport}: get_result long-poll", long_poll(session))
    await results.check(f"{transport}: a plot comes back as an image", plot(session))
    await results.check(f"{transport}: errors name the field", errors(session))
    await results.check(f"{transport}: execution history", history(session))
    await results.check(f"{transport}: a session keeps state across calls", sessions(session))


async def over_stdio(binary, env, results):
    params = StdioServerParameters(command=binary, args=["serve"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await suite(session, "stdio", results)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Capture(logging.Handler):
    """Keeps what the SDK logs, to check that closing a session logs no failure."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


async def over_http(binary, env, results):
    token = secrets.token_hex(24)
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--transport", "http", "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, **env, "CODEBOX_TOKEN": token},
        stdin=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx2.AsyncClient() as plain:
            for _ in range(100):
                try:
                    if (await plain.get(f"{url}/healthz")).status_code == 200:
                        break
                except httpx2.HTTPError:
                    pass
                await asyncio.sleep(0.1)

            async def refuses_without_token():
                r = await plain.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                expect(r.status_code == 401, f"no token gave {r.status_code}")
            await results.check("http: 401 without the token", refuses_without_token())
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                    timeout=httpx2.Timeout(30, read=300))
        capture = Capture()
        logging.getLogger("mcp").addHandler(capture)
        async with client:
            async with streamable_http_client(f"{url}/mcp", http_client=client) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    await suite(session, "http", results)
        logging.getLogger("mcp").removeHandler(capture)

        async def closed_cleanly():
            failures = [m for m in capture.messages if "termination failed" in m]
            expect(not failures, f"the SDK logged {failures}")
        await results.check("http: the session ends without 'Session termination failed'", closed_cleanly())
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--transport", choices=["stdio", "http", "both"], default="both")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    results = Results()
    with tempfile.TemporaryDirectory(prefix="codebox-e2e-") as data:
        env = {"CODEBOX_DATA_DIR": data}
        if args.transport in ("stdio", "both"):
            await results.check("stdio session", over_stdio(binary, env, results))
        if args.transport in ("http", "both"):
            await results.check("http session", over_http(binary, env, results))
    # The session checks count once each on top of the individual checks.
    print(f"{results.passed} passed, {results.failed} failed")
    return 0 if results.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
