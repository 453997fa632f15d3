//! A seeded, reproducible generator of malformed and hostile MCP messages, for the protocol
//! fuzz tests (`mcp_fuzz`). The same seed gives the same messages, byte for byte; the
//! generator is its own SplitMix64, so a dependency update cannot change a replay.
//!
//! What the server owes each message is decided from the final bytes alone ([`owed`]), by
//! the rule both transports keep: a message that parses as JSON, is an object with a
//! `method` and has an id a JSON-RPC id can be (an integer or a string) is a request, and
//! gets exactly one answer with that id, a result or a JSON-RPC error; the same for each
//! element of a batch (an array). Anything else (unparsable bytes, notifications, responses,
//! objects without a usable id) is owed nothing with an id.

#![allow(dead_code)]

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// The seed CI uses unless `CODEBOX_FUZZ_SEED` says otherwise.
pub const DEFAULT_SEED: u64 = 0x00C0_DEB0_C5F0_22ED;

/// The seed for this run: `CODEBOX_FUZZ_SEED` (decimal or `0x` hex), else [`DEFAULT_SEED`].
pub fn seed() -> u64 {
    match std::env::var("CODEBOX_FUZZ_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("CODEBOX_FUZZ_SEED={s:?} is not a number"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// SplitMix64: small, fast, and fixed forever.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The families of messages, for the report and for weighting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    InvalidJson,
    InvalidUtf8,
    WrongTypes,
    MissingFields,
    ExtraFields,
    HugeString,
    DeepNesting,
    BadLimits,
    UnknownTool,
    UnknownMethod,
    PathTricks,
    Batch,
    BadId,
    Notification,
    ClientResponse,
    Control,
    /// A valid run with odd but allowed arguments: the few messages that start real runs.
    TinyRun,
}

/// One message and what the server owes it.
pub struct Message {
    pub kind: Kind,
    pub bytes: Vec<u8>,
    /// Ids (as canonical JSON text) that must each get one answer.
    pub owed: Vec<String>,
    /// Whether it may start a real run.
    pub runs: bool,
}

/// 10 MB: the size of the huge strings.
pub const HUGE: usize = 10 * 1024 * 1024;

/// What the server owes these bytes: the ids that must be answered (see the module doc).
pub fn owed(bytes: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Vec::new();
    };
    match &v {
        Value::Array(items) => items.iter().filter_map(request_id).collect(),
        other => request_id(other).into_iter().collect(),
    }
}

/// The id of a request object, as canonical JSON text, when it is one a JSON-RPC id can be
/// (an integer within i64, an integral float, or a string).
pub fn request_id(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    o.get("method")?;
    canonical_id(o.get("id")?)
}

/// An id as the server writes it back: integers (also `1.0`) as integers, strings as
/// strings; `None` for anything no JSON-RPC id can be.
pub fn canonical_id(id: &Value) -> Option<String> {
    match id {
        Value::String(_) => Some(id.to_string()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i.to_string())
            } else if n.as_u64().is_some() {
                None
            } else {
                let f = n.as_f64()?;
                (f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64)
                    .then(|| (f as i64).to_string())
            }
        }
        _ => None,
    }
}

/// The generator: messages with fresh ids, and a budget of real runs.
pub struct Generator {
    rng: Rng,
    next_id: i64,
    /// Messages that may still start a real run.
    runs_left: usize,
    /// Messages with 10 MB strings still allowed (they cost time on a debug build).
    huge_left: usize,
}

/// Arguments of a run that would start: every run-tool message breaks at least one of them
/// unless it is a [`Kind::TinyRun`].
fn tiny_run() -> Value {
    json!({"language": "bash", "code": "true"})
}

const TOOLS: [&str; 6] = [
    "run_code",
    "start_run",
    "get_result",
    "stop_run",
    "list_supported_languages",
    "get_execution_history",
];

impl Generator {
    /// `runs`: at most this many messages may start a real run; `huge`: at most this many
    /// carry a 10 MB string.
    pub fn new(seed: u64, runs: usize, huge: usize) -> Generator {
        Generator {
            rng: Rng::new(seed),
            next_id: 1000,
            runs_left: runs,
            huge_left: huge,
        }
    }

