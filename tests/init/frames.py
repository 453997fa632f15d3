#!/usr/bin/env python3
"""Payloads and frames of codebox-init (docs/sandbox-init.md), for tests/init/check.sh.

A case is a text file in two parts separated by a line `---`:

  * the payload, as Python assignments: run, check (argv lists), env (list of "K=V"),
    check_in_run, timeout_ms, check_timeout_ms, output_limit, collect, max_files, max_bytes,
    max_file_bytes, dirs [(mode, path)], files [(mode, path, content)], links
    [(path, target)], records [(name, bytes)] (raw records after those), stdin (bytes or
    str), raw (the whole payload, bytes: overrides everything else);
  * the checks, Python statements (`assert ...`) run on the decoded frames with the name
    `res`: res.rc, res.elapsed, res.check and res.run (phases or None; .end, .code, .signal,
    .error, .stdout, .stderr, .cpu_ms, .peak_kb, ...), res.entries (F entries in order),
    res.files (path -> entry; .kind, .mode, .size, .sha256, .reason, .target, .content),
    res.warnings, res.fatal (the `!` text or None), res.docker_stderr (what the container
    wrote on its stderr, e.g. strace's lines; "" when not given).

Whatever the case, `verify` also checks that the frames follow the protocol: O, E and X only
inside a phase, B frames adding up to their F entry's size and matching its sha256, chunks of
at most 64 KiB, at most output_limit bytes framed per stream, and Z with exit code 0 or `!`
with 125 as the last frame.

A session case (docs/sandbox-init.md, "Session mode") is a Python script run against a live
container: `s` is a Session on the container's stdin and stdout. s.open(driver=..., env=,
files=, dirs=, links=, timeout_ms=) sends the opening payload; s.exec(cell= or run=/check=,
stdin=, files=, ..., reset=, interrupt_ms=, records=[(name, bytes)]) and s.read(path, offset=,
max_bytes=) send requests; s.request(raw) sends raw bytes. Each returns an Answer: the frames up
to D (or `!`), checked against the protocol: .check, .run (phases as above), .result (R bytes
or None), .entries, .files, .content (a read's B bytes), .d (the D keys), .state, .reason,
.error, .warnings, .fatal, .elapsed. s.signal("TERM") sends a signal to the container from
outside (docker kill), s.docker_exec(...) runs a command in it; DRIVER is the test driver's
argv (tests/init/driver.py).

Usage:
  frames.py payload CASE > payload
  frames.py verify CASE FRAMES EXIT_CODE ELAPSED_SECONDS [STDERR]
      (silent if the case passes; else prints why and exits 1)
  frames.py session CASE CONTAINER DOCKER-RUN-ARGV...
      (runs the container and the session case; silent if it passes)
"""
import hashlib
import os
import select
import subprocess
import sys
import time
import traceback

MAX_CHUNK = 65536


class Bad(Exception):
    pass


def split_case(path):
    text = open(path, encoding="utf-8").read()
    payload, sep, checks = text.partition("\n---\n")
    if not sep:
        raise SystemExit(f"{path}: no `---` line between the payload and the checks")
    return payload, checks, payload.count("\n") + 3


def spec_of(path):
    payload, _, _ = split_case(path)
    spec = {}
    exec(compile(payload, path, "exec"), {}, spec)
    return spec


def record(name, value):
    if isinstance(value, str):
        value = value.encode()
    return b"%s %d\n" % (name.encode(), len(value)) + value


def build_payload(spec):
    if "raw" in spec:
        return spec["raw"]
    out = [b"codebox-init 1\n"]
    for kv in spec.get("env", []):
        out.append(record("env", kv))
    for name in ("check", "run"):
        if name in spec:
            out.append(record(name, b"".join(a.encode() + b"\0" for a in spec[name])))
    for name in ("check_in_run", "check_timeout_ms", "timeout_ms", "output_limit", "collect",
                 "max_files", "max_bytes", "max_file_bytes"):
        if name in spec:
            out.append(record(name, str(spec[name])))
    for mode, path in spec.get("dirs", []):
        out.append(record("dir", f"{mode} {path}"))
    for mode, path, content in spec.get("files", []):
        if isinstance(content, str):
            content = content.encode()
        out.append(record("file", f"{mode} {path}".encode() + b"\0" + content))
    for path, target in spec.get("links", []):
        out.append(record("link", f"{path}\0{target}"))
    for name, value in spec.get("records", []):
        out.append(record(name, value))
    out.append(b"end 0\n")
    stdin = spec.get("stdin", b"")
    out.append(stdin.encode() if isinstance(stdin, str) else stdin)
    return b"".join(out)


