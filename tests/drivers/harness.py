"""Speaks the driver protocol (docs/sandbox-init.md, "The driver protocol") to a session
driver running in a locked-down container of its language's image, as codebox-init would.

The driver's fds 3 and 4 (requests, replies) and 1 and 2 (what cells print) are FIFOs in a
folder of the host bind-mounted at /drv: one kernel, so they are pipes on both sides. A small
launcher in the container starts the driver as a process-group leader with those fds, fd 0
on /dev/null, the working directory /workspace and $CODEBOX_CELL_STDIN (/drv/stdin, written
by the harness before each cell), and records its pid and exit status. SIGINT is sent with
`docker exec`: as codebox-init sends it (the cell's other processes killed first, then SIGINT
to the driver alone), to the driver's process group (as a terminal's Ctrl-C), or to the
driver alone.

Nothing here asserts timing: a reply has a generous deadline only so that a hung driver fails
the test instead of hanging it.
"""
import os
import select
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL_DIR = "/usr/local/lib/codebox/"
REPLY_DEADLINE = 120.0  # seconds; only so that a hung driver fails instead of hanging
LAUNCHER = r"""
set -m
date +%s%N >/drv/started
"$@" 0</dev/null 3</drv/req 4>/drv/rep 1>/drv/out 2>/drv/err &
echo $! >/drv/pid
wait $!
echo $? >/drv/status
"""


class ProtocolError(Exception):
    pass


class Reply:
    """What the driver answered to one cell."""

    def __init__(self):
        self.compiled = False
        self.syntax = None  # the message of a `syntax` reply (bytes)
        self.result = None  # the text of a `result` reply (bytes)
        self.done = None  # "ok", "error", "error 3", "interrupted"
        self.stdout = b""
        self.stderr = b""

    def __repr__(self):
        return (f"Reply(compiled={self.compiled}, syntax={self.syntax!r}, done={self.done!r}, "
                f"result={self.result!r}, stdout={self.stdout[:2000]!r}, "
                f"stderr={self.stderr[:2000]!r})")


def registry():
    with open(ROOT / "languages.toml", "rb") as f:
        return tomllib.load(f)


