"""crun against runc in the guest, run by run: each round runs every case under both runtimes,
one right after the other (the order swapped every round), so that the host's load, which
drifts a lot under emulation, falls on both alike. Per case: the median and the fastest of
each runtime, and the median of the rounds' crun/runc ratios (each ratio of two runs seconds
apart). Every run must succeed; prints `ok`/`FAIL`, exits 1 on a failure.

usage: python3 runtimes.py [ROUNDS]
"""
import os
import statistics
import subprocess
import sys
import time

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runtimes = ("runc", "crun")


def codebox(lang, code):
    # `codebox run`: a cold container each time (no pool in the CLI), the whole create, start,
    # wait and remove under the runtime.
    return lambda rt: (["codebox", "run", "--json", "-l", lang, "-"], code,
                       {"CODEBOX_SANDBOX_RUNTIME": rt})


def docker(image, *argv):
    return lambda rt: (["docker", "run", "--rm", "-i", "--network", "none", "--runtime", rt,
                        image, *argv], "", {})


cases = [
    ("codebox run, bash hello (cold)", codebox("bash", "echo hello\n")),
    ("codebox run, lua hello (cold)", codebox("lua", "print('hello')\n")),
    ("docker run --rm, bash echo", docker("codebox/bash:5.2", "bash", "-c", "echo hello")),
]
times = {(name, rt): [] for name, _ in cases for rt in runtimes}
failed = 0
print(f"     load at the start: {open('/proc/loadavg').read().strip()}")
start = time.monotonic()
for i in range(rounds):
    order = runtimes if i % 2 == 0 else runtimes[::-1]
    for name, make in cases:
        for rt in order:
            argv, stdin, env = make(rt)
            t = time.monotonic()
            p = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                               env={**os.environ, **env})
            times[(name, rt)].append((time.monotonic() - t) * 1000)
            if p.returncode != 0 or "hello" not in p.stdout:
                failed += 1
                print(f"FAIL {name} under {rt}: exit {p.returncode}: {p.stdout[-400:]} {p.stderr[-400:]}")
print(f"     {rounds} rounds in {time.monotonic() - start:.0f} s; load at the end: "
      f"{open('/proc/loadavg').read().strip()}")
print("     | case | runc median (fastest) | crun median (fastest) | crun/runc, median of the rounds' ratios |")
print("     |---|---|---|---|")
for name, _ in cases:
    a, b = times[(name, "runc")], times[(name, "crun")]
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    print(f"     | {name} | {statistics.median(a):.0f} ms ({min(a):.0f}) | "
          f"{statistics.median(b):.0f} ms ({min(b):.0f}) | "
          f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}–{max(ratios):.2f}) |")
print(("ok   " if failed == 0 else "FAIL ") + f"crun and runc: {rounds} rounds of {len(cases)} cases, "
      f"{failed} run(s) failed")
sys.exit(1 if failed else 0)
