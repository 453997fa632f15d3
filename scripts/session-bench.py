#!/usr/bin/env python3
"""Sessions as an agent sees them: the official MCP Python SDK starts `codebox serve` over
stdio and times, call by call:

- `create_session` for python (with a session opened ahead of time, as `codebox serve` keeps
  one), and the first execution after it;
- one warm execution (`x = x + 1`) in an open session, against `docker run --rm -i` of a
  python hello world with the same lockdown (the baseline every codebox figure is put beside);
- a pandas workflow of five steps on a 10 MB CSV: in one session (the CSV uploaded once) and as
  five stateless `run_code` calls (each uploads the CSV and recomputes what it needs; the
  server is started with `sandbox.max_files_bytes` raised to 16 MiB so that a run can take the
  CSV at all), total time and bytes sent;
- the memory eight idle python sessions hold: their containers' (docker stats) and the
  server's resident size.

Run it with the end-to-end test's virtual environment, which has `mcp`:

  target/e2e-venv/bin/python scripts/session-bench.py --binary target/release/codebox [--n 50]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ML = __import__("mcp-latency")

STEPS = [
    "import pandas as pd\ndf = pd.read_csv('data.csv')\nlen(df)",
    "df['ratio'] = df.b / (df.a + 1)\nround(float(df.ratio.mean()), 6)",
    "g = df.groupby(df.a % 10).b.sum()\nint(g.max())",
    "top = df.nlargest(5, 'b')\nlist(top.a)",
    "import os\nos.makedirs('outputs', exist_ok=True)\ndf.describe().to_csv('outputs/summary.csv')\n'ok'",
]


def stateless(step):
    """A step as a run of its own: it loads and recomputes what the steps before made."""
    prefix = "\n".join(STEPS[:step])
    code = (prefix + "\n" + STEPS[step]) if prefix else STEPS[step]
    lines = code.split("\n")
    lines[-1] = f"print({lines[-1]})" if not lines[-1].startswith(("import", "df[")) else lines[-1]
    return "\n".join(lines)


def csv_10mb():
    rows, size, i = ["a,b"], 4, 0
    while size < 10 * 1024 * 1024:
        row = f"{i},{(i * 7919) % 100003}"
        rows.append(row)
        size += len(row) + 1
        i += 1
    return "\n".join(rows) + "\n"


def stats(v):
    v = sorted(v)
    return statistics.median(v), v[min(len(v) - 1, int(0.95 * len(v)))]


async def call(session, tool, args):
    started = time.perf_counter()
    r = await session.call_tool(tool, args)
    took = (time.perf_counter() - started) * 1000
    if r.is_error:
        raise SystemExit(f"{tool}: {' '.join(getattr(c, 'text', '') for c in r.content)}")
    return r.structured_content, took, len(json.dumps(args))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def session_memory_mb():
    ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=codebox.run=session"],
                         capture_output=True, text=True).stdout.split()
    if not ids:
        return 0.0, 0
    out = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *ids],
                         capture_output=True, text=True).stdout.split("\n")
    total = 0.0
    for line in out:
        if not line.strip():
            continue
        used = line.split("/")[0].strip()
        n = float(used.rstrip("KMGiB"))
        total += n / 1024 if used.endswith("KiB") else n * 1024 if used.endswith("GiB") else n
    return total, len(ids)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--runtime", default="runc")
    args = p.parse_args()
    env = {**os.environ, "CODEBOX_LOG": "warn"}
    # Stateless runs take 4 MiB of files by default: the comparison lets them take the CSV.
    params = StdioServerParameters(command=args.binary, args=[
        "serve", "--set", "sandbox.max_files_bytes=16777216"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            creates, firsts = [], []
            for _ in range(10):
                # The server keeps a python session opened ahead of time (sessions.ready): give
                # it the time to open the next one, as an agent's think time does.
                await asyncio.sleep(3)
                s, took, _ = await call(session, "create_session", {"language": "python"})
                creates.append(took)
                _, took, _ = await call(session, "run_code", {"session_id": s["session_id"], "code": "x = 0"})
                firsts.append(took)
                await call(session, "close_session", {"session_id": s["session_id"]})
            s, _, _ = await call(session, "create_session", {"language": "python"})
            sid = s["session_id"]
            await call(session, "run_code", {"session_id": sid, "code": "x = 0"})
            warm, docker = [], []
            image = "codebox/python:3.11"
            for _ in range(args.n):
                _, took, _ = await call(session, "run_code", {"session_id": sid, "code": "x = x + 1"})
                warm.append(took)
                started = time.perf_counter()
                subprocess.run(ML.docker_flags(image, args.runtime) + ["python3", "-c",
                               "import sys; exec(sys.stdin.read())"], input=b"print('hello')",
                               capture_output=True, check=True)
                docker.append((time.perf_counter() - started) * 1000)
            await call(session, "close_session", {"session_id": sid})
            (cm, cp), (fm, fp) = stats(creates), stats(firsts)
            (wm, wp), (dm, dp) = stats(warm), stats(docker)
            print(f"create_session python: median {cm:.1f} ms, p95 {cp:.1f} (n=10)")
            print(f"first execution after it: median {fm:.1f} ms, p95 {fp:.1f}")
            print(f"warm execution x = x + 1: median {wm:.1f} ms, p95 {wp:.1f} (n={args.n}); "
                  f"docker run --rm python hello: median {dm:.1f} ms, p95 {dp:.1f}; ratio {wm / dm:.3f}")

            data = csv_10mb()
            files = [{"path": "data.csv", "content": data}]
            started = time.perf_counter()
            s, _, sent = await call(session, "create_session", {"language": "python", "files": files})
            session_bytes = sent
            for step in STEPS:
                _, _, sent = await call(session, "run_code", {"session_id": s["session_id"], "code": step,
                                                              "limits": {"timeout_seconds": 120}})
                session_bytes += sent
            session_ms = (time.perf_counter() - started) * 1000
            await call(session, "close_session", {"session_id": s["session_id"]})
            started, runs_bytes = time.perf_counter(), 0
            for i in range(len(STEPS)):
                r, _, sent = await call(session, "run_code", {"language": "python", "code": stateless(i),
                                                              "files": files, "limits": {"timeout_seconds": 120,
                                                                                         "memory_mb": 1024}})
                if r["status"] != "succeeded":
                    raise SystemExit(f"stateless step {i}: {r['status']} {r['stderr'][-500:]}")
                runs_bytes += sent
            runs_ms = (time.perf_counter() - started) * 1000
            print(f"pandas, 5 steps on a 10 MB CSV: session {session_ms:.0f} ms, {session_bytes} bytes sent; "
                  f"5 stateless run_code {runs_ms:.0f} ms, {runs_bytes} bytes sent; "
                  f"time ratio {session_ms / runs_ms:.2f}, bytes ratio {session_bytes / runs_bytes:.2f}")

            server = [p for p in os.popen(f"pgrep -f '{args.binary} serve'").read().split()]
            before = rss_kb(int(server[0])) if server else 0
            held = []
            for _ in range(8):
                s, _, _ = await call(session, "create_session", {"language": "python"})
                await call(session, "run_code", {"session_id": s["session_id"], "code": "import pandas as pd"})
                held.append(s["session_id"])
            await asyncio.sleep(2)
            mem, n = session_memory_mb()
            after = rss_kb(int(server[0])) if server else 0
            print(f"8 idle python sessions (pandas imported): containers {mem:.0f} MB in all "
                  f"({n} containers), server RSS +{(after - before) / 1024:.1f} MB")
            for sid in held:
                await call(session, "close_session", {"session_id": sid})


if __name__ == "__main__":
    asyncio.run(main())