    fn id(&mut self) -> Value {
        self.next_id += 1;
        // Strings and integers both, as clients use both.
        if self.rng.chance(20) {
            json!(format!("fz-{}", self.next_id))
        } else {
            json!(self.next_id)
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": self.id(), "method": method, "params": params})
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// A run-tool call whose arguments break something.
    fn bad_run(&mut self, arguments: Value) -> Value {
        let tool = *self.rng.pick(&["run_code", "start_run"]);
        self.call(tool, arguments)
    }

    fn message(&self, kind: Kind, bytes: Vec<u8>, runs: bool) -> Message {
        Message {
            kind,
            owed: owed(&bytes),
            bytes,
            runs,
        }
    }

    fn json(&self, kind: Kind, v: &Value) -> Message {
        self.message(kind, serde_json::to_vec(v).unwrap(), false)
    }

    /// The next message.
    pub fn next_message(&mut self) -> Message {
        const WEIGHTS: [(Kind, usize); 17] = [
            (Kind::InvalidJson, 12),
            (Kind::InvalidUtf8, 6),
            (Kind::WrongTypes, 12),
            (Kind::MissingFields, 7),
            (Kind::ExtraFields, 6),
            (Kind::HugeString, 2),
            (Kind::DeepNesting, 3),
            (Kind::BadLimits, 10),
            (Kind::UnknownTool, 5),
            (Kind::UnknownMethod, 6),
            (Kind::PathTricks, 10),
            (Kind::Batch, 4),
            (Kind::BadId, 4),
            (Kind::Notification, 5),
            (Kind::ClientResponse, 3),
            (Kind::Control, 4),
            (Kind::TinyRun, 1),
        ];
        let total: usize = WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.below(total);
        let mut kind = Kind::Control;
        for (k, w) in WEIGHTS {
            if roll < w {
                kind = k;
                break;
            }
            roll -= w;
        }
        match kind {
            Kind::InvalidJson => self.invalid_json(),
            Kind::InvalidUtf8 => self.invalid_utf8(),
            Kind::WrongTypes => self.wrong_types(),
            Kind::MissingFields => self.missing_fields(),
            Kind::ExtraFields => self.extra_fields(),
            Kind::HugeString if self.huge_left > 0 => {
                self.huge_left -= 1;
                self.huge_string()
            }
            Kind::HugeString | Kind::DeepNesting => self.deep_nesting(),
            Kind::BadLimits => self.bad_limits(),
            Kind::UnknownTool => self.unknown_tool(),
            Kind::UnknownMethod => self.unknown_method(),
            Kind::PathTricks => self.path_tricks(),
            Kind::Batch => self.batch(),
            Kind::BadId => self.bad_id(),
            Kind::Notification => self.notification(),
            Kind::ClientResponse => self.client_response(),
            Kind::Control => self.control(),
            Kind::TinyRun if self.runs_left > 0 => {
                self.runs_left -= 1;
                self.tiny_run()
            }
            Kind::TinyRun => self.control(),
        }
    }

    /// `n` messages.
    pub fn messages(&mut self, n: usize) -> Vec<Message> {
        (0..n).map(|_| self.next_message()).collect()
    }

    /// Some plausible message, to be broken.
    fn plausible(&mut self) -> Value {
        match self.rng.below(4) {
            0 => self.request("ping", json!({})),
            1 => self.request("tools/list", json!({})),
            2 => self.call("get_result", json!({"run_id": "nope"})),
            _ => self.bad_run(json!({"language": "cobol", "code": "x"})),
        }
    }

    fn invalid_json(&mut self) -> Message {
        let base = serde_json::to_vec(&self.plausible()).unwrap();
        let bytes: Vec<u8> = match self.rng.below(10) {
            0 => {
                let cut = 1 + self.rng.below(base.len() - 1);
                base[..cut].to_vec()
            }
            1 => {
                let mut b = base.clone();
                let at = self.rng.below(b.len());
                let c = *self.rng.pick(b"{}[]\",:\\");
                b.insert(at, c);
                b
            }
            2 => {
                let mut b = base.clone();
                let tails: [&[u8]; 5] = [b"x", b"}", b",", b"{}", b" 1"];
                let tail = *self.rng.pick(&tails);
                b.extend_from_slice(tail);
                b
            }
            3 => self
                .rng
                .pick(&[
                    &b"NaN"[..],
                    b"Infinity",
                    b"-Infinity",
                    b"{'jsonrpc':'2.0','id':1,'method':'ping'}",
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",}",
                    b"// a comment",
                    b"{\"a\":1}{\"b\":2}",
                    b"[1,]",
                    b"\"unterminated",
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"",
                    b"tru",
                    b"\x00",
                    b"{\"a\":\"\\x41\"}",
                    b"{\"a\":01}",
                ])
                .to_vec(),
            4 => {
                // NaN, infinities and out-of-range numbers where limits go.
                let id = self.id();
                let v = self
                    .rng
                    .pick(&["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]);
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"run_code","arguments":{{"language":"python","code":"print(1)","limits":{{"memory_mb":{v}}}}}}}}}"#
                )
                .into_bytes()
            }
            5 => {
                let n = 1 + self.rng.below(300);
                (0..n).map(|_| (self.rng.next() & 0x7f) as u8).collect()
            }
            6 => {
                // A lone surrogate: valid JSON text, but no string can hold it.
                let id = self.id();
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"run_code","arguments":{{"language":"python","code":"\ud800"}}}}}}"#).into_bytes()
            }
            7 => {
                let mut b = base.clone();
                let at = self.rng.below(b.len());
                b.remove(at);
                b
            }
            8 => b"   ".to_vec(),
            _ => {
                let mut b = base.clone();
                b.retain(|c| *c != b'"');
                b
            }
        };
        self.message(Kind::InvalidJson, bytes, false)
    }

    fn invalid_utf8(&mut self) -> Message {
        let bads: [&[u8]; 7] = [
            b"\xff",
            b"\xc0\x80",
            b"\x80",
            b"\xed\xa0\x80",
            b"\xf8\x88\x80\x80\x80",
            b"\xe2\x82",
            b"\xfe\xfe\xff\xff",
        ];
        let bad = *self.rng.pick(&bads);
        let id = self.id();
        let mut bytes = match self.rng.below(3) {
            0 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"run_code","arguments":{{"language":"python","code":"print(1)#"#).into_bytes(),
            1 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_result","arguments":{{"run_id":""#).into_bytes(),
            _ => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":""#).into_bytes(),
        };
        bytes.extend_from_slice(bad);
        bytes.extend_from_slice(match self.rng.below(3) {
            0 => &br#""}}}"#[..],
            1 => br#""}}}"#,
            _ => br#""}"#,
        });
        // Some are also broken as JSON; either way no string can hold them.
        if self.rng.chance(20) {
            bytes.splice(0..0, b"\xef\xbb\xbf".iter().copied());
        }
        self.message(Kind::InvalidUtf8, bytes, false)
    }

    fn wrong_types(&mut self) -> Message {
        let odd = [
            json!(5),
            json!(-1),
            json!(1.5),
            json!(true),
            json!(null),
            json!([]),
            json!({}),
            json!("x"),
            json!([1, "a", null]),
            json!({"a": {"b": []}}),
        ];
        let v = self.rng.pick(&odd).clone();
        let msg = match self.rng.below(12) {
            0 => self.bad_run(json!({"language": v, "code": "print(1)"})),
            // A string is valid code: then the language is wrong instead.
            1 if v.is_string() => self.bad_run(json!({"language": "cobol", "code": v})),
            1 => self.bad_run(json!({"language": "python", "code": v})),
            2 => {
                let field = *self
                    .rng
                    .pick(&["stdin", "args", "files", "limits", "tests", "compare"]);
                let mut a = json!({"language": "python", "code": "print(1)"});
                // `null` is a valid "left out": make it something wrong instead.
                a[field] = if v.is_null() || (field == "args" && v == json!([])) {
                    json!(12)
                } else {
                    v
                };
                // Some of these values are valid for some fields (`{}` limits, a string
                // stdin): the blank code then fails validation, so nothing runs.
                a["code"] = json!(" ");
                self.bad_run(a)
            }
            3 => {
                let field = *self.rng.pick(&["memory_mb", "timeout_seconds", "cpus"]);
                let v = if v.is_null() { json!("7") } else { v };
                // A number may be a valid limit: the blank code keeps it from running.
                self.bad_run(json!({"language": "python", "code": " ", "limits": {field: v}}))
            }
            4 => self.bad_run(json!({"language": "python", "code": "print(1)", "files": [v]})),
            5 => self.call("get_result", json!({"run_id": v})),
            6 => self.call(
                "get_result",
                json!({"run_id": "x", "wait_seconds": if v.is_null() { json!("1") } else { v }}),
            ),
            7 => self.call("stop_run", json!({"run_id": v})),
            8 => {
                let field = *self.rng.pick(&["limit", "status", "language"]);
                let v = if v.is_null() { json!({}) } else { v };
                self.call("get_execution_history", json!({field: v}))
            }
            9 => self.request("tools/call", json!({"name": v, "arguments": {}})),
            10 => {
                let field = *self.rng.pick(&["params", "arguments"]);
                if field == "params" {
                    self.request("tools/call", v)
                } else {
                    self.request("tools/call", json!({"name": "run_code", "arguments": v}))
                }
            }
            _ => {
                let mut m = self.request("ping", json!({}));
                let field = *self.rng.pick(&["jsonrpc", "method"]);
                m[field] = v;
                m
            }
        };
        self.json(Kind::WrongTypes, &msg)
    }

    fn missing_fields(&mut self) -> Message {
        let msg = match self.rng.below(8) {
            0 => self.bad_run(json!({"language": "python"})),
            1 => self.bad_run(json!({"code": "print(1)"})),
            2 => self.bad_run(json!({})),
            3 => self.call("get_result", json!({})),
            4 => self.call("stop_run", json!({"wait_seconds": 1})),
            5 => self.request("tools/call", json!({"arguments": tiny_run()})),
            6 => {
                let mut m = self.request("tools/call", json!({}));
                m.as_object_mut().unwrap().remove("params");
                m
            }
            _ => {
                let mut m = self.call("list_supported_languages", json!({}));
                m.as_object_mut().unwrap().remove("jsonrpc");
                m
            }
        };
        self.json(Kind::MissingFields, &msg)
    }

    fn extra_fields(&mut self) -> Message {
        let msg = match self.rng.below(7) {
            0 => {
                let mut a = tiny_run();
                a["network"] = json!(true);
                self.bad_run(a)
            }
            1 => {
                let mut a = tiny_run();
                a["limits"] = json!({"memory_mb": 64, "pids": 100000});
                self.bad_run(a)
            }
            2 => {
                let mut a = tiny_run();
                a["files"] = json!([{"path": "a.txt", "content": "x", "mode": "0777"}]);
                self.bad_run(a)
            }
            3 => self.call("get_result", json!({"run_id": "x", "follow": true})),
            4 => self.call("get_execution_history", json!({"limit": 1, "all": true})),
            5 => {
                let mut m = self.request("ping", json!({}));
                m["extra"] = json!({"deep": [1, 2, 3]});
                m["result"] = json!({});
                m
            }
            _ => {
                let mut m = self.call("list_supported_languages", json!({"verbose": 1}));
                m["params"]["_meta"] = json!({"progressToken": {"not": "a token"}});
                m
            }
        };
        self.json(Kind::ExtraFields, &msg)
    }

    fn huge_string(&mut self) -> Message {
        let big = "A".repeat(HUGE);
        let msg = match self.rng.below(9) {
            0 => self.bad_run(json!({"language": "python", "code": big})),
            1 => self.bad_run(json!({"language": big, "code": "print(1)"})),
            2 => self.bad_run(json!({"language": "python", "code": "print(1)", "stdin": big})),
            3 => self.bad_run(json!({"language": "python", "code": "print(1)", "args": [big]})),
            4 => self.bad_run(json!({"language": "python", "code": "print(1)",
                "files": [{"path": "big.txt", "content": big}]})),
            5 => self.bad_run(json!({"language": "python", "code": "print(1)",
                "files": [{"path": big, "content": "x"}]})),
            6 => self.call("get_result", json!({"run_id": big})),
            7 => self.request(&big, json!({})),
            _ => json!({"jsonrpc": "2.0", "id": big, "method": "ping"}),
        };
        self.json(Kind::HugeString, &msg)
    }

    fn deep_nesting(&mut self) -> Message {
        // Within serde_json's recursion limit (128) the message parses and is answered;
        // beyond it, it is unparsable.
        let depth = *self.rng.pick(&[20usize, 100, 120, 200, 10_000, 100_000]);
        let (open, close) = if self.rng.chance(70) {
            ("[", "]")
        } else {
            ("{\"a\":", "}")
        };
        let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let id = self.id();
        let text = match self.rng.below(4) {
            0 => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"run_code","arguments":{{"language":"python","code":"print(1)","args":{nested}}}}}}}"#
            ),
            1 => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_result","arguments":{{"run_id":{nested}}}}}}}"#
            ),
            2 => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"x":{nested}}}}}"#
            ),
            _ => nested,
        };
        self.message(Kind::DeepNesting, text.into_bytes(), false)
    }

    fn bad_limits(&mut self) -> Message {
        let odd = [
            json!(-1),
            json!(0),
            json!(-0.0),
            json!(1e308),
            json!(-1e308),
            json!(5e-324),
            json!(1e-7),
            json!(0.0004),
            json!(9_223_372_036_854_775_807_i64),
            json!(18_446_744_073_709_551_615_u64),
            json!(32768),
            json!(6.5),
            json!(5),
            json!(0.001),
            json!(3601),
            json!(4.0001),
            json!("NaN"),
            json!("Infinity"),
            json!("-1"),
        ];
        let v = self.rng.pick(&odd).clone();
        let msg = match self.rng.below(5) {
            0..=2 => {
                let field = *self.rng.pick(&["memory_mb", "timeout_seconds", "cpus"]);
                let limits = json!({field: v});
                // A value that is allowed would start a run: keep those for TinyRun, and
                // break the code here so nothing runs.
                let code = if self.rng.chance(50) { "" } else { "   " };
                let mut a = json!({"language": "bash", "code": "true", "limits": limits});
                if limit_allowed(field, &v) {
                    a["code"] = json!(code);
                }
                self.bad_run(a)
            }
            3 => self.call("get_result", json!({"run_id": "nope", "wait_seconds": v})),
            _ => self.call("get_execution_history", json!({"limit": v})),
        };
        self.json(Kind::BadLimits, &msg)
    }

    fn unknown_tool(&mut self) -> Message {
        let name = *self.rng.pick(&[
            "",
            "rm -rf /",
            "RUN_CODE",
            "run_code\u{0}",
            "run_code ",
            "../run_code",
            "exec",
            "run_code;stop_run",
            "\u{202e}edoc_nur",
            "start_run\n",
        ]);
        let msg = self.call(name, tiny_run());
        self.json(Kind::UnknownTool, &msg)
    }

    fn unknown_method(&mut self) -> Message {
        let method = *self.rng.pick(&[
            "",
            "nope",
            "tools/run",
            "tools/call/",
            "TOOLS/CALL",
            "resources/list",
            "resources/read",
            "prompts/list",
            "prompts/get",
            "completion/complete",
            "logging/setLevel",
            "sampling/createMessage",
            "roots/list",
            "elicitation/create",
            "$/cancelRequest",
            "rpc.discover",
            "notifications/cancelled",
            "notifications/initialized",
            "tools/list",
            "initialize",
        ]);
        let params = self
            .rng
            .pick(&[
                json!({}),
                json!({"uri": "file:///etc/passwd"}),
                json!({"cursor": 5}),
                json!({"level": "debug"}),
                json!(null),
            ])
            .clone();
        let mut msg = self.request(method, params.clone());
        if params.is_null() {
            msg.as_object_mut().unwrap().remove("params");
        }
        self.json(Kind::UnknownMethod, &msg)
    }

    fn path_tricks(&mut self) -> Message {
        let path = *self.rng.pick(&[
            "../escape.txt",
            "/etc/passwd",
            "a/../../b",
            "main.sh",
            "./main.sh",
            "main.sh/x",
            "",
            ".",
            "./",
            "a\u{0}b",
            "a\\b",
            "C:\\x",
            "~/.ssh/id_rsa",
            "outputs/../../x",
            "/workspace/../x",
            "..",
            "a/..",
            "//server/share",
            "/proc/self/environ",
            "data/../../../../etc/shadow",
        ]);
        let mut files = vec![json!({"path": path, "content": "x"})];
        // Valid names are sent only next to an invalid one, so nothing runs.
        match self.rng.below(6) {
            0 => files.push(json!({"path": "dup.txt", "content": "1"})),
            1 => files.push(json!({"path": "x".repeat(256), "content": "1"})),
            2 => files.push(json!({"path": "ok.txt", "content": "!!", "encoding": "base64"})),
            3 => files.push(json!({"path": "ok.txt", "content": "x", "encoding": "hex"})),
            _ => {}
        }
        if self.rng.chance(10) {
            files = (0..1000)
                .map(|i| json!({"path": format!("f{i}"), "content": ""}))
                .collect();
        }
        let msg = self.bad_run(json!({"language": "bash", "code": "true", "files": files}));
        self.json(Kind::PathTricks, &msg)
    }

    fn batch(&mut self) -> Message {
        let n = *self.rng.pick(&[0usize, 1, 2, 3, 10, 50]);
        let mut items: Vec<Value> = Vec::new();
        for _ in 0..n {
            items.push(match self.rng.below(5) {
                0 => self.request("ping", json!({})),
                1 => self.call("get_result", json!({"run_id": "nope"})),
                2 => json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
                3 => json!(42),
                _ => self.bad_run(json!({"language": "python", "code": ""})),
            });
        }
        if self.rng.chance(10) {
            items = vec![json!([self.request("ping", json!({}))])];
        }
        self.json(Kind::Batch, &Value::Array(items))
    }

    fn bad_id(&mut self) -> Message {
        // The readable ones recur, so the same id is in flight more than once: each
        // occurrence is owed its own answer.
        let id = self
            .rng
            .pick(&[
                json!(null),
                json!(1.5),
                json!(true),
                json!({}),
                json!([1]),
                json!(-1),
                json!(0),
                json!(2.0),
                json!(""),
                json!("\u{0}"),
                json!(i64::MAX),
                json!(i64::MIN),
                json!(u64::MAX),
            ])
            .clone();
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        self.json(Kind::BadId, &msg)
    }

    fn notification(&mut self) -> Message {
        let msg = match self.rng.below(6) {
            0 => {
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 100 + self.rng.below(900), "reason": "fuzz"}})
            }
            1 => {
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"x": 1}}})
            }
            2 => {
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": "NaN"}})
            }
            3 => json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            4 => {
                json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed", "params": 7})
            }
            _ => json!({"jsonrpc": "2.0", "method": "notifications/made_up"}),
        };
        self.json(Kind::Notification, &msg)
    }

    fn client_response(&mut self) -> Message {
        let id = self.rng.below(1 << 20);
        let msg = match self.rng.below(3) {
            0 => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            1 => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "no"}}),
            _ => json!({"jsonrpc": "2.0", "id": id, "result": 5, "error": null}),
        };
        self.json(Kind::ClientResponse, &msg)
    }

    fn control(&mut self) -> Message {
        let msg = match self.rng.below(6) {
            0 => self.request("ping", json!({})),
            1 => self.request("tools/list", json!({})),
            2 => self.call(
                "get_result",
                json!({"run_id": "0123456789abcdef0123456789abcdef", "wait_seconds": 0}),
            ),
            3 => self.call("stop_run", json!({"run_id": "../../etc"})),
            4 => self.call(
                "get_execution_history",
                json!({"limit": 3, "status": "failed", "language": "py"}),
            ),
            _ => self.call("list_supported_languages", json!({})),
        };
        self.json(Kind::Control, &msg)
    }

    fn tiny_run(&mut self) -> Message {
        // Odd but allowed arguments; each a very short program.
        let mut a = tiny_run();
        match self.rng.below(5) {
            0 => a["limits"] = json!({"memory_mb": 6, "cpus": 0.01}),
            1 => a["files"] = json!([{"path": "a/./b//c.txt", "content": "x"}]),
            2 => {
                a["files"] =
                    json!([{"path": "...", "content": "x"}, {"path": ".. ", "content": ""}])
            }
            3 => a["args"] = json!(["--", "$(id)", "'\"", "\u{202e}"]),
            _ => a["stdin"] = json!("\u{0}\u{1}\u{7f}"),
        }
        let tool = *self.rng.pick(&["run_code", "start_run"]);
        let msg = self.call(tool, a);
        self.message(Kind::TinyRun, serde_json::to_vec(&msg).unwrap(), true)
    }
}

