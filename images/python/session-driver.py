"""codebox's session driver for Python: one interpreter whose state lasts across the cells of
a session. The protocol (docs/sandbox-init.md, "The driver protocol"):

    fd 3  <- cell <execution number> <code length>\\n<code>
    fd 4  -> ready\\n                                   (once, at start)
             syntax <length>\\n<message>                (the cell does not parse; nothing ran)
             compiled\\n [result <length>\\n<text>] done ok|error [code]|interrupted\\n

A cell runs as IPython runs one: in a persistent `__main__` namespace; a final expression
statement is evaluated apart and its repr() is the result (none for None); top-level `await`
works. What the cell prints goes straight to fds 1 and 2 (C extensions and subprocesses
included); its fd 0 is $CODEBOX_CELL_STDIN. matplotlib figures left open are saved as
outputs/figure-<execution>-<n>.png and closed, as Jupyter's inline backend shows and closes
them. SIGINT interrupts a cell (KeyboardInterrupt) and is ignored between cells.
`sys.exit(n)` and `exit()` end the cell, not the interpreter: `done error n`, state kept.

Start-up time matters: import nothing heavy here; what a cell needs is imported when needed.
"""
import ast
import os
import signal
import sys

REQUESTS, REPLIES = 3, 4
WORKDIR = os.getcwd()


class State:
    pid = os.getpid()  # a child a cell forked must not answer for the driver
    in_cell = False  # SIGINT interrupts only while a cell runs
    loop = None  # the asyncio event loop of top-level await, made on first use
    libc = None  # for fflush(NULL): C extensions print through C's stdio buffers


def on_sigint(signum, frame):
    if State.in_cell:
        raise KeyboardInterrupt


# ---- the protocol's framing ---------------------------------------------------------------

class Requests:
    """Reads `cell <n> <length>\\n<code>` requests from fd 3."""

    def __init__(self):
        self.buffer = b""

    def _more(self):
        chunk = os.read(REQUESTS, 1 << 16)
        if not chunk:
            sys.exit(0)  # codebox-init closed the requests: the session is over
        self.buffer += chunk

    def next(self):
        while b"\n" not in self.buffer:
            if len(self.buffer) > 64:
                fail("a request header longer than 64 bytes")
            self._more()
        header, _, self.buffer = self.buffer.partition(b"\n")
        word, number, length = (header.split(b" ") + [b"", b""])[:3]
        if word != b"cell" or not number.isdigit() or not length.isdigit():
            fail(f"a request that is not `cell <n> <length>`: {header[:64]!r}")
        length = int(length)
        while len(self.buffer) < length:
            self._more()
        code, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(number), code


def reply(data):
    view = memoryview(data)
    while view:
        view = view[os.write(REPLIES, view):]


def reply_text(word, text):
    data = text.encode("utf-8", "backslashreplace")
    reply(b"%s %d\n%s" % (word, len(data), data))


def fail(why):
    os.write(2, f"codebox python driver: {why}\n".encode())
    sys.exit(70)


# ---- one cell -----------------------------------------------------------------------------

def compile_cell(code, filename):
    """The cell's body and its final expression (or None), compiled; SyntaxError if not."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        last = compile(last, filename, "eval", flags)
    return compile(tree, filename, "exec", flags), last


def syntax_message(error, code):
    """As Python prints it; errors of the compiler (not the parser) get their line too."""
    import traceback

    if isinstance(error, SyntaxError) and error.text is None and error.lineno:
        lines = code.decode("utf-8", "replace").splitlines()
        if 0 < error.lineno <= len(lines):
            error.text = lines[error.lineno - 1]
    return "".join(traceback.format_exception_only(type(error), error))


def remember_source(filename, code):
    """Tracebacks and inspect.getsource() show the lines of cells, as in IPython."""
    import linecache

    lines = code.decode("utf-8", "replace").splitlines(True)
    linecache.cache[filename] = (len(code), None, lines, filename)


def run(code_object, namespace):
    value = eval(code_object, namespace)
    if code_object.co_flags & 0x80:  # CO_COROUTINE: the cell awaits at top level
        if State.loop is None:
            import asyncio

            State.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(State.loop)
        value = State.loop.run_until_complete(value)
    return value


def execute(body, last, namespace):
    """Runs the cell: ("ok" | "error" | "error <code>", result text or None)."""
    try:
        run(body, namespace)
        value = run(last, namespace) if last else None
        return "ok", None if value is None else repr(value)
    except SystemExit as e:
        return exit_status(e.code), None
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        print_exception(e)
        return "error", None


def exit_status(code):
    """`sys.exit(code)` as a script's exit status, message printed as Python would."""
    if code is None:
        return "ok"
    if isinstance(code, int):
        status = code & 0xFF  # what a process exiting with it would report
        return "ok" if status == 0 else f"error {status}"
    print(code, file=sys.stderr)
    return "error 1"


