#!/usr/bin/env python3
"""Wall time of hello world through `codebox run` next to `docker run --rm` with the same
image and sandbox flags (median of N). Prints a Markdown table. Cleans up by label.

  scripts/bench.py [N] [LANG...]     (default 20 runs; python cpp)
  scripts/bench.py --languages [N]   codebox run of every language's hello sample, with its
                                     version and image size
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODEBOX = os.path.join(ROOT, "target", "release", "codebox")
LABEL = "codebox.bench=true"

SANDBOX = [
    "--network", "none", "--read-only", "--user", "10001:10001", "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges", "--pids-limit", "256", "--memory", "512m",
    "--memory-swap", "512m", "--cpus", "1", "--init", "--log-driver", "none",
    "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m", "--label", LABEL,
]


def timed(cmd, **kw):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return (time.perf_counter() - t) * 1000


def registry():
    out = subprocess.run([CODEBOX, "languages", "--json"], check=True, capture_output=True, text=True)
    return {l["language"]: l for l in json.loads(out.stdout)["languages"]}


def load_samples():
    import tomllib
    with open(os.path.join(ROOT, "languages.toml"), "rb") as f:
        return tomllib.load(f)["languages"]


def docker_two_stage(lang, spec, code):
    """The same work as codebox with the docker CLI: volume, compile (writable), run (ro)."""
    vol = subprocess.run(["docker", "volume", "create", "--label", LABEL], check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        src = spec["source_file"]
        image = lang["image"]
        compile_cmd = spec.get("compile") or ["true"]
        load = ["sh", "-c", f'cat > {src} && exec "$@"', "sh", *compile_cmd]
        subprocess.run(["docker", "run", "--rm", "-i", *SANDBOX, "-v", f"{vol}:/workspace",
                        image, *load], input=code.encode(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["docker", "run", "--rm", *SANDBOX, "-v", f"{vol}:/workspace:ro",
                        image, *spec["run"]], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", vol], stdout=subprocess.DEVNULL)


def languages_table(n):
    reg, samples = registry(), load_samples()
    sizes = {}
    out = subprocess.run([CODEBOX, "images", "list", "--json"], check=True, capture_output=True, text=True)
    for image in json.loads(out.stdout):
        sizes[image["tag"]] = image["size_bytes"]
    print(f"| language | version | image | image size | codebox run hello (median of {n}) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, spec in samples.items():
            code = next(t["code"] for t in spec["tests"] if t["name"] == "hello")
            path = os.path.join(d, spec["source_file"])
            with open(path, "w") as f:
                f.write(code)
            times = [timed([CODEBOX, "run", path, "--language", name]) for _ in range(n)]
            tag = reg[name]["image"]
            size = sizes.get(tag) or 0
            print(f"| {name} | {reg[name]['version'] or '-'} | {tag} | {size / 1e6:.0f} MB | {statistics.median(times):.0f} ms |")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--languages":
        languages_table(int(sys.argv[2]) if len(sys.argv) > 2 else 20)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    langs = sys.argv[2:] or ["python", "cpp"]
    reg, samples = registry(), load_samples()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in langs:
            spec = samples[name]
            code = next(t["code"] for t in spec["tests"] if t["name"] == "hello")
            path = os.path.join(d, spec["source_file"])
            with open(path, "w") as f:
                f.write(code)
            cb = [timed([CODEBOX, "run", path, "--language", name]) for _ in range(n)]
            dk = []
            for _ in range(n):
                t = time.perf_counter()
                docker_two_stage(reg[name], spec, code)
                dk.append((time.perf_counter() - t) * 1000)
            row = [name, statistics.median(cb), statistics.median(dk)]
            if not spec.get("compile") or name == "python":
                one = [timed(["docker", "run", "--rm", *SANDBOX, reg[name]["image"],
                              *(["python3", "-c", code] if name == "python" else spec["run"])])
                       for _ in range(n)]
                row.append(statistics.median(one))
            else:
                row.append(None)
            rows.append(row)
    print(f"| language | codebox run (median of {n}) | docker run --rm, same two stages | docker run --rm, one container |")
    print("|---|---|---|---|")
    for name, cb, dk, one in rows:
        print(f"| {name} | {cb:.0f} ms | {dk:.0f} ms | {'-' if one is None else f'{one:.0f} ms'} |")


if __name__ == "__main__":
    try:
        main()
    finally:
        for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
            ids = subprocess.run(["docker", *kind, "--filter", f"label={LABEL}"],
                                 capture_output=True, text=True).stdout.split()
            if ids:
                rm = ["docker", "rm", "-f"] if kind[0] == "ps" else ["docker", "volume", "rm", "-f"]
                subprocess.run(rm + ids, stdout=subprocess.DEVNULL)