/// Whether a limit value would pass validation (so a request with it would run).
fn limit_allowed(field: &str, v: &Value) -> bool {
    let Some(x) = v.as_f64() else { return false };
    if !x.is_finite() || x <= 0.0 {
        return false;
    }
    match field {
        // The smaller of limits.max_memory_mb (16384) and runs.memory_budget_mb (8192).
        "memory_mb" => x.fract() == 0.0 && (6.0..=8192.0).contains(&x),
        "timeout_seconds" => (0.001..=3600.0).contains(&x),
        _ => (0.01..=4.0).contains(&x),
    }
}

/// Messages per kind, for the report.
pub fn tally(messages: &[Message]) -> BTreeMap<Kind, usize> {
    let mut t = BTreeMap::new();
    for m in messages {
        *t.entry(m.kind).or_insert(0) += 1;
    }
    t
}

#[test]
fn the_generator_is_reproducible_and_ids_are_unique() {
    let a = Generator::new(7, 5, 2).messages(400);
    let b = Generator::new(7, 5, 2).messages(400);
    assert!(a.iter().zip(&b).all(|(x, y)| x.bytes == y.bytes));
    let c = Generator::new(8, 5, 2).messages(400);
    assert!(a.iter().zip(&c).any(|(x, y)| x.bytes != y.bytes));
    let mut seen = std::collections::HashSet::new();
    for m in a.iter().filter(|m| m.kind != Kind::BadId) {
        for id in &m.owed {
            assert!(seen.insert(id.clone()), "id {id} owed twice");
        }
    }
    assert!(a.iter().filter(|m| m.runs).count() <= 5);
    assert!(a.iter().filter(|m| m.bytes.len() >= HUGE).count() <= 2);
}

