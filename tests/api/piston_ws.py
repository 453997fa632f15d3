"""Piston's WebSocket /api/v2/connect with a client nobody here wrote (PyPI's `websockets`):
an interactive program that reads two lines and answers each while it runs; a signal stops a
program that would run on; a compile error ends at the compile stage; Piston's close codes.

Usage: piston_ws.py BASE_URL TOKEN   (prints `piston-ws: N passed, M failed`)
"""
import asyncio
import json
import sys

import websockets

passed = failed = 0


def check(name, fn):
    global passed, failed
    try:
        asyncio.run(asyncio.wait_for(fn(), 120))
        passed += 1
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - a failed check, whatever it raised
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def main():
    base, token = sys.argv[1], sys.argv[2]
    url = base.replace("http://", "ws://") + "/api/v2/connect"
    headers = {"Authorization": f"Bearer {token}"}

    async def recv(ws):
        return json.loads(await ws.recv())

    async def until(ws, kind, seen):
        while True:
            m = await recv(ws)
            seen.append(m)
            if m["type"] == kind:
                return m

    async def interactive():
        code = (
            "name = input()\n"
            "print(f'hello {name}', flush=True)\n"
            "n = int(input())\n"
            "print(n * 2, flush=True)\n"
        )
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "init", "language": "python", "version": "*",
                                      "files": [{"content": code}]}))
            seen = []
            runtime = await recv(ws)
            assert runtime["type"] == "runtime" and runtime["language"] == "python", runtime
            stage = await until(ws, "stage", seen)
            assert stage["stage"] == "run", stage
            await ws.send(json.dumps({"type": "data", "stream": "stdin", "data": "Ada\n"}))
            out = ""
            while "hello Ada\n" not in out:
                m = await until(ws, "data", seen)
                assert m["stream"] == "stdout", m
                out += m["data"]
            # The program answered the first line before the second was sent.
            await ws.send(json.dumps({"type": "data", "stream": "stdin", "data": "21\n"}))
            while "42\n" not in out:
                m = await until(ws, "data", seen)
                out += m["data"]
            assert out == "hello Ada\n42\n", out
            exit_ = await until(ws, "exit", seen)
            assert exit_["stage"] == "run" and exit_["code"] == 0 and exit_["signal"] is None, exit_
            try:
                await ws.recv()
                raise AssertionError("the server did not close")
            except websockets.exceptions.ConnectionClosed as closed:
                assert closed.rcvd.code == 4999, closed.rcvd

    async def signal_stops():
        code = "import time\nprint('waiting', flush=True)\ntime.sleep(300)\n"
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "init", "language": "python", "files": [{"content": code}],
                                      "run_timeout": 60000}))
            seen = []
            m = await until(ws, "data", seen)
            assert m["data"].startswith("waiting"), m
            await ws.send(json.dumps({"type": "signal", "signal": "SIGKILL"}))
            exit_ = await until(ws, "exit", seen)
            assert exit_["stage"] == "run" and exit_["signal"] == "SIGKILL" and exit_["code"] is None, exit_

    async def compile_error():
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "init", "language": "c++", "version": "*",
                                      "files": [{"name": "main.cpp", "content": "int main() { return x; }"}]}))
            seen = []
            stage = await until(ws, "stage", seen)
            assert stage["stage"] == "compile", stage
            exit_ = await until(ws, "exit", seen)
            assert exit_["stage"] == "compile" and exit_["code"] not in (0, None), exit_
            err = "".join(m["data"] for m in seen if m["type"] == "data" and m["stream"] == "stderr")
            assert "x" in err and "error" in err, seen

    async def close_codes():
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "data", "stream": "stdin", "data": "x"}))
            try:
                await ws.recv()
            except websockets.exceptions.ConnectionClosed as closed:
                assert closed.rcvd.code == 4003, closed.rcvd
        async with websockets.connect(url, additional_headers=headers) as ws:
            try:
                await ws.recv()  # no init within a second
            except websockets.exceptions.ConnectionClosed as closed:
                assert closed.rcvd.code == 4001, closed.rcvd
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "init", "language": "cobra", "files": [{"content": ""}]}))
            m = await recv(ws)
            assert m["type"] == "error" and "cobra" in m["message"], m
            try:
                await ws.recv()
            except websockets.exceptions.ConnectionClosed as closed:
                assert closed.rcvd.code == 4002, closed.rcvd

    async def refused_without_token_or_from_a_page():
        for extra in ({}, {"Origin": "http://evil.example"}):
            h = dict(extra) if extra else {}
            if extra:
                h.update(headers)
            try:
                async with websockets.connect(url, additional_headers=h):
                    raise AssertionError(f"connected with {h}")
            except websockets.exceptions.InvalidStatus as e:
                assert e.response.status_code in (401, 403), e.response.status_code

    check("an interactive program reads two lines and answers each while it runs", interactive)
    check("a signal stops a running program", signal_stops)
    check("a compile error ends at the compile stage with the compiler's output", compile_error)
    check("Piston's close codes: not initialized, no init in time, an error", close_codes)
    check("no token, or an Origin header: the upgrade is refused", refused_without_token_or_from_a_page)
    print(f"piston-ws: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
