#!/usr/bin/env python3
"""The HTTP APIs for programs, timed from outside beside `docker run --rm`.

Starts `codebox serve --transport http` on loopback with a token, then:

1. Latency, a Python hello world, n times each way, rotating the order each round:
   `POST /v1/runs` (waits for the report), `run_code` over MCP Streamable HTTP (the official
   MCP Python SDK), and `docker run --rm -i` of the same image with the same lockdown flags
   as scripts/mcp-latency.py. Prints min, median and p95 of each and the ratios.
2. Throughput: `--runs` hello worlds by `--clients` concurrent clients of `POST /v1/runs`,
   then of the Judge0 route (`POST /submissions?wait=false`, then polling `GET
   /submissions/{token}` every 0.1 s as the official Judge0 SDK does). Prints runs/s and
   checks that every run came back with the right output (nothing lost).

Run it with the end-to-end test's virtual environment, which has `mcp` and `httpx2`:

  target/e2e-venv/bin/python scripts/http-bench.py --binary target/release/codebox \\
      [--n 50] [--clients 8] [--runs 200] [--set SETTING=VALUE ...]
"""

import argparse
import asyncio
import importlib.util
import os
import re
import secrets
import subprocess
import tempfile
import time

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = "print('hello')"
INTERPRETER = ["python3", "-c", "import sys; exec(sys.stdin.read())"]

# The docker CLI flags and the statistics of scripts/mcp-latency.py, not a copy of them.
_spec = importlib.util.spec_from_file_location("mcp_latency", os.path.join(ROOT, "scripts", "mcp-latency.py"))
_latency = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_latency)
docker_flags, spread = _latency.docker_flags, _latency.spread


def start_server(binary, token, sets, data):
    args = [binary]
    for s in sets:
        args += ["--set", s]
    args += ["serve", "--transport", "http", "--listen", "127.0.0.1:0"]
    env = dict(os.environ, CODEBOX_TOKEN=token, CODEBOX_DATA_DIR=data,
               CODEBOX_LANGUAGES=os.path.join(ROOT, "languages.toml"))
    log = open(os.path.join(data, "serve.log"), "w+")
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(600):
        log.seek(0)
        m = re.search(r"serving MCP at (http://[0-9.:]+)/mcp", log.read())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    raise SystemExit(f"codebox serve did not start:\n{log.read()}")


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "codebox"))
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    runtime = next((s.split("=", 1)[1] for s in args.set if s.startswith("sandbox.runtime=")), "runc")
    token = secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="codebox-http-bench-") as data:
        proc, url = start_server(args.binary, token, args.set, data)
        try:
            await bench(args, url, token, runtime)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


async def bench(args, url, token, runtime):
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=timeout,
                                  limits=httpx2.Limits(max_connections=64)) as http:
        langs = (await http.get("/v1/languages")).json()
        image = next(l for l in langs["languages"] if l["language"] == "python")["image"]
        docker = docker_flags(image, runtime) + INTERPRETER

        async def v1_once():
            t = time.perf_counter()
            r = await http.post("/v1/runs", json={"language": "python", "code": CODE})
            took = (time.perf_counter() - t) * 1000
            report = r.json()
            assert r.status_code == 200 and report["stdout"] == "hello\n", r.text[:500]
            return took

        def docker_once():
            t = time.perf_counter()
            out = subprocess.run(docker, input=CODE.encode(), capture_output=True)
            took = (time.perf_counter() - t) * 1000
            assert out.stdout == b"hello\n", out
            return took

        mcp_http = httpx2.AsyncClient(headers=headers, timeout=timeout)
        async with mcp_http:
            async with streamable_http_client(f"{url}/mcp", http_client=mcp_http) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()

                    async def mcp_once():
                        t = time.perf_counter()
                        r = await session.call_tool("run_code", {"language": "python", "code": CODE})
                        took = (time.perf_counter() - t) * 1000
                        assert r.structured_content["stdout"] == "hello\n", r.structured_content
                        return took

                    ways = [("POST /v1/runs", v1_once), ("run_code over MCP HTTP", mcp_once),
                            ("docker run --rm", None)]
                    # One of each first: images in the page cache, the pool filled.
                    await v1_once()
                    await mcp_once()
                    docker_once()
                    await asyncio.sleep(2)
                    times = {name: [] for name, _ in ways}
                    for i in range(args.n):
                        order = ways[i % 3:] + ways[:i % 3]
                        for name, fn in order:
                            times[name].append(await fn() if fn else docker_once())
                            # Let the pool refill, as it would between a client's calls.
                            await asyncio.sleep(0.5)
        print(f"python hello, latency, runtime {runtime}, n={args.n} each, order rotating")
        base = spread(times["docker run --rm"])[1]
        for name, xs in times.items():
            lo, med, p95 = spread(xs)
            print(f"  {name:24} min/med/p95 ms {lo:5.0f} / {med:5.0f} / {p95:5.0f}   median / docker {med / base:.2f}")

        async def v1_run(i):
            r = await http.post("/v1/runs", json={"language": "python", "code": f"print({i} * 7)"})
            return r.status_code == 200 and r.json()["stdout"] == f"{i * 7}\n"

        judge0 = {"X-Auth-Token": token}

        async def judge0_run(i):
            r = await http.post("/submissions?wait=false", headers=judge0,
                                json={"language_id": 71, "source_code": f"print({i} * 7)"})
            if r.status_code != 201:
                return False
            tok = r.json()["token"]
            while True:
                s = (await http.get(f"/submissions/{tok}?fields=status,stdout", headers=judge0)).json()
                if s["status"]["id"] > 2:
                    return s["status"]["id"] == 3 and s["stdout"] == f"{i * 7}\n"
                await asyncio.sleep(0.1)

        for name, run in [("POST /v1/runs", v1_run), ("Judge0 POST /submissions + polling", judge0_run)]:
            queue = asyncio.Queue()
            for i in range(args.runs):
                queue.put_nowait(i)
            ok = []

            async def client():
                while not queue.empty():
                    ok.append(await run(queue.get_nowait()))

            t = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(args.clients)))
            took = time.perf_counter() - t
            print(f"  throughput {name}: {args.runs} runs by {args.clients} clients in {took:.1f} s = "
                  f"{args.runs / took:.2f} runs/s; {sum(ok)} right, {len(ok) - sum(ok)} wrong or lost")


if __name__ == "__main__":
    asyncio.run(main())