def print_exception(error):
    """The traceback as Python prints it, without this driver's frames."""
    import traceback

    tb = None  # the traceback rebuilt without this file's frames (the SIGINT handler's too)
    frames = []
    entry = error.__traceback__
    while entry is not None:
        if entry.tb_frame.f_code.co_filename != __file__:
            frames.append(entry)
        entry = entry.tb_next
    for entry in reversed(frames):
        tb = type(entry)(tb, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    try:
        traceback.print_exception(type(error), error, tb, file=sys.stderr)
    except Exception:  # sys.stderr replaced by something that cannot be written
        text = "".join(traceback.format_exception(type(error), error, tb))
        os.write(2, text.encode("utf-8", "backslashreplace"))


def save_figures(execution):
    """Figures still open, as outputs/figure-<execution>-<n>.png, then closed (Jupyter's
    inline backend). Only when the cells imported pyplot: this never imports matplotlib."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not plt.get_fignums():
        return "ok"
    status = "ok"
    folder = os.path.join(WORKDIR, "outputs")
    for n, number in enumerate(plt.get_fignums(), 1):
        path = os.path.join(folder, f"figure-{execution}-{n}.png")
        try:
            os.makedirs(folder, exist_ok=True)
            plt.figure(number).savefig(path, format="png", bbox_inches="tight")
        except Exception as e:
            print(f"codebox: figure {number} could not be saved as {path}: {e}", file=sys.stderr)
            status = "error"
    plt.close("all")
    return status


def set_stdin(path):
    """fd 0 and sys.stdin on `path` (the cell's stdin), or on /dev/null."""
    try:
        fd = os.open(path or os.devnull, os.O_RDONLY)
    except OSError:
        fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = open(0, "r", closefd=False, encoding="utf-8", errors="surrogateescape")


def flush_output():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    if State.libc is None:
        import ctypes

        State.libc = ctypes.CDLL(None)
    State.libc.fflush(None)


def cell(execution, code, namespace):
    """Answers one request: syntax, or compiled ... done."""
    filename = f"<cell {execution}>"
    try:
        body, last = compile_cell(code, filename)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        reply_text(b"syntax", syntax_message(e, code))
        return
    remember_source(filename, code)
    reply(b"compiled\n")
    State.in_cell = True
    try:
        try:
            set_stdin(os.environ.get("CODEBOX_CELL_STDIN"))
            status, result = execute(body, last, namespace)
            if os.getpid() != State.pid:  # os.fork() in the cell, and the child came back here
                flush_output()
                os._exit(0 if status == "ok" else 1)
            if save_figures(execution) != "ok" and status == "ok":
                status, result = "error", None
        except KeyboardInterrupt as e:
            print_exception(e)
            status, result = "interrupted", None
        finally:
            State.in_cell = False
    except KeyboardInterrupt:  # a second SIGINT in the handler above
        status, result = "interrupted", None
    set_stdin(None)
    flush_output()
    if result is not None:
        reply_text(b"result", result)
    reply(b"done %s\n" % status.encode())


def main():
    signal.signal(signal.SIGINT, on_sigint)
    os.set_inheritable(REQUESTS, False)  # the cell's subprocesses get neither
    os.set_inheritable(REPLIES, False)
    main_module = type(sys)("__main__")  # pickle finds the cells' classes in __main__
    namespace = main_module.__dict__
    namespace["__builtins__"] = __builtins__
    sys.modules["__main__"] = main_module
    sys.argv = [""]
    sys.path[0] = ""  # imports find the working directory's modules, as in the REPL
    requests = Requests()
    reply(b"ready\n")
    while True:
        execution, code = requests.next()
        cell(execution, code, namespace)


if __name__ == "__main__":
    main()
