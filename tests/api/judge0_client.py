#!/usr/bin/env python3
"""The official Judge0 Python SDK (PyPI `judge0`, pinned in tests/api/run.sh) against
codebox's Judge0 CE compatible routes, with the server's token in `X-Auth-Token`.

For python, cpp and java: hello world, stdin, a compile error, a timeout, a runtime error
and a wrong answer (expected output given and different). Prints one line per check and
`N passed, M failed`; exits non-zero on a failure.

Usage: judge0_client.py http://127.0.0.1:PORT TOKEN
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import judge0

PROGRAMS = {
    judge0.PYTHON: {
        "hello": 'print("hello")',
        "stdin": "import sys\nprint(sys.stdin.read().upper(), end='')",
        "compile": "def broken(:\n    pass\n",
        "timeout": "while True:\n    pass\n",
        "runtime": "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)\n",
    },
    judge0.CPP: {
        "hello": '#include <iostream>\nint main() { std::cout << "hello\\n"; }\n',
        "stdin": "#include <iostream>\n#include <string>\n#include <cctype>\n"
        "int main() { std::string s; std::getline(std::cin, s); for (auto &c : s) c = std::toupper(c); "
        "std::cout << s << '\\n'; }\n",
        "compile": "int main() { return }\n",
        "timeout": "int main() { volatile unsigned long i = 0; for (;;) i++; }\n",
        "runtime": "int main() { volatile int *p = nullptr; *p = 1; }\n",
    },
    judge0.JAVA: {
        "hello": 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }\n',
        "stdin": "import java.util.Scanner;\npublic class Main { public static void main(String[] a) { "
        "System.out.println(new Scanner(System.in).nextLine().toUpperCase()); } }\n",
        "compile": "public class Main { public static void main(String[] a) { int x = } }\n",
        "timeout": "public class Main { public static void main(String[] a) { while (true) {} } }\n",
        "runtime": "public class Main { public static void main(String[] a) { throw new RuntimeException(\"bad\"); } }\n",
    },
}

# What each case must end as (Judge0 status id), per language where they differ.
EXPECTED = {
    "hello": judge0.Status.ACCEPTED,
    "stdin": judge0.Status.ACCEPTED,
    "compile": judge0.Status.COMPILATION_ERROR,
    "timeout": judge0.Status.TIME_LIMIT_EXCEEDED,
    "runtime": judge0.Status.RUNTIME_ERROR_NZEC,
    "wrong": judge0.Status.WRONG_ANSWER,
}


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, fn):
        started = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            self.failed += 1
            print(f"FAIL {name}: {e}", flush=True)
        else:
            self.passed += 1
            print(f"ok   {name} ({time.monotonic() - started:.1f} s)", flush=True)


def expect(cond, message):
    if not cond:
        raise AssertionError(message)


def case(client, language, kind):
    p = PROGRAMS[language]
    kwargs = {"language": language}
    if kind == "wrong":
        kwargs.update(source_code=p["hello"], expected_output="goodbye\n")
    else:
        kwargs["source_code"] = p[kind]
    if kind == "stdin":
        kwargs.update(stdin="shout\n", expected_output="SHOUT\n")
    if kind == "hello":
        kwargs["expected_output"] = "hello"  # Judge0 trims before comparing
    if kind == "timeout":
        kwargs["cpu_time_limit"] = 2
    else:
        kwargs["wall_time_limit"] = 60
    s = judge0.run(client=client, **kwargs)
    want = EXPECTED[kind]
    if kind == "runtime" and language == judge0.CPP:
        want = judge0.Status.RUNTIME_ERROR_SIGSEGV
    expect(s.status == want, f"status {s.status!r}, wanted {want!r}: stdout={s.stdout!r} "
           f"stderr={s.stderr!r} compile_output={s.compile_output!r} message={s.message!r}")
    if kind in ("hello", "wrong"):
        expect(s.stdout == "hello\n", f"stdout {s.stdout!r}")
    if kind == "stdin":
        expect(s.stdout == "SHOUT\n", f"stdout {s.stdout!r}")
    if kind == "compile":
        expect(s.compile_output, "no compiler output")
        expect(s.stdout is None, f"stdout {s.stdout!r} after a compile error")
    expect(s.token is not None and len(str(s.token)) == 36, f"token {s.token!r}")
    expect(s.created_at is not None and s.finished_at is not None, "timestamps")


def main():
    url, token = sys.argv[1], sys.argv[2]
    results = Results()
    client = judge0.Client(url, {"X-Auth-Token": token})

    def described():
        expect(client.version == "1.13.1", f"version {client.version}")
        expect(client.get_language_id(judge0.PYTHON) == 71, "judge0.PYTHON is not 71")
        for lang in (judge0.PYTHON, judge0.CPP, judge0.JAVA):
            expect(client.is_language_supported(lang), f"{lang!r} not supported")
        expect(client.config.max_submission_batch_size >= 2, "batch size")
        expect(len(client.get_statuses()) == 14, "statuses")

    results.check("client built: /languages, /config_info, /about", described)

    names = {judge0.PYTHON: "python", judge0.CPP: "cpp", judge0.JAVA: "java"}
    jobs = [(lang, kind) for lang in PROGRAMS for kind in EXPECTED]
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = {
            pool.submit(lambda lk: results.check(f"{names[lk[0]]}: {lk[1]}", lambda: case(client, *lk)), job): job
            for job in jobs
        }
        for f in futures:
            f.result()

    def batch():
        subs = [judge0.Submission(source_code=f"print({i} * 7)", language=judge0.PYTHON) for i in range(3)]
        done = judge0.run(client=client, submissions=subs)
        got = [s.stdout for s in done]
        expect(got == ["0\n", "7\n", "14\n"], f"batch stdout {got}")

    results.check("a batch of three (POST and GET /submissions/batch)", batch)

    def bearer_too():
        other = judge0.Client(url, {"Authorization": f"Bearer {token}"})
        expect(other.version == "1.13.1", "Authorization: Bearer is accepted too")

    results.check("Authorization: Bearer works as well as X-Auth-Token", bearer_too)

    def refused_without_token():
        try:
            judge0.Client(url, {})
        except RuntimeError:
            return
        raise AssertionError("a client without the token was built")

    results.check("no token: the SDK reports the authentication failure", refused_without_token)

    print(f"judge0: {results.passed} passed, {results.failed} failed")
    return 0 if results.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
