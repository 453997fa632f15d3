// npm's piston-client (pinned in tests/api/run.sh) against codebox's Piston-compatible
// /api/v2, served on loopback with --no-auth (the client sends no authorization header).
// For python, cpp and java: hello world, stdin, a compile error, a timeout and a runtime
// error. Prints one line per check and `N passed, M failed`; exits non-zero on a failure.
//
// Usage: node piston_client.mjs http://127.0.0.1:PORT
import piston from "piston-client";

const server = process.argv[2];
const client = piston({ server });

// Generous limits for the cases that must not time out: a loaded CI machine starts a JVM
// slowly. Each stays within the operator's compile limit of its language.
const roomy = { compileTimeout: 30000, runTimeout: 30000 };

const programs = {
  python: {
    hello: 'print("hello")',
    stdin: "import sys\nprint(sys.stdin.read().upper(), end='')",
    compile: "def broken(:\n    pass\n",
    timeout: "while True:\n    pass\n",
    runtime: "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)\n",
  },
  "c++": {
    hello: '#include <iostream>\nint main() { std::cout << "hello\\n"; }\n',
    stdin:
      "#include <iostream>\n#include <string>\n#include <cctype>\n" +
      "int main() { std::string s; std::getline(std::cin, s); for (auto &c : s) c = std::toupper(c); std::cout << s << '\\n'; }\n",
    compile: "int main() { return }\n",
    timeout: "int main() { volatile unsigned long i = 0; for (;;) i++; }\n",
    runtime: "#include <cstdio>\nint main() { std::fprintf(stderr, \"bad\\n\"); return 3; }\n",
  },
  java: {
    hello: 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }\n',
    stdin:
      "import java.util.Scanner;\npublic class Main { public static void main(String[] a) { " +
      "System.out.println(new Scanner(System.in).nextLine().toUpperCase()); } }\n",
    compile: "public class Main { public static void main(String[] a) { int x = } }\n",
    timeout: "public class Main { public static void main(String[] a) { while (true) {} } }\n",
    runtime:
      "public class Main { public static void main(String[] a) { System.err.println(\"bad\"); System.exit(3); } }\n",
  },
};

let passed = 0;
let failed = 0;

function expect(cond, message) {
  if (!cond) throw new Error(message);
}

async function check(name, fn) {
  const started = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok   ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.message}`);
  }
}

function show(result) {
  return JSON.stringify(result).slice(0, 600);
}

const runtimes = await client.runtimes();
await check("runtimes lists python, c++ and java with versions", async () => {
  expect(Array.isArray(runtimes), `runtimes: ${show(runtimes)}`);
  for (const language of Object.keys(programs)) {
    const rt = runtimes.find((r) => r.language === language);
    expect(rt && /^\d+\.\d+\.\d+$/.test(rt.version), `no runtime for ${language}: ${show(runtimes)}`);
  }
});

const cases = [];
for (const [language, p] of Object.entries(programs)) {
  cases.push(
    check(`${language}: hello world`, async () => {
      const r = await client.execute(language, p.hello, roomy);
      expect(r.run && r.run.stdout === "hello\n" && r.run.code === 0, show(r));
      expect(r.language === language, show(r));
    }),
    check(`${language}: stdin`, async () => {
      const r = await client.execute(language, p.stdin, { ...roomy, stdin: "shout\n" });
      expect(r.run && r.run.stdout === "SHOUT\n", show(r));
    }),
    check(`${language}: compile error`, async () => {
      const r = await client.execute(language, p.compile, roomy);
      expect(r.compile && r.compile.code !== 0 && r.compile.code !== null, show(r));
      expect(r.compile.stderr.length + r.compile.stdout.length > 0, `no compiler output: ${show(r)}`);
      expect(r.run === undefined, `run after a compile error: ${show(r)}`);
    }),
    check(`${language}: timeout`, async () => {
      const r = await client.execute(language, p.timeout, { compileTimeout: 30000, runTimeout: 2000 });
      expect(r.run && r.run.status === "TO" && r.run.signal === "SIGKILL", show(r));
      expect(r.codebox_status === "timed_out", show(r));
    }),
    check(`${language}: runtime error`, async () => {
      const r = await client.execute(language, p.runtime, roomy);
      expect(r.run && r.run.code === 3 && r.run.stderr.includes("bad"), show(r));
      expect(r.run.output.includes("bad"), show(r));
    }),
  );
}
await Promise.all(cases);

await check("an unknown language is Piston's 400 {message}", async () => {
  const r = await client.execute("cobra", "x");
  expect(typeof r.message === "string" && r.message.includes("runtime is unknown"), show(r));
});
await check("a run_timeout over the ceiling is refused, not clamped", async () => {
  const r = await client.execute("python", "print(1)", { runTimeout: 99999999 });
  expect(typeof r.message === "string" && r.message.includes("run_timeout cannot exceed"), show(r));
});

console.log(`piston-client: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
