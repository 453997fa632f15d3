#!/usr/bin/env python3
"""The session drivers through codebox-init's session mode (docs/sandbox-init.md), as a
session's container runs them: codebox-init PID 1 of a locked-down container, the host side
played by tests/init/frames.py's session client.

For each language, a throwaway image is built on its image with codebox-init compiled from
this checkout and the checkout's driver (so the test does not depend on which build of the
shared tags is there), then one session runs: state kept and results, a syntax error, an
error, a busy loop past its timeout and a sleep stopped by SIGTERM (both interrupted, the
state kept), stdin, a subprocess's output, and `exit`; python also its figures.

Usage: tests/drivers/through_init.py [LANGUAGE...]   (needs Docker and the images built)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "init"))
sys.path.insert(0, str(HERE))
import frames  # noqa: E402  (tests/init/frames.py: the session client)
from harness import INSTALL_DIR, registry  # noqa: E402
from run import CASES  # noqa: E402

DOCKERFILE = """
FROM debian:bookworm-slim AS init
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev
COPY codebox-init.h codebox-init*.c /src/
RUN gcc -std=c11 -static -O2 -Wall -Wextra -Werror -s -o /codebox-init /src/codebox-init*.c

FROM {tag}
USER root
COPY --from=init /codebox-init /usr/local/bin/codebox-init
COPY {driver} {installed}
RUN chmod 0644 {installed}
USER 10001:10001
"""
LOCKED = ["--read-only", "--network", "none", "--user", "10001:10001", "--cap-drop", "ALL",
          "--security-opt", "no-new-privileges",
          "--tmpfs", "/workspace:rw,exec,nosuid,nodev,size=256m,mode=1777",
          "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777",
          "-w", "/workspace", "-m", "1g", "--memory-swap", "1g", "--pids-limit", "256"]


def build(lang):
    """The throwaway image of `lang`: its tag."""
    reg = registry()
    entry = reg["languages"][lang]
    image = reg["images"][entry["image"]]
    installed = next(a for a in entry["session"]["driver"] if a.startswith(INSTALL_DIR))
    name = installed[len(INSTALL_DIR):]
    context = Path(tempfile.mkdtemp(prefix="codebox-driver-init-"))
    try:
        for f in (ROOT / "images" / "base").glob("codebox-init*"):
            if f.suffix in (".c", ".h"):
                shutil.copy(f, context)
        shutil.copy(ROOT / image["context"] / name, context / name)
        tag = f"codebox-driver-test-{lang}:{os.getpid()}"
        dockerfile = DOCKERFILE.format(tag=image["tag"], driver=name, installed=installed)
        built = subprocess.run(["docker", "build", "-q", "-t", tag, "-f", "-", str(context)],
                               input=dockerfile.encode(), capture_output=True)
        if built.returncode != 0:
            raise RuntimeError(f"docker build failed: {built.stderr.decode()[-3000:]}")
        return tag, entry
    finally:
        shutil.rmtree(context, ignore_errors=True)


def exec_stopped(s, cell, after):
    """Sends a cell and SIGTERM to the container `after` seconds later (a stop)."""
    start = time.monotonic()
    s.send(s.exec_request(cell=cell, timeout_ms=60000))
    time.sleep(after)
    s.signal("TERM")
    return s.answer(start=start)


def check_session(s, lang, entry):
    c = CASES[lang]
    a = s.open(driver=entry["session"]["driver"], env=[f"{k}={v}" for k, v in
                                                       entry.get("env", {}).items()],
               timeout_ms=60000)
    assert a.fatal is None and a.state == "new", a

    def expect_state():
        code, result = c["get"]
        a = s.exec(cell=code, timeout_ms=30000)
        assert a.state == "kept" and a.run.code == 0, a
        if result is None:
            assert a.run.stdout == b"42\n" and a.result is None, a
        else:
            assert a.result == result, a

    a = s.exec(cell=c["set"], timeout_ms=30000)
    assert a.state == "new" and a.check.code == 0 and a.run.end == "exited", a
    assert a.run.code == 0, a
    expect_state()

    code, message = c["syntax"]
    a = s.exec(cell=code, timeout_ms=30000)
    assert a.check.code == 1 and message in a.check.stderr and a.run is None, a
    assert a.state == "kept", a

    code, needles = c["raise"]
    a = s.exec(cell=code, timeout_ms=30000)
    assert a.run.end == "exited" and a.run.code != 0 and a.result is None, a
    assert all(n in a.run.stderr for n in needles) and a.state == "kept", a

    a = s.exec(cell=c["busy"], timeout_ms=1500)
    assert a.run.end == "timed_out" and a.state == "kept", a
    expect_state()

    a = exec_stopped(s, c["sleep"], 1.5)
    assert a.run.end == "stopped" and a.state == "kept", a
    expect_state()

    a = s.exec(cell=c["stdin"], stdin=b"abc\nrest\n", timeout_ms=30000)
    assert a.run.code == 0 and a.run.stdout == c["stdin_out"], a
    a = s.exec(cell=c["subprocess"], timeout_ms=30000)
    assert a.run.code == 0 and a.run.stdout == b"from a subprocess\n", a

    if lang == "python":
        a = s.exec(cell="import matplotlib.pyplot as plt\nplt.plot([1, 2])\nNone",
                   timeout_ms=60000, collect="outputs", execution_count=77)
        figure = a.files.get("outputs/figure-77-1.png")
        assert a.run.code == 0 and figure is not None, a
        assert figure.content.startswith(b"\x89PNG"), figure

    code, expect = c["exit"]
    a = s.exec(cell=code, timeout_ms=30000)
    if expect == "kept":
        assert a.run.code == 3 and a.state == "kept", a
        expect_state()
    else:
        assert a.run.code == expect and a.state == "reset", a
        assert a.reason == "driver_exited", a
        a = s.exec(cell=c["set"], timeout_ms=30000)
        assert a.state == "new" and a.run.code == 0, a  # the first cell of a new interpreter
        expect_state()


def main(languages):
    failed = []
    for lang in languages or list(CASES):
        tag = None
        name = f"codebox-driver-init-{os.getpid()}-{lang}"
        try:
            tag, entry = build(lang)
            s = frames.Session(name, ["docker", "run", "-i", "--rm", "--name", name, *LOCKED,
                                      tag, "/usr/local/bin/codebox-init"])
            try:
                check_session(s, lang, entry)
            finally:
                s.close()
            print(f"ok      {lang} through codebox-init", flush=True)
        except Exception:
            failed.append(lang)
            print(f"FAILED  {lang} through codebox-init\n{traceback.format_exc()}", flush=True)
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
            if tag:
                subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    print(f"{len(failed)} failed" + (": " + ", ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