/// Which API a hostile HTTP request is for; each refuses in its own shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Api {
    V1,
    Judge0,
    Piston,
}

/// A request to the APIs for programs, and what may answer it.
pub struct ApiRequest {
    pub api: Api,
    pub method: &'static str,
    /// Path and query, as sent (not re-encoded).
    pub target: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Vec<u8>>,
    /// It may start a real run (then 2xx is fine).
    pub runs: bool,
}

/// Odd JSON values for any field.
fn odd_values() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-1e308),
        json!(5e-324),
        json!(18_446_744_073_709_551_615_u64),
        json!(i64::MIN),
        json!(1.5),
        json!(""),
        json!(" "),
        json!("NaN"),
        json!("-Infinity"),
        json!("1e999"),
        json!("\u{0}"),
        json!("\u{202e}x"),
        json!([]),
        json!([1, "a", null]),
        json!({}),
        json!({"a": {"b": []}}),
    ]
}

/// Fields of each API's run request.
const V1_FIELDS: [&str; 11] = [
    "language",
    "code",
    "stdin",
    "args",
    "files",
    "limits",
    "tests",
    "compare",
    "wait",
    "session_id",
    "extra",
];
/// Judge0's submission attributes: those a request sets, and those it cannot.
const JUDGE0_FIELDS: [&str; 35] = codebox::api::judge0::ALL_FIELDS;
const PISTON_FIELDS: [&str; 10] = [
    "language",
    "version",
    "files",
    "stdin",
    "args",
    "compile_timeout",
    "run_timeout",
    "compile_memory_limit",
    "run_memory_limit",
    "run_cpu_time",
];

