// codebox's session driver for JavaScript: one Node.js whose global state lasts across the
// cells of a session. The protocol (docs/sandbox-init.md, "The driver protocol"):
//
//   fd 3  <- cell <execution number> <code length>\n<code>
//   fd 4  -> ready\n                                   (once, at start)
//            syntax <length>\n<message>                (the cell does not parse; nothing ran)
//            compiled\n [result <length>\n<text>] done ok|error|interrupted\n
//
// A cell runs as a browser console runs it: V8's REPL mode (the inspector's Runtime.evaluate
// with replMode), so `let`, `const` and `class` declarations are bindings of the global scope
// that a later cell sees and that a re-run cell may declare again (Node's own REPL, which
// compiles each input as a script, refuses that), and top-level `await` works. The value of
// the final expression, through util.inspect, is the result (none for undefined). `require`
// resolves from the working directory and Node's built-in modules are globals, as in Node's
// REPL; `import()` is not available in a cell (use require). SIGINT interrupts a cell: a
// running loop through vm's breakOnSigint, an `await` by abandoning it (what it awaited may
// still finish later, as in Node's REPL); between cells it is ignored. Errors thrown outside
// a cell (a timer, an unhandled rejection) are printed, never fatal. process.exit() ends the
// driver (codebox-init reports driver_exited and starts a new one).
"use strict";

const fs = require("fs");
const inspector = require("inspector");
const Module = require("module");
const net = require("net");
const path = require("path");
const util = require("util");
const vm = require("vm");

const REQUESTS = 3;
const REPLIES = 4;
const INTERRUPTED = Symbol("interrupted");
const TAKE = Symbol.for("codebox.take"); // where the inspector hands a value over
const RUN = Symbol.for("codebox.run"); // what the breakOnSigint script calls

const session = new inspector.Session();
session.connect();
let globalObject; // the inspector's id of globalThis, for take()
let current = null; // the cell being evaluated: {resolve, reject}

// ---- the protocol's framing --------------------------------------------------------------

function reply(text, data) {
  let buffer = Buffer.from(text);
  if (data !== undefined) buffer = Buffer.concat([buffer, data]);
  for (let offset = 0; offset < buffer.length; ) {
    offset += fs.writeSync(REPLIES, buffer, offset);
  }
}

function replyText(word, text) {
  const data = Buffer.from(text);
  reply(`${word} ${data.length}\n`, data);
}

function fail(why) {
  fs.writeSync(2, `codebox javascript driver: ${why}\n`);
  process.exit(70);
}

// Requests arrive in chunks: `cell <n> <length>\n` then exactly <length> bytes of code.
function requestReader(onCell) {
  let chunks = [];
  let size = 0;
  let header = null; // [number, length] once the header line is in
  const take = (n) => {
    const all = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
    chunks = all.length > n ? [all.subarray(n)] : [];
    size = all.length - n;
    return all.subarray(0, n);
  };
  return (chunk) => {
    chunks.push(chunk);
    size += chunk.length;
    for (;;) {
      if (header === null) {
        const all = Buffer.concat(chunks, size);
        chunks = [all];
        const end = all.indexOf(10);
        if (end < 0) {
          if (size > 64) fail("a request header longer than 64 bytes");
          return;
        }
        const line = take(end + 1).toString("latin1").slice(0, -1);
        const m = /^cell (\d+) (\d+)$/.exec(line);
        if (!m) fail(`a request that is not \`cell <n> <length>\`: ${JSON.stringify(line)}`);
        header = [Number(m[1]), Number(m[2])];
      }
      if (size < header[1]) return;
      const [number, length] = header;
      header = null;
      onCell(number, take(length));
    }
  };
}

// ---- one cell ----------------------------------------------------------------------------

// The message of a cell that does not compile, as Node prints a script's, or null. The check
// compiles it as a script; V8's REPL mode also accepts top-level `await`, which only an async
// function's body shows to be well-formed.
function syntaxError(source, filename) {
  try {
    new vm.Script(source, { filename });
    return null;
  } catch (e) {
    if (!/await is only valid/.test(e.message)) return withoutFrames(String(e.stack)) + "\n";
    try {
      new vm.Script(`(async () => {\n${source}\n})`, { filename, lineOffset: -1 });
      return null;
    } catch (e2) {
      const lines = source.replace(/\n+$/, "").split("\n");
      if (Number(/:(\d+)\n/.exec(e2.stack)[1]) > lines.length) { // at the wrapper's end
        return `${filename}:${lines.length}\n${lines[lines.length - 1]}\n\n` +
          "SyntaxError: Unexpected end of input\n";
      }
      return withoutFrames(String(e2.stack)) + "\n";
    }
  }
}

// A stack as text, cut where this driver's frames begin: a cell's frames come first, then
// the inspector's that ran it and this file's.
function withoutDriverFrames(text) {
  const lines = text.split("\n");
  const ours = lines.findIndex((l) => /^\s+at /.test(l) &&
    (l.includes("(node:inspector:") || l.includes(__filename)));
  return (ours < 0 ? lines : lines.slice(0, ours)).join("\n");
}

// A compile error as Node prints a script's: where, the line, the caret, the message.
function withoutFrames(text) {
  return text.split("\n").filter((l) => !/^\s+at /.test(l)).join("\n");
}

