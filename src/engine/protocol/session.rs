//! A session's container (docs/sandbox-init.md, "Session mode"): the opening payload, the
//! requests that follow it on the same stdin, and what a request's `D` frame says.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use super::payload::{argv, outputs_records, record};
use super::{Collect, Files, ProtocolError, MAGIC};
use crate::report::{InterpreterState, ResetReason};

/// How long `codebox-init` may take in a session, beyond an execution's own limits: the host
/// sends these durations (the opening's `timeout_ms`, each cell's `interrupt_ms`) and derives
/// its own deadlines from the same values, so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InitTimes {
    /// How long a driver may take to say it is ready.
    pub driver_start: Duration,
    /// How long an interrupted cell has to answer before its driver is killed.
    pub interrupt: Duration,
}

/// How long `codebox-init` goes on killing what a cell left (`KILL_ROUNDS_MS` in
/// images/base/codebox-init-driver.c).
const KILL_ROUNDS: Duration = Duration::from_secs(2);

impl InitTimes {
    pub(crate) const DEFAULT: InitTimes = InitTimes {
        driver_start: Duration::from_secs(30),
        interrupt: Duration::from_secs(2),
    };

    /// Once a stop reached an execution: the interrupt's grace, the driver and what the cell
    /// left killed, the driver started again. (A stop during the driver's start before the
    /// cell is answered once it started: less than this.)
    pub(crate) fn after_stop(&self) -> Duration {
        self.interrupt + KILL_ROUNDS + self.driver_start
    }

    /// The longest an execution's answer may take: the driver stopped and started before the
    /// cell (a reset, or a driver found dead or busy), the check's and the program's limits,
    /// then [`InitTimes::after_stop`] for a cell that timed out.
    pub(crate) fn exec_answer(&self, check_timeout: Duration, timeout: Duration) -> Duration {
        KILL_ROUNDS + self.driver_start + check_timeout + timeout + self.after_stop()
    }
}

/// The first payload of a session's container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Open {
    /// The driver's command, for a stateful session.
    pub driver: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub files: Files,
    /// How long the driver may take to say it is ready.
    pub start_timeout: Duration,
}

impl Open {
    pub fn encode(&self) -> Vec<Bytes> {
        let mut head = MAGIC.to_vec();
        let driver = self.driver.as_deref().map(argv).unwrap_or_default();
        record(&mut head, "session", &driver);
        for (k, v) in &self.env {
            record(&mut head, "env", format!("{k}={v}").as_bytes());
        }
        record(
            &mut head,
            "timeout_ms",
            self.start_timeout.as_millis().to_string().as_bytes(),
        );
        let mut tail = Vec::new();
        record(&mut tail, "end", b"");
        vec![Bytes::from(head), self.files.records(), Bytes::from(tail)]
    }
}

/// What runs in an execution.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// A files-only session: an optional check, then the program, as fresh processes.
    Commands {
        check: Option<Vec<String>>,
        run: Vec<String>,
    },
    /// A stateful session: a cell for the driver.
    Cell(Bytes),
}

/// One execution in a session's container.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exec {
    pub work: Work,
    pub env: BTreeMap<String, String>,
    /// Written into the working directory first; they stay.
    pub files: Files,
    pub stdin: Bytes,
    pub check_timeout: Duration,
    pub timeout: Duration,
    pub output_limit: u64,
    pub collect: Collect,
    /// Start a fresh interpreter before the cell.
    pub reset: bool,
    /// How long an interrupted driver has to answer.
    pub interrupt: Duration,
    /// The host's count of this execution (names such as `figure-<n>-1.png`).
    pub execution_count: u64,
}

fn millis(d: Duration) -> Vec<u8> {
    d.as_millis().to_string().into_bytes()
}

impl Exec {
    pub fn encode(&self) -> Vec<Bytes> {
        let mut head = Vec::with_capacity(512);
        record(&mut head, "exec", b"");
        for (k, v) in &self.env {
            record(&mut head, "env", format!("{k}={v}").as_bytes());
        }
        match &self.work {
            Work::Commands { check, run } => {
                if let Some(c) = check {
                    record(&mut head, "check", &argv(c));
                    record(&mut head, "check_timeout_ms", &millis(self.check_timeout));
                }
                record(&mut head, "run", &argv(run));
            }
            Work::Cell(code) => {
                record(&mut head, "cell", code);
                if self.reset {
                    record(&mut head, "reset", b"1");
                }
                record(&mut head, "interrupt_ms", &millis(self.interrupt));
            }
        }
        if self.execution_count > 0 {
            record(
                &mut head,
                "execution_count",
                self.execution_count.to_string().as_bytes(),
            );
        }
        record(&mut head, "timeout_ms", &millis(self.timeout));
        record(
            &mut head,
            "output_limit",
            self.output_limit.to_string().as_bytes(),
        );
        match self.collect {
            outputs @ Collect::Outputs { .. } => outputs_records(&mut head, outputs),
            Collect::None | Collect::WorkspaceOnSuccess { .. } => {
                record(&mut head, "collect", b"none")
            }
        }
        let mut stdin_head = Vec::new();
        stdin_head.extend_from_slice(format!("stdin {}\n", self.stdin.len()).as_bytes());
        let mut tail = Vec::new();
        record(&mut tail, "end", b"");
        vec![
            Bytes::from(head),
            self.files.records(),
            Bytes::from(stdin_head),
            self.stdin.clone(),
            Bytes::from(tail),
        ]
    }
}

