#!/usr/bin/env python3
"""`run_code` over MCP, timed by a real client, beside `docker run --rm`.

`codebox bench` times runs through the run manager, in process. This adds what an agent sees:
the official MCP Python SDK starts `codebox serve` over stdio and times `run_code` for a hello
world, call by call, alternating with a `docker run --rm -i` of the same image and lockdown
flags (Docker's default seccomp profile: codebox's own is not written out for the CLI here).
Prints min, median and p95 of each and their ratio. Run it with the end-to-end test's
virtual environment, which has `mcp`:

  target/e2e-venv/bin/python scripts/mcp-latency.py --binary target/release/codebox [--n 20]
      [--language python] [--set SETTING=VALUE ...]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = {
    "python": ("print('hello')", ["python3", "-c", "import sys; exec(sys.stdin.read())"]),
    "bash": ("echo hello", ["bash", "-s"]),
}


def docker_flags(image, runtime):
    return [
        "docker", "run", "--rm", "-i", "--network=none", "--read-only", "--user=10001:10001",
        "--cap-drop=ALL", "--security-opt=no-new-privileges", "--pids-limit=256",
        "--memory=512m", "--memory-swap=512m", "--cpus=1",
        "--tmpfs=/tmp:rw,noexec,nosuid,nodev,size=64m", "--shm-size=64m",
        "--tmpfs=/workspace:rw,exec,nosuid,nodev,size=64m", "--workdir=/workspace",
        "--ulimit=nofile=1024:1024", "--ulimit=core=0", "--ipc=private",
        "--hostname=sandbox", "--log-driver=none", f"--runtime={runtime}",
        "--entrypoint=", image,
    ]


def spread(xs):
    xs = sorted(xs)
    return xs[0], statistics.median(xs), xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "codebox"))
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--language", default="python", choices=sorted(HELLO))
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    code, interpreter = HELLO[args.language]
    server_args = ["serve"]
    for s in args.set:
        server_args = ["--set", s] + server_args
    env = dict(os.environ, CODEBOX_LANGUAGES=os.path.join(ROOT, "languages.toml"))
    params = StdioServerParameters(command=args.binary, args=server_args, env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            langs = (await session.call_tool("list_supported_languages", {})).structured_content
            entry = next(l for l in langs["languages"] if l["language"] == args.language)
            runtime = next(
                (s.split("=", 1)[1] for s in args.set if s.startswith("sandbox.runtime=")), "runc"
            )
            docker = docker_flags(entry["image"], runtime) + interpreter

            async def mcp_once():
                t = time.perf_counter()
                r = await session.call_tool("run_code", {"language": args.language, "code": code})
                took = (time.perf_counter() - t) * 1000
                report = r.structured_content
                assert report["status"] == "succeeded", json.dumps(report)[:500]
                return took

            def docker_once():
                t = time.perf_counter()
                out = subprocess.run(docker, input=code.encode(), capture_output=True)
                took = (time.perf_counter() - t) * 1000
                assert out.stdout == b"hello\n", out
                return took

            # One of each first: images in the page cache, the pool filled.
            await mcp_once()
            docker_once()
            await asyncio.sleep(2)
            ours, theirs = [], []
            for _ in range(args.n):
                ours.append(await mcp_once())
                theirs.append(docker_once())
                # Let the pool refill, as it would between an agent's calls.
                await asyncio.sleep(1.0)
    o, d = spread(ours), spread(theirs)
    print(f"{args.language} hello, run_code over MCP (stdio, official SDK) vs docker run --rm, "
          f"runtime {runtime}, n={args.n} alternating")
    print(f"  codebox min/med/p95 ms {o[0]:.0f} / {o[1]:.0f} / {o[2]:.0f}")
    print(f"  docker  min/med/p95 ms {d[0]:.0f} / {d[1]:.0f} / {d[2]:.0f}")
    print(f"  ratio {o[1] / d[1]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
