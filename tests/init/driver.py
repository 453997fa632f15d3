"""A tiny session driver for tests/init/check.sh: docs/sandbox-init.md, "The driver protocol".

Cells are Python, run in one namespace that lasts. The value of a final expression is the
result (repr, none for None); SyntaxError is a `syntax` reply; an exception is `done error`,
SystemExit(n) is `done error n`; KeyboardInterrupt (SIGINT) is `done interrupted`. The cell's
stdin is $CODEBOX_CELL_STDIN on fd 0. Not the real Python driver: just enough of one to drive
codebox-init's session mode without depending on it.
"""
import ast
import os
import sys
import traceback

REQ, REP = 3, 4
os.set_inheritable(REQ, False)
os.set_inheritable(REP, False)


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(REQ, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def read_line():
    line = b""
    while not line.endswith(b"\n"):
        c = os.read(REQ, 1)
        if not c:
            sys.exit(0)
        line += c
    return line[:-1].decode()


def reply(data):
    os.write(REP, data)


def stdin_on(path):
    fd = os.open(path, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


namespace = {"__name__": "__main__"}
reply(b"ready\n")
while True:
    kind, number, length = read_line().split(" ")
    assert kind == "cell", kind
    code = read_exact(int(length)).decode()
    try:
        tree = ast.parse(code, f"<cell {number}>", "exec")
    except SyntaxError as e:
        msg = "".join(traceback.format_exception_only(type(e), e)).encode()
        reply(b"syntax %d\n" % len(msg) + msg)
        continue
    reply(b"compiled\n")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    result, status = None, b"done ok\n"
    stdin_on(os.environ["CODEBOX_CELL_STDIN"])
    sys.stdin = open(0, closefd=False)
    try:
        exec(compile(tree, f"<cell {number}>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, f"<cell {number}>", "eval"), namespace)
            if value is not None:
                result = repr(value).encode()
    except KeyboardInterrupt:
        traceback.print_exc()
        status = b"done interrupted\n"
    except SystemExit as e:
        status = b"done error %d\n" % (e.code if isinstance(e.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        status = b"done error\n"
    sys.stdout.flush()
    sys.stderr.flush()
    stdin_on("/dev/null")
    if result is not None:
        reply(b"result %d\n" % len(result) + result)
    reply(status)