/// A file or folder of the working directory, read without running anything.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// Relative to the working directory; `.` for the directory itself.
    pub path: String,
    pub offset: u64,
    pub max_bytes: u64,
}

impl Read {
    pub fn encode(&self) -> Vec<Bytes> {
        let mut v = Vec::new();
        record(&mut v, "read", b"");
        record(&mut v, "path", self.path.as_bytes());
        record(&mut v, "offset", self.offset.to_string().as_bytes());
        record(&mut v, "max_bytes", self.max_bytes.to_string().as_bytes());
        record(&mut v, "end", b"");
        vec![Bytes::from(v)]
    }
}

/// What a request's `D` frame says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Done {
    /// The interpreter after an execution; `None` for a `read` or a failed request.
    pub state: Option<InterpreterState>,
    pub reason: Option<ResetReason>,
    /// Bytes of the result before the cap.
    pub result_bytes: u64,
    /// Bytes used in the working directory's filesystem.
    pub workspace_bytes: Option<u64>,
    /// The request failed, or a `read` could not be answered.
    pub error: Option<String>,
}

/// Longest `error` text kept from a `D` frame.
const MAX_ERROR: usize = 4096;

/// Read a `D` frame's `key=value` lines.
pub(super) fn parse_done(text: &str) -> Result<Done, ProtocolError> {
    let mut done = Done::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let number = || {
            v.parse::<u64>()
                .map_err(|_| ProtocolError(format!("a done frame's {k} is not a number: {v:?}")))
        };
        match k {
            "state" => {
                done.state = Some(match v {
                    "new" => InterpreterState::New,
                    "kept" => InterpreterState::Kept,
                    "reset" => InterpreterState::Reset,
                    _ => return Err(ProtocolError(format!("unknown session state {v:?}"))),
                })
            }
            "reason" => {
                done.reason = Some(match v {
                    "timed_out" => ResetReason::TimedOut,
                    "stopped" => ResetReason::Stopped,
                    "out_of_memory" => ResetReason::OutOfMemory,
                    "driver_exited" => ResetReason::DriverExited,
                    _ => return Err(ProtocolError(format!("unknown reset reason {v:?}"))),
                })
            }
            "result_bytes" => done.result_bytes = number()?,
            "workspace_bytes" => done.workspace_bytes = Some(number()?),
            "error" => done.error = Some(v.chars().take(MAX_ERROR).collect()),
            _ => {}
        }
    }
    if done.state == Some(InterpreterState::Reset) && done.reason.is_none() {
        return Err(ProtocolError("a reset without its reason".into()));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::Entry;

    #[test]
    fn a_done_frame_reads_back_and_odd_ones_are_errors() {
        let d =
            parse_done("state=reset\nreason=timed_out\nresult_bytes=12\nworkspace_bytes=4096\n")
                .unwrap();
        assert_eq!(d.state, Some(InterpreterState::Reset));
        assert_eq!(d.reason, Some(ResetReason::TimedOut));
        assert_eq!((d.result_bytes, d.workspace_bytes), (12, Some(4096)));
        assert_eq!(
            parse_done("error=no such file\n").unwrap().error.as_deref(),
            Some("no such file")
        );
        for bad in [
            "state=lost\n",
            "state=reset\n",
            "state=new\nreason=bored\n",
            "result_bytes=-1\n",
            "workspace_bytes=99999999999999999999999\n",
        ] {
            assert!(parse_done(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_kill_rounds_are_those_of_codebox_init() {
        let c = include_str!("../../../images/base/codebox-init-driver.c");
        let define = format!("#define KILL_ROUNDS_MS {}", KILL_ROUNDS.as_millis());
        assert!(
            c.contains(&define),
            "codebox-init-driver.c has no `{define}`"
        );
    }

    #[test]
    fn requests_are_records_ending_with_end() {
        let exec = Exec {
            work: Work::Cell(Bytes::from_static(b"x = 1\n")),
            env: BTreeMap::new(),
            files: Files::new(&[Entry::file("data.csv", 0o644, &b"a,b\n"[..])]),
            stdin: Bytes::from_static(b"in"),
            check_timeout: Duration::ZERO,
            timeout: Duration::from_secs(30),
            output_limit: 1024,
            collect: Collect::None,
            reset: true,
            interrupt: Duration::from_secs(2),
            execution_count: 3,
        };
        let bytes = exec.encode().concat();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("exec 0\n"), "{text}");
        assert!(text.contains("cell 6\nx = 1\n"), "{text}");
        assert!(text.contains("reset 1\n1"), "{text}");
        assert!(text.contains("execution_count 1\n3"), "{text}");
        assert!(text.contains("file 17\n644 data.csv\0a,b\n"), "{text:?}");
        assert!(text.ends_with("stdin 2\ninend 0\n"), "{text:?}");
        let open = Open {
            driver: Some(vec!["python3".into(), "driver.py".into()]),
            start_timeout: Duration::from_secs(20),
            ..Default::default()
        }
        .encode()
        .concat();
        assert!(open.starts_with(b"codebox-init 1\nsession 18\npython3\0driver.py\0"));
        assert!(open.ends_with(b"end 0\n"));
    }
}