class Driver:
    """One driver in one container. `from_checkout`: bind-mount the image folder's driver over
    the installed one (to try a change without rebuilding the image)."""

    count = 0

    def __init__(self, language, from_checkout=False, argv=None):
        reg = registry()
        entry = reg["languages"][language]
        image = reg["images"][entry["image"]]
        self.argv = argv or entry["session"]["driver"]
        self.dir = Path(tempfile.mkdtemp(prefix="codebox-driver-test-"))
        self.dir.chmod(0o777)  # the launcher (uid 10001) writes its pid and status here
        for name in ("req", "rep", "out", "err"):
            os.mkfifo(self.dir / name)
            (self.dir / name).chmod(0o666)
        (self.dir / "stdin").write_bytes(b"")
        (self.dir / "stdin").chmod(0o644)
        # The harness's ends: none of these opens waits for the container.
        self.req = os.open(self.dir / "req", os.O_RDWR)
        self.rep = os.open(self.dir / "rep", os.O_RDONLY | os.O_NONBLOCK)
        self.out = os.open(self.dir / "out", os.O_RDONLY | os.O_NONBLOCK)
        self.err = os.open(self.dir / "err", os.O_RDONLY | os.O_NONBLOCK)
        Driver.count += 1
        self.name = f"codebox-driver-test-{os.getpid()}-{Driver.count}"
        mounts = ["-v", f"{self.dir}:/drv"]
        if from_checkout:
            for arg in self.argv:
                if arg.startswith(INSTALL_DIR):
                    source = ROOT / image["context"] / arg[len(INSTALL_DIR):]
                    mounts += ["-v", f"{source}:{arg}:ro"]
        env = []
        for key, value in entry.get("env", {}).items():
            env += ["-e", f"{key}={value}"]
        cmd = ["docker", "run", "-d", "--rm", "--name", self.name, "--network", "none",
               "--read-only", "--user", "10001:10001", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--pids-limit", "256",
               "-m", "1g", "--memory-swap", "1g",
               "--tmpfs", "/workspace:rw,exec,nosuid,nodev,size=256m,mode=1777",
               "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777",
               "-w", "/workspace", "-e", "CODEBOX_CELL_STDIN=/drv/stdin", *env, *mounts,
               image["tag"], "bash", "-c", LAUNCHER, "launcher", *self.argv]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        self.replies = b""
        self.stray = b""  # output or replies that came while no cell ran
        self.exited = False
        self.ready_ms = None
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    # ---- reading ----------------------------------------------------------------------------

    def _pump(self, timeout, reply=None):
        """Reads what is there (waiting up to `timeout`) into self.replies and `reply`'s
        stdout/stderr (or self.stray). Returns False once the replies FIFO is closed."""
        fds = [self.rep, self.out, self.err]
        ready, _, _ = select.select(fds, [], [], timeout)
        alive = True
        for fd in ready:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if fd == self.rep:
                if not data:
                    alive = False  # select saw the last writer go: EOF
                self.replies += data
            elif reply is not None:
                if fd == self.out:
                    reply.stdout += data
                else:
                    reply.stderr += data
            else:
                self.stray += data
        return alive

    def _ended(self):
        """The launcher recorded the driver's exit (also when it could not be started)."""
        return (self.dir / "status").exists() and not select.select([self.rep], [], [], 0)[0]

    def _drain_output(self, reply):
        """After `done`: what the cell printed is in the FIFOs already (the driver flushed
        before it answered), so read until they are empty."""
        while True:
            got = False
            for fd, name in ((self.out, "stdout"), (self.err, "stderr")):
                try:
                    data = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if data:
                    got = True
                    setattr(reply, name, getattr(reply, name) + data)
            if not got:
                return

    def _take_line(self, reply, deadline):
        while b"\n" not in self.replies:
            if len(self.replies) > 256:
                raise ProtocolError(f"a reply line over 256 bytes: {self.replies[:300]!r}")
            if time.monotonic() > deadline:
                raise ProtocolError(f"no reply in time; so far {self.replies!r}, {reply!r}")
            if not self._pump(0.05, reply) and b"\n" not in self.replies or self._ended():
                self.exited = True
                raise DriverExited(reply)
        line, _, self.replies = self.replies.partition(b"\n")
        return line.decode("ascii")

    def _take_bytes(self, n, reply, deadline):
        while len(self.replies) < n:
            if time.monotonic() > deadline:
                raise ProtocolError("a reply's content did not come in time")
            if not self._pump(0.05, reply) or self._ended():
                self.exited = True
                raise DriverExited(reply)
        data, self.replies = self.replies[:n], self.replies[n:]
        return data

    def wait_ready(self):
        deadline = time.monotonic() + REPLY_DEADLINE
        try:
            line = self._take_line(None, deadline)
        except DriverExited as e:
            raise DriverExited(f"before `ready`; it printed {self.stray!r}") from e
        now = time.time_ns()
        if line != "ready":
            raise ProtocolError(f"expected `ready`, got {line!r}")
        started = (self.dir / "started").read_text().strip()
        self.ready_ms = (now - int(started)) / 1e6

    def pid(self):
        return int((self.dir / "pid").read_text())

    # ---- cells ------------------------------------------------------------------------------

    def cell(self, code, stdin=b"", interrupt_after=None, how="init", number=None,
             once_running=None):
        """Sends one cell and returns the Reply. interrupt_after: seconds after `compiled`
        at which the cell is interrupted (`how`: see interrupt()); once_running: and not
        before a process of that name runs in the container (on a loaded machine the cell may
        not have started it yet, and a SIGINT that comes first is not what is tested)."""
        if isinstance(code, str):
            code = code.encode()
        if isinstance(stdin, str):
            stdin = stdin.encode()
        while select.select([self.rep, self.out, self.err], [], [], 0)[0]:
            if not self._pump(0):  # between cells: output is stray, replies are an error
                break
        if self.replies:
            raise ProtocolError(f"the driver wrote to fd 4 while no cell ran: {self.replies!r}")
        (self.dir / "stdin").write_bytes(stdin)
        self.number = number if number is not None else getattr(self, "number", 0) + 1
        os.write(self.req, b"cell %d %d\n" % (self.number, len(code)))
        view = memoryview(code)
        reply = Reply()
        while view:  # a large cell does not fit the FIFO: keep reading while writing
            _, writable, _ = select.select([], [self.req], [], 0.05)
            if writable:
                view = view[os.write(self.req, view[:65536]):]
            self._pump(0, reply)
        deadline = time.monotonic() + REPLY_DEADLINE
        line = self._take_line(reply, deadline)
        if line.startswith("syntax "):
            reply.syntax = self._take_bytes(int(line[7:]), reply, deadline)
            self._drain_output(reply)
            return reply
        if line != "compiled":
            raise ProtocolError(f"expected `compiled` or `syntax`, got {line!r}")
        reply.compiled = True
        if interrupt_after is not None:
            at = time.monotonic() + interrupt_after
            while time.monotonic() < at and self._pump(at - time.monotonic(), reply):
                pass
            until = time.monotonic() + 60
            while once_running and not self.running(once_running) and time.monotonic() < until:
                self._pump(0.2, reply)
            self.interrupt(how)
        line = self._take_line(reply, deadline)
        if line.startswith("result "):
            reply.result = self._take_bytes(int(line[7:]), reply, deadline)
            line = self._take_line(reply, deadline)
        if not line.startswith("done "):
            raise ProtocolError(f"expected `done`, got {line!r}")
        reply.done = line[5:]
        self._drain_output(reply)
        return reply

    def running(self, comm):
        """Whether a process named `comm` runs in the container."""
        script = (f'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = {comm} ] '
                  f'&& echo yes && break; done; true')
        return self.exec("bash", "-c", script).strip() == b"yes"

    def interrupt(self, how="init"):
        """SIGINT to the driver: "init" as codebox-init does it (every process of the container
        but the launcher and the driver killed first), "group" to its process group (as a
        terminal's Ctrl-C), "driver" to it alone."""
        pid = self.pid()
        script = {
            "init": f"for p in /proc/[0-9]*; do p=${{p#/proc/}}; case $p in 1|{pid}|$$) ;; "
                    f"*) kill -KILL $p 2>/dev/null;; esac; done; kill -INT {pid}",
            "group": f"kill -INT -- -{pid}",
            "driver": f"kill -INT {pid}",
        }[how]
        self.exec("bash", "-c", script)

    def exec(self, *argv):
        """Runs a command in the container (not in the driver) and returns its stdout. Once
        more when docker could not start it (exit 125 or 126: a loaded daemon's runc may)."""
        for attempt in range(3):
            done = subprocess.run(["docker", "exec", "-u", "10001:10001", self.name, *argv],
                                  capture_output=True)
            if done.returncode not in (125, 126) or attempt == 2:
                break
            time.sleep(0.5)
        if done.returncode != 0:
            raise RuntimeError(f"docker exec {argv}: exit {done.returncode}: "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")
        return done.stdout

    def close_requests(self):
        """Closes fd 3's other end, as codebox-init ending the session; returns the exit
        status of the driver (None if it did not exit in time)."""
        os.close(self.req)
        self.req = None
        deadline = time.monotonic() + REPLY_DEADLINE
        while self._pump(0.05) and time.monotonic() < deadline:
            pass
        return self.exit_status()

    def exit_status(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = self.dir / "status"
            if status.exists() and status.read_text().strip():
                return int(status.read_text())
            time.sleep(0.05)
        return None

    def close(self):
        subprocess.run(["docker", "rm", "-f", self.name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        for fd in (self.req, self.rep, self.out, self.err):
            if fd is not None:
                os.close(fd)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DriverExited(Exception):
    def __init__(self, reply):
        super().__init__(f"the driver closed fd 4: {reply!r}" if not isinstance(reply, str)
                         else f"the driver closed fd 4 {reply}")
        self.reply = reply