/// Odd path segments: traversal, encodings, huge, unicode.
const ODD_SEGMENTS: [&str; 14] = [
    "..",
    "%2e%2e",
    "%00",
    "%ff%fe",
    "%zz",
    "x%2Fy",
    "nope",
    "0123456789abcdef0123456789abcdef",
    "01234567-89ab-cdef-0123-456789abcdef",
    "00000000-0000-0000-0000-000000000000",
    "%E2%80%AE",
    "-1",
    "1e9",
    "%20",
];

/// Odd query strings.
const ODD_QUERIES: [&str; 14] = [
    "wait_seconds=-1",
    "wait_seconds=1e999",
    "wait_seconds=NaN",
    "wait_seconds=61",
    "wait_seconds=%zz",
    "limit=0",
    "limit=99999999999999999999",
    "status=%00",
    "fields=*,nope",
    "fields=",
    "base64_encoded=true&fields=,,,",
    "tokens=,,,",
    "a=1&a=2&b",
    "%%%",
];

impl Generator {
    /// `n` hostile requests to `/v1`, Piston's and Judge0's routes. At most `runs` may
    /// start a real run (a `true` in bash); at most `huge` carry a body over `cap` bytes.
    pub fn api_requests(
        &mut self,
        n: usize,
        runs: usize,
        huge: usize,
        cap: usize,
    ) -> Vec<ApiRequest> {
        let mut runs_left = runs;
        let mut huge_left = huge;
        (0..n)
            .map(|_| {
                let roll = self.rng.below(100);
                if roll < 2 && runs_left > 0 {
                    runs_left -= 1;
                    return self.api_tiny_run();
                }
                if roll < 3 && huge_left > 0 {
                    huge_left -= 1;
                    let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
                    let (method, target) = run_route(api);
                    let body = format!("{{\"code\":\"{}\"}}", "A".repeat(cap + 1)).into_bytes();
                    return ApiRequest {
                        api,
                        method,
                        target: target.into(),
                        headers: vec![],
                        body: Some(body),
                        runs: false,
                    };
                }
                match self.rng.below(10) {
                    0..=2 => self.api_bad_run_body(),
                    3 => self.api_broken_json(),
                    4 | 5 => self.api_odd_path(),
                    6 => self.api_odd_method(),
                    7 => self.api_odd_headers(),
                    8 => self.api_batch(),
                    _ => self.api_limits(),
                }
            })
            .collect()
    }