class Phase:
    def __init__(self, name):
        self.name, self.stdout, self.stderr, self.x = name, b"", b"", None

    def __getattr__(self, key):  # the X values: numbers as int, the rest as str
        x = self.__dict__.get("x") or {}
        if key not in x:
            return None
        value = x[key]
        return int(value) if value.lstrip("-").isdigit() else value

    def __repr__(self):
        return f"<{self.name} {self.x} stdout={self.stdout[:200]!r} stderr={self.stderr[:300]!r}>"


class Entry:
    def __init__(self, fields):
        if len(fields) != 7:
            raise Bad(f"an F frame has {len(fields)} fields, not 7: {fields!r}")
        kind, path, mode, size, sha, reason, target = (f.decode() for f in fields)
        if kind not in ("f", "d", "l"):
            raise Bad(f"F kind {kind!r}")
        self.kind, self.path, self.mode, self.size = kind, path, int(mode, 8), int(size)
        self.sha256, self.reason, self.target = sha, reason, target
        self.content = None if reason or kind != "f" else b""

    def __repr__(self):
        return (f"<{self.kind} {self.path} {oct(self.mode)} {self.size} reason={self.reason!r}"
                f" target={self.target!r}>")


class Result:
    def __init__(self, data, rc, elapsed):
        self.rc, self.elapsed = rc, elapsed
        self.check = self.run = None
        self.entries, self.files, self.warnings, self.fatal = [], {}, [], None
        self.frames = decode(data)
        self.interpret()

    def interpret(self):
        phase, entry, last = None, None, None
        for i, (kind, body) in enumerate(self.frames):
            if last in ("!", "Z"):
                raise Bad(f"a {kind} frame after {last}")
            last = kind
            if entry is not None and kind != "B" and len(entry.content) != entry.size:
                raise Bad(f"{entry.path}: {len(entry.content)} content bytes, not {entry.size}")
            if kind != "B":
                entry = None
            if kind == "P":
                if phase is not None or body not in (b"check", b"run"):
                    raise Bad(f"P {body!r} inside a phase or unknown")
                if getattr(self, body.decode()) is not None or self.entries:
                    raise Bad(f"P {body!r} out of order")
                phase = Phase(body.decode())
                setattr(self, phase.name, phase)
            elif kind in "OE":
                if phase is None or len(body) == 0 or len(body) > MAX_CHUNK:
                    raise Bad(f"{kind} frame outside a phase, empty or over 64 KiB")
                if kind == "O":
                    phase.stdout += body
                else:
                    phase.stderr += body
            elif kind == "X":
                if phase is None:
                    raise Bad("X outside a phase")
                text = body.decode()
                if not text.endswith("\n"):
                    raise Bad(f"X does not end with a newline: {text!r}")
                phase.x = dict(line.split("=", 1) for line in text.splitlines())
                if phase.x.get("phase") != phase.name:
                    raise Bad(f"X for {phase.x.get('phase')} inside {phase.name}")
                phase = None
            elif kind == "F":
                if phase is not None:
                    raise Bad("F inside a phase")
                entry = Entry(body.split(b"\0"))
                if entry.path in self.files:
                    raise Bad(f"{entry.path} listed twice")
                self.entries.append(entry)
                self.files[entry.path] = entry
                if entry.content is None:
                    entry = None
            elif kind == "B":
                if entry is None or len(body) == 0 or len(body) > MAX_CHUNK:
                    raise Bad("B without an F entry that has content, empty or over 64 KiB")
                entry.content += body
                if len(entry.content) > entry.size:
                    raise Bad(f"{entry.path}: more content than its size")
            elif kind == "W":
                self.warnings.append(body.decode())
            elif kind == "!":
                self.fatal = body.decode()
            elif kind != "Z":
                raise Bad(f"unknown frame kind {kind!r}")
        if phase is not None:
            raise Bad(f"phase {phase.name} has no X")
        for e in self.entries:
            if e.kind == "f" and e.content is not None:
                if hashlib.sha256(e.content).hexdigest() != e.sha256:
                    raise Bad(f"{e.path}: the content does not match sha256 {e.sha256}")
        if (last, self.rc) not in (("Z", 0), ("!", 125)):
            raise Bad(f"the last frame is {last!r} and the exit code {self.rc}")