function printError(error) {
  const text = error instanceof Error ? withoutDriverFrames(util.inspect(error)) : util.inspect(error);
  process.stderr.write(`Uncaught ${text}\n`);
}

function post(method, params) {
  let failure;
  let result;
  session.post(method, params, (error, value) => {
    failure = error;
    result = value;
  });
  if (failure) throw failure;
  return result; // the methods used this way answer at once
}

// The inspector's remote object as the value itself.
function take(remote) {
  const argument = {};
  for (const key of ["value", "unserializableValue", "objectId"]) {
    if (key in remote) argument[key] = remote[key];
  }
  post("Runtime.callFunctionOn", {
    functionDeclaration: "function (v) { this[Symbol.for('codebox.take')] = v }",
    objectId: globalObject,
    arguments: [argument],
  });
  const value = globalThis[TAKE];
  delete globalThis[TAKE];
  return value;
}

// Evaluates the cell in REPL mode: resolves with its completion value, rejects with what it
// threw or INTERRUPTED.
function evaluate(source, filename) {
  return new Promise((resolve, reject) => {
    const cell = { resolve, reject };
    current = cell;
    const settle = (error, answer) => {
      if (current !== cell) return; // interrupted meanwhile
      current = null;
      if (error) reject(error);
      else if (answer.exceptionDetails) reject(take(answer.exceptionDetails.exception));
      else resolve({ value: take(answer.result) }); // boxed: a promise is shown, not awaited
      post("Runtime.releaseObjectGroup", { objectGroup: "cell" });
    };
    globalThis[RUN] = () => session.post("Runtime.evaluate", {
      expression: `${source}\n//# sourceURL=${filename}`,
      replMode: true,
      objectGroup: "cell",
    }, settle);
    try {
      vm.runInThisContext("globalThis[Symbol.for('codebox.run')]()",
        { breakOnSigint: true, filename: __filename });
    } catch (e) {
      if (current === cell) current = null;
      reject(e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED" ? INTERRUPTED : e);
    } finally {
      delete globalThis[RUN];
    }
  });
}

// fd 0 on `file` (the cell's stdin) or /dev/null; process.stdin made anew on it.
let stdinStream = null;
function setStdin(file) {
  if (stdinStream) stdinStream.destroy(); // it would read the next cell's stdin
  stdinStream = null;
  let fd;
  for (let attempt = 0; attempt < 3 && fd !== 0; attempt++) {
    if (fd !== undefined) fs.closeSync(fd);
    try {
      fs.closeSync(0);
    } catch (e) { /* already closed */ }
    try {
      fd = fs.openSync(file || "/dev/null", "r"); // the lowest free descriptor: 0
    } catch (e) {
      fd = fs.openSync("/dev/null", "r");
    }
  }
  Object.defineProperty(process, "stdin", {
    configurable: true,
    enumerable: true,
    get() {
      if (!stdinStream) stdinStream = fs.createReadStream(null, { fd: 0, autoClose: false });
      return stdinStream;
    },
  });
}

function flushed(stream) {
  return new Promise((resolve) => stream.write("", resolve));
}

async function cell(number, code) {
  const filename = `<cell-${number}>`;
  const source = code.toString("utf8");
  const problem = syntaxError(source, filename);
  if (problem !== null) return replyText("syntax", problem);
  reply("compiled\n");
  setStdin(process.env.CODEBOX_CELL_STDIN);
  let status = "ok";
  let result;
  try {
    const { value } = await evaluate(source, filename);
    if (value !== undefined) result = util.inspect(value, { showProxy: true });
  } catch (e) {
    if (e === INTERRUPTED) {
      status = "interrupted";
    } else {
      printError(e);
      status = "error";
    }
  }
  setStdin(null);
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  if (result !== undefined) replyText("result", result);
  reply(`done ${status}\n`);
}

// ---- the globals of Node's REPL ----------------------------------------------------------

function replGlobals() {
  const require = Module.createRequire(path.join(process.cwd(), "<repl>"));
  globalThis.require = require;
  for (const name of Module.builtinModules) {
    if (name.startsWith("_") || name.includes("/") || name in globalThis) continue;
    const define = (value, enumerable) => Object.defineProperty(globalThis, name,
      { value, writable: true, configurable: true, enumerable });
    Object.defineProperty(globalThis, name, {
      configurable: true,
      get() {
        const value = require(name);
        define(value, false);
        return value;
      },
      set(value) {
        define(value, true);
      },
    });
  }
}

function main() {
  globalObject = post("Runtime.evaluate", { expression: "globalThis", objectGroup: "driver" })
    .result.objectId;
  replGlobals();
  process.on("SIGINT", () => {
    if (current) {
      const cell = current;
      current = null;
      cell.reject(INTERRUPTED);
    }
  });
  process.on("uncaughtException", printError);
  process.on("unhandledRejection", printError);
  let queue = Promise.resolve(); // one cell at a time, in order
  const requests = new net.Socket({ fd: REQUESTS, readable: true, writable: false });
  requests.on("data", requestReader((number, code) => {
    queue = queue.then(() => cell(number, code))
      .catch((e) => fail(`the driver failed: ${e && e.stack}`));
  }));
  requests.on("end", () => queue.then(() => process.exit(0)));
  reply("ready\n");
}

main();