    fn api_request(
        &self,
        api: Api,
        method: &'static str,
        target: String,
        body: Option<Value>,
    ) -> ApiRequest {
        ApiRequest {
            api,
            method,
            target,
            headers: vec![("content-type", "application/json".into())],
            body: body.map(|b| serde_json::to_vec(&b).unwrap()),
            runs: false,
        }
    }

    /// A run request with one field made odd, and at least one thing that keeps it from
    /// running (blank code, or the odd field itself).
    fn api_bad_run_body(&mut self) -> ApiRequest {
        let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
        let v = self.rng.pick(&odd_values()).clone();
        let (method, target) = run_route(api);
        let body = match api {
            Api::V1 => {
                let mut b = json!({"language": "bash", "code": " "});
                let field = *self.rng.pick(&V1_FIELDS);
                // Odd code may be valid code: then an unknown language keeps it from running.
                if field == "code" {
                    b["language"] = json!("cobra");
                }
                b[field] = v;
                b
            }
            Api::Judge0 => {
                let mut b = json!({"language_id": 46, "source_code": " "});
                let field = *self.rng.pick(&JUDGE0_FIELDS);
                // A blank source keeps it from running; odd source (numbers are read as
                // text, as Rails reads them) gets a language Judge0 1.13.1 has and codebox
                // does not (70, Python 2).
                if field == "source_code" {
                    b["language_id"] = json!(70);
                }
                b[field] = v;
                b
            }
            Api::Piston => {
                let mut b =
                    json!({"language": "bash", "version": "*", "files": [{"content": "true"}]});
                b[*self.rng.pick(&PISTON_FIELDS)] = v;
                // An unknown language keeps it from running unless the odd field broke it.
                b["language"] = json!("cobra");
                b
            }
        };
        let body = if self.rng.chance(10) {
            json!([body])
        } else {
            body
        };
        self.api_request(api, method, target.into(), Some(body))
    }