def decode(data):
    frames, i = [], 0
    while i < len(data):
        if i + 5 > len(data):
            raise Bad(f"a truncated frame header at byte {i}")
        n = int.from_bytes(data[i + 1:i + 5], "big")
        if i + 5 + n > len(data):
            raise Bad(f"a truncated {chr(data[i])!r} frame at byte {i}")
        frames.append((chr(data[i]), data[i + 5:i + 5 + n]))
        i += 5 + n
    return frames


def verify(case, frames_path, rc, elapsed, stderr_path=None):
    spec = spec_of(case)
    _, checks, first_line = split_case(case)
    try:
        res = Result(open(frames_path, "rb").read(), rc, elapsed)
        res.docker_stderr = ""
        if stderr_path:
            res.docker_stderr = open(stderr_path, "rb").read().decode(errors="replace")
        for p in (res.check, res.run):
            limit = spec.get("output_limit", 1 << 20)
            if p and (len(p.stdout) > limit or len(p.stderr) > limit):
                raise Bad(f"{p.name}: more than output_limit bytes framed")
        code = compile("\n" * (first_line - 1) + checks, case, "exec")
        exec(code, {"res": res, "spec": spec, "hashlib": hashlib})
    except AssertionError as e:
        line = traceback.extract_tb(e.__traceback__)[-1]
        print(f"      line {line.lineno}: {line.line} {e}".rstrip())
        print(f"      {res.check!r}\n      {res.run!r}\n      fatal={res.fatal!r}"
              f" warnings={res.warnings!r} entries={res.entries[:10]!r}")
        return 1
    except Bad as e:
        print(f"      malformed frames: {e}")
        return 1
    except Exception:  # a check that could not even be evaluated
        print("      " + traceback.format_exc().replace("\n", "\n      ").rstrip())
        return 1
    return 0


DRIVER = ["python3", "/usr/local/lib/codebox-test/driver.py"]
ANSWER_TIMEOUT = 60