    fn api_broken_json(&mut self) -> ApiRequest {
        let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
        let (method, target) = run_route(api);
        let bodies: [&[u8]; 12] = [
            b"",
            b"{",
            b"nul",
            b"[1,]",
            b"{\"language\": \"bash\", \"code\": \"true\",}",
            b"\xff\xfe\x00",
            b"{\"code\": \"\\ud800\"}",
            b"{\"a\":1}{\"b\":2}",
            b"NaN",
            b"\"just a string\"",
            b"{\"source_code\": \"\xc0\x80\", \"language_id\": 46}",
            b"{\"language\": \"bash\", \"files\": [{\"content\": \"true\", \"encoding\": \"hex\"}]",
        ];
        let body = self.rng.pick(&bodies).to_vec();
        let depth = *self.rng.pick(&[10usize, 200, 5000]);
        let body = if self.rng.chance(20) {
            format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
        } else {
            body
        };
        let content_type = self
            .rng
            .pick(&[
                "application/json",
                "text/plain",
                "application/x-www-form-urlencoded",
                "",
                "multipart/form-data; boundary=x",
            ])
            .to_string();
        ApiRequest {
            api,
            method,
            target: target.into(),
            headers: vec![("content-type", content_type)],
            body: Some(body),
            runs: false,
        }
    }

    fn api_odd_path(&mut self) -> ApiRequest {
        let seg = *self.rng.pick(&ODD_SEGMENTS);
        let q = *self.rng.pick(&ODD_QUERIES);
        let (api, method, target) = match self.rng.below(9) {
            0 => (Api::V1, "GET", format!("/v1/runs/{seg}?{q}")),
            1 => (Api::V1, "DELETE", format!("/v1/runs/{seg}")),
            2 => (Api::V1, "GET", format!("/v1/history?{q}")),
            3 => (Api::V1, "GET", format!("/v1/{seg}/{seg}")),
            4 => (Api::Judge0, "GET", format!("/submissions/{seg}?{q}")),
            5 => (
                Api::Judge0,
                "GET",
                format!("/submissions/batch?tokens={seg},{seg}&{q}"),
            ),
            6 => (Api::Judge0, "GET", format!("/languages/{seg}")),
            7 => (Api::Judge0, "DELETE", format!("/submissions/{seg}")),
            _ => (Api::Piston, "GET", format!("/api/v2/{seg}")),
        };
        self.api_request(api, method, target, None)
    }