class Answer:
    """The frames of one answer, up to D or `!`, checked against the protocol."""

    def __init__(self, frames, elapsed, read=False):
        self.frames, self.elapsed = frames, elapsed
        self.check = self.run = self.result = self.fatal = self.d = None
        self.entries, self.files, self.warnings, self.content = [], {}, [], b""
        phase, entry, owed, last = None, None, 0, None
        for kind, body in frames:
            if last in ("!", "D"):
                raise Bad(f"a {kind} frame after {last}")
            last = kind
            if owed and kind != "B":
                raise Bad(f"{entry.path}: {owed} content bytes missing")
            if kind in "OEB" and (len(body) == 0 or len(body) > MAX_CHUNK):
                raise Bad(f"an empty {kind} frame or one over 64 KiB")
            if kind == "R" and len(body) > 1 << 20:
                raise Bad("an R frame over 1 MiB")
            if kind == "P":
                if phase is not None or body not in (b"check", b"run"):
                    raise Bad(f"P {body!r} inside a phase or unknown")
                if getattr(self, body.decode()) is not None or self.entries or self.result:
                    raise Bad(f"P {body!r} out of order")
                if body == b"check" and self.run is not None:
                    raise Bad("P check after the run phase")
                phase = Phase(body.decode())
                setattr(self, phase.name, phase)
            elif kind in "OE":
                if phase is None:
                    raise Bad(f"{kind} outside a phase")
                if kind == "O":
                    phase.stdout += body
                else:
                    phase.stderr += body
            elif kind == "X":
                if phase is None:
                    raise Bad("X outside a phase")
                text = body.decode()
                if not text.endswith("\n"):
                    raise Bad(f"X does not end with a newline: {text!r}")
                phase.x = dict(line.split("=", 1) for line in text.splitlines())
                if phase.x.get("phase") != phase.name:
                    raise Bad(f"X for {phase.x.get('phase')} inside {phase.name}")
                phase = None
            elif kind == "R":
                if phase is not None or self.run is None or self.entries or self.result:
                    raise Bad("R inside a phase, without a run phase, after files or twice")
                self.result = body
            elif kind == "F":
                if phase is not None:
                    raise Bad("F inside a phase")
                entry = Entry(body.split(b"\0"))
                if entry.path in self.files:
                    raise Bad(f"{entry.path} listed twice")
                self.entries.append(entry)
                self.files[entry.path] = entry
                if entry.content is not None and not read:
                    owed = entry.size
                if read and entry.reason.startswith("range "):
                    entry.content, owed = b"", int(entry.reason[6:])
            elif kind == "B":
                if not self.entries or owed < len(body):
                    raise Bad("B without an F entry that has content, or more than announced")
                entry.content += body
                owed -= len(body)
                if read:
                    self.content += body
            elif kind == "W":
                self.warnings.append(body.decode())
            elif kind == "!":
                self.fatal = body.decode()
            elif kind == "D":
                text = body.decode()
                if phase is not None:
                    raise Bad("D inside a phase")
                if text and not text.endswith("\n"):
                    raise Bad(f"D does not end with a newline: {text!r}")
                self.d = dict(line.split("=", 1) for line in text.splitlines())
            else:
                raise Bad(f"unknown frame kind {kind!r} in a session")
        if last not in ("D", "!"):
            raise Bad(f"the answer ended with {last!r}, not D or !")
        for e in self.entries:
            if not read and e.kind == "f" and e.content is not None:
                if hashlib.sha256(e.content).hexdigest() != e.sha256:
                    raise Bad(f"{e.path}: the content does not match sha256 {e.sha256}")

    def __getattr__(self, key):  # D keys: numbers as int
        d = self.__dict__.get("d") or {}
        if key not in ("state", "reason", "error", "result_bytes", "workspace_bytes"):
            raise AttributeError(key)
        value = d.get(key)
        return int(value) if value is not None and value.lstrip("-").isdigit() else value

    def __repr__(self):
        return (f"<answer D={self.d} fatal={self.fatal!r} check={self.check!r} run={self.run!r}"
                f" result={self.result!r} entries={self.entries[:10]!r}"
                f" warnings={self.warnings!r}>")


class Session:
    """A container running codebox-init in session mode, driven over its stdin and stdout."""

    def __init__(self, container, argv, stderr_path=os.devnull):
        self.container = container
        self.err = open(stderr_path, "wb")
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err)
        self.buf = b""

    def send(self, data):
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def answer(self, read=False, timeout=ANSWER_TIMEOUT, start=None):
        start = start or time.monotonic()
        frames, fd = [], self.p.stdout.fileno()
        while True:
            while len(self.buf) >= 5:
                n = int.from_bytes(self.buf[1:5], "big")
                if len(self.buf) < 5 + n:
                    break
                kind, body = chr(self.buf[0]), self.buf[5:5 + n]
                self.buf = self.buf[5 + n:]
                frames.append((kind, body))
                if kind in "D!":
                    return Answer(frames, time.monotonic() - start, read)
            left = start + timeout - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Bad(f"no D after {timeout} s; frames so far: {frames[:20]!r}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise Bad(f"the container's stdout ended; frames so far: {frames[:20]!r}")
            self.buf += chunk

    def request(self, data, read=False, timeout=ANSWER_TIMEOUT):
        start = time.monotonic()
        self.send(data)
        return self.answer(read, timeout, start)

    def open(self, driver=None, env=(), files=(), dirs=(), links=(), timeout_ms=None,
             records=(), timeout=ANSWER_TIMEOUT):
        out = [b"codebox-init 1\n", record("session", b"".join(a.encode() + b"\0"
                                                                for a in (driver or [])))]
        out += [record("env", kv) for kv in env]
        out += [record("dir", f"{m} {p}") for m, p in dirs]
        out += [record("file", f"{m} {p}".encode() + b"\0" + as_bytes(c)) for m, p, c in files]
        out += [record("link", f"{p}\0{t}") for p, t in links]
        if timeout_ms is not None:
            out.append(record("timeout_ms", str(timeout_ms)))
        out += [record(n, v) for n, v in records]
        return self.request(b"".join(out) + b"end 0\n", timeout=timeout)

    def exec(self, timeout=ANSWER_TIMEOUT, **request):
        return self.request(self.exec_request(**request), timeout=timeout)

    @staticmethod
    def exec_request(cell=None, run=None, check=None, stdin=None, env=(), files=(), dirs=(),
                     links=(), records=(), **numbers):
        """The bytes of an exec request (send them with s.send, then read s.answer())."""
        out = [b"exec 0\n"]
        out += [record("env", kv) for kv in env]
        out += [record("dir", f"{m} {p}") for m, p in dirs]
        out += [record("file", f"{m} {p}".encode() + b"\0" + as_bytes(c)) for m, p, c in files]
        out += [record("link", f"{p}\0{t}") for p, t in links]
        for name, argv in (("check", check), ("run", run)):
            if argv is not None:
                out.append(record(name, b"".join(a.encode() + b"\0" for a in argv)))
        if cell is not None:
            out.append(record("cell", cell))
        if stdin is not None:
            out.append(record("stdin", stdin))
        for name, value in numbers.items():  # timeout_ms, output_limit, collect, reset, ...
            out.append(record(name, str(value)))
        out += [record(n, v) for n, v in records]
        return b"".join(out) + b"end 0\n"

    def read(self, path, offset=None, max_bytes=None, timeout=ANSWER_TIMEOUT):
        out = [b"read 0\n", record("path", path)]
        if offset is not None:
            out.append(record("offset", str(offset)))
        if max_bytes is not None:
            out.append(record("max_bytes", str(max_bytes)))
        return self.request(b"".join(out) + b"end 0\n", read=True, timeout=timeout)

    def signal(self, name):
        subprocess.run(["docker", "kill", "--signal", name, self.container], check=True,
                       stdout=subprocess.DEVNULL)

    def docker_exec(self, *argv):
        return subprocess.run(["docker", "exec", self.container, *argv], capture_output=True)

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.err.close()
        return self.p.returncode


def as_bytes(v):
    return v.encode() if isinstance(v, str) else v


def session(case, container, argv):
    text = open(case, encoding="utf-8").read()
    stderr_path = case + ".stderr"
    s = Session(container, argv, stderr_path)
    env = {"s": s, "DRIVER": DRIVER, "hashlib": hashlib, "time": time, "Bad": Bad}
    passed = False
    try:
        exec(compile(text, case, "exec"), env)
        passed = True
    except AssertionError as e:
        line = traceback.extract_tb(e.__traceback__)[-1]
        print(f"      line {line.lineno}: {line.line} {e}".rstrip()[:3000])
        return 1
    except Bad as e:
        print(f"      malformed frames: {e}"[:3000])
        return 1
    except Exception:
        print(("      " + traceback.format_exc().replace("\n", "\n      ").rstrip())[-3000:])
        return 1
    finally:
        s.close()
        err = open(stderr_path, "rb").read().decode(errors="replace")
        if err and not passed:
            print("      docker: " + err[-2000:].replace("\n", "\n      docker: "))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "payload":
        sys.stdout.buffer.write(build_payload(spec_of(argv[2])))
        return 0
    if len(argv) in (6, 7) and argv[1] == "verify":
        return verify(argv[2], argv[3], int(argv[4]), float(argv[5]), *argv[6:])
    if len(argv) > 4 and argv[1] == "session":
        return session(argv[2], argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