    fn api_odd_method(&mut self) -> ApiRequest {
        let (api, path) = *self.rng.pick(&[
            (Api::V1, "/v1/runs"),
            (Api::V1, "/v1/languages"),
            (Api::V1, "/v1/openapi.json"),
            (Api::Judge0, "/submissions/batch"),
            (Api::Judge0, "/languages"),
            (Api::Judge0, "/config_info"),
            (Api::Piston, "/api/v2/execute"),
            (Api::Piston, "/api/v2/runtimes"),
        ]);
        let method = *self
            .rng
            .pick(&["PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]);
        self.api_request(api, method, path.into(), Some(json!({})))
    }

    fn api_odd_headers(&mut self) -> ApiRequest {
        let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
        let (method, target) = run_route(api);
        let body = match api {
            Api::V1 => json!({"language": "bash", "code": "true"}),
            Api::Judge0 => json!({"language_id": 46, "source_code": "true"}),
            Api::Piston => json!({"language": "bash", "files": [{"content": "true"}]}),
        };
        // Each of these is refused before anything runs: no token, a wrong one, a foreign
        // Host, an Origin.
        let header = match self.rng.below(5) {
            0 => ("authorization", "Bearer wrong".to_string()),
            1 => ("authorization", "Basic eDp5".to_string()),
            2 => ("x-auth-token", "wrong".to_string()),
            3 => ("host", "evil.example.com".to_string()),
            _ => ("origin", "http://evil.example.com".to_string()),
        };
        let mut r = self.api_request(api, method, target.into(), Some(body));
        r.headers.push(header);
        r
    }

    fn api_batch(&mut self) -> ApiRequest {
        let n = *self.rng.pick(&[0usize, 1, 2, 21, 50]);
        let items: Vec<Value> = (0..n)
            .map(|_| {
                let mut item = json!({"language_id": 46, "source_code": " "});
                let field = *self.rng.pick(&JUDGE0_FIELDS);
                if field == "source_code" {
                    item["language_id"] = json!(70);
                }
                item[field] = self.rng.pick(&odd_values()).clone();
                item
            })
            .collect();
        let body = match self.rng.below(4) {
            0 => json!({"submissions": items}),
            1 => json!(items),
            2 => json!({"submissions": self.rng.pick(&odd_values()).clone()}),
            _ => json!({"submissions": [items]}),
        };
        let q = if self.rng.chance(30) {
            "?base64_encoded=true"
        } else {
            ""
        };
        self.api_request(
            Api::Judge0,
            "POST",
            format!("/submissions/batch{q}"),
            Some(body),
        )
    }

    fn api_limits(&mut self) -> ApiRequest {
        let odd = [
            json!(-1),
            json!(0),
            json!(1e308),
            json!(5e-324),
            json!(32768),
            json!(3601),
            json!(99_999_999),
            json!(-1e308),
            json!(6.5),
            json!(18_446_744_073_709_551_615_u64),
        ];
        let v = self.rng.pick(&odd).clone();
        let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
        let (method, target) = run_route(api);
        let body = match api {
            Api::V1 => {
                let field = *self.rng.pick(&["memory_mb", "timeout_seconds", "cpus"]);
                json!({"language": "bash", "code": " ", "limits": {field: v}})
            }
            Api::Judge0 => {
                let field = *self.rng.pick(&[
                    "cpu_time_limit",
                    "wall_time_limit",
                    "memory_limit",
                    "cpu_extra_time",
                    "stack_limit",
                    "max_file_size",
                ]);
                json!({"language_id": 46, "source_code": " ", field: v})
            }
            Api::Piston => {
                let field = *self.rng.pick(&[
                    "run_timeout",
                    "compile_timeout",
                    "run_memory_limit",
                    "compile_memory_limit",
                ]);
                json!({"language": "cobra", "files": [{"content": "true"}], field: v})
            }
        };
        self.api_request(api, method, target.into(), Some(body))
    }

    /// A valid tiny run through one of the APIs.
    fn api_tiny_run(&mut self) -> ApiRequest {
        let api = *self.rng.pick(&[Api::V1, Api::Judge0, Api::Piston]);
        let (method, target) = run_route(api);
        let body = match api {
            Api::V1 => {
                json!({"language": "bash", "code": "true", "wait": self.rng.chance(50), "args": ["$(id)", "'\""]})
            }
            Api::Judge0 => {
                json!({"language_id": 46, "source_code": "true", "stdin": "\u{0}\u{7f}", "command_line_arguments": "-- $(id) `x`"})
            }
            Api::Piston => {
                json!({"language": "sh", "files": [{"content": "true"}, {"content": "x"}], "args": ["1", "2", "3"], "run_memory_limit": -1})
            }
        };
        let mut r = self.api_request(api, method, target.into(), Some(body));
        r.runs = true;
        r
    }
}

/// The route that starts runs in each API.
fn run_route(api: Api) -> (&'static str, &'static str) {
    match api {
        Api::V1 => ("POST", "/v1/runs"),
        Api::Judge0 => ("POST", "/submissions"),
        Api::Piston => ("POST", "/api/v2/execute"),
    }
}

#[test]
fn the_api_generator_is_reproducible_and_bounded() {
    let a = Generator::new(7, 0, 0).api_requests(500, 5, 2, 1000);
    let b = Generator::new(7, 0, 0).api_requests(500, 5, 2, 1000);
    assert!(a
        .iter()
        .zip(&b)
        .all(|(x, y)| x.target == y.target && x.body == y.body));
    assert!(a.iter().filter(|r| r.runs).count() <= 5);
    let huge = |b: &Vec<u8>| b.len() > 1000 && b.starts_with(b"{\"code\":\"AAAA");
    assert!(
        a.iter()
            .filter(|r| r.body.as_ref().is_some_and(huge))
            .count()
            <= 2
    );
    for api in [Api::V1, Api::Judge0, Api::Piston] {
        assert!(a.iter().any(|r| r.api == api), "no request for {api:?}");
    }
}
