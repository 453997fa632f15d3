//! From what a stage reported to a status: one function, no guessing from one signal alone.

use super::stage::{Answer, HostEnding};
use crate::engine::protocol::{End, Phase, PhaseEnd};
use crate::engine::EngineError;
use crate::report::{Status, Usage};

/// Name of a Linux signal number.
pub(crate) fn signal_name(n: i64) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i).copied())
}

/// How one phase (a check, a compile, a program) ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub status: Status,
    /// The exit code; `128 + n` for a death by signal n; null when codebox ended it.
    pub exit_code: Option<i64>,
    pub signal: Option<String>,
    /// What went wrong in the sandbox, for `sandbox_error`.
    pub problem: Option<String>,
    pub usage: Usage,
}

fn usage(end: &PhaseEnd) -> Usage {
    Usage {
        cpu_time_ms: end.cpu_ms,
        peak_memory_kb: end.peak_kb,
    }
}

/// Classify a phase of a stage.
///
/// - what `codebox-init` reported wins: an exit code, a signal, its own deadline or a stop;
/// - `out_of_memory` needs a death (or non-zero exit) *and* evidence of the memory cgroup
///   killing: its OOM counter rose during the phase, or the engine saw an OOM kill. A program
///   that survived a child's OOM kill and exited 0 succeeded;
/// - without a report, the host's view decides: its stop, its deadline, the engine's OOM
///   flag; anything else is a broken sandbox, described.
pub(crate) fn classify(phase: Option<&Phase>, stage: &Answer) -> Outcome {
    let oom_seen = |end: &PhaseEnd| end.oom_kills.unwrap_or(0) > 0 || stage.oom_killed;
    let killed = |status: Status, usage: Usage| Outcome {
        status,
        exit_code: None,
        signal: Some("SIGKILL".into()),
        problem: None,
        usage,
    };
    if let Some(end) = phase.and_then(|p| p.end.as_ref()) {
        let u = usage(end);
        return match &end.end {
            End::Exited(0) => Outcome {
                status: Status::Succeeded,
                exit_code: Some(0),
                signal: None,
                problem: None,
                usage: u,
            },
            End::Exited(code) => Outcome {
                status: if oom_seen(end) {
                    Status::OutOfMemory
                } else {
                    Status::Failed
                },
                exit_code: Some(*code),
                signal: None,
                problem: None,
                usage: u,
            },
            End::Signaled(n) => Outcome {
                status: if *n == 9 && oom_seen(end) {
                    Status::OutOfMemory
                } else {
                    Status::Failed
                },
                // The decoder admits 1 to 64 only; checked all the same.
                exit_code: 128i64.checked_add(*n),
                signal: Some(
                    signal_name(*n)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("signal {n}")),
                ),
                problem: None,
                usage: u,
            },
            End::TimedOut => killed(Status::TimedOut, u),
            End::Stopped => killed(Status::Stopped, u),
            End::Error(text) => Outcome {
                status: Status::SandboxError,
                exit_code: None,
                signal: None,
                problem: Some(text.clone()),
                usage: u,
            },
        };
    }
    let started = phase.is_some();
    // The daemon stopped answering: nothing is known of how the program ended.
    if let Some(e @ EngineError::Unresponsive { .. }) = &stage.stream_error {
        return Outcome {
            status: Status::SandboxError,
            exit_code: None,
            signal: None,
            problem: Some(e.to_string()),
            usage: Usage::default(),
        };
    }
    if stage.host_ending == HostEnding::Stopped {
        return killed(Status::Stopped, Usage::default());
    }
    if stage.oom_killed && started {
        return Outcome {
            status: Status::OutOfMemory,
            exit_code: Some(137),
            signal: Some("SIGKILL".into()),
            problem: None,
            usage: Usage::default(),
        };
    }
    if stage.host_ending == HostEnding::Backstop && started {
        return killed(Status::TimedOut, Usage::default());
    }
    let problem = if let Some(e) = &stage.protocol_error {
        e.clone()
    } else if let Some(e) = &stage.stream_error {
        e.to_string()
    } else if let Some(fatal) = &stage.decoded.fatal {
        fatal.clone()
    } else if stage.host_ending == HostEnding::Backstop {
        "the container did not answer within its time limit; it was killed".to_string()
    } else if let Some(signal) = stage
        .exit_code
        .filter(|c| *c > 128)
        .and_then(|c| signal_name(c - 128))
    {
        let code = stage.exit_code.unwrap_or_default();
        if signal == "SIGKILL" {
            // Nothing inside the container can SIGKILL its PID 1, and the OOM killer would
            // have been seen: this came from outside. Except on Podman under gVisor, where the
            // memory cgroup's kill of gVisor's kernel is recorded nowhere Podman shows.
            format!("the container was killed by SIGKILL (exit code {code}) before codebox-init reported: something outside codebox ended it, e.g. `docker kill` or a restart of the daemon (or, under gVisor on Podman, its memory limit: Podman does not report gVisor's out-of-memory kills)")
        } else {
            format!("codebox-init died of {signal} (exit code {code}) before it reported")
        }
    } else {
        let said = String::from_utf8_lossy(&stage.stderr);
        let said = said.trim();
        format!(
            "the container ended (exit code {}) before codebox-init reported{}",
            stage
                .exit_code
                .map_or_else(|| "unknown".to_string(), |c| c.to_string()),
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )
    };
    Outcome {
        status: Status::SandboxError,
        exit_code: None,
        signal: None,
        problem: Some(problem),
        usage: Usage::default(),
    }
}

/// A stage's output as text, and what the report says about its size.
pub(super) struct Streams {
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

impl Streams {
    pub fn of(phase: Option<&Phase>) -> Streams {
        let Some(p) = phase else {
            return Streams {
                stdout: String::new(),
                stderr: String::new(),
                stdout_bytes: 0,
                stderr_bytes: 0,
            };
        };
        let (out, err) = p
            .end
            .as_ref()
            .map_or((0, 0), |e| (e.stdout_bytes, e.stderr_bytes));
        Streams {
            stdout: String::from_utf8_lossy(&p.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&p.stderr).into_owned(),
            stdout_bytes: out.max(p.stdout.len() as u64),
            stderr_bytes: err.max(p.stderr.len() as u64),
        }
    }

    pub fn stdout_truncated(&self) -> bool {
        self.stdout_bytes > self.stdout.len() as u64
    }

    pub fn stderr_truncated(&self) -> bool {
        self.stderr_bytes > self.stderr.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::{Decoded, PhaseName};
    use std::time::Duration;

    fn stage() -> Answer {
        Answer {
            decoded: Decoded::default(),
            protocol_error: None,
            stream_error: None,
            stderr: Vec::new(),
            host_ending: HostEnding::Finished,
            exit_code: Some(0),
            oom_killed: false,
            image_id: None,
            duration: Duration::ZERO,
            times: Default::default(),
        }
    }

    fn phase(end: End, oom_kills: u64) -> Phase {
        Phase {
            name: PhaseName::Run,
            stdout: Vec::new(),
            stderr: Vec::new(),
            dropped: 0,
            end: Some(PhaseEnd {
                end,
                wall_ms: 1,
                cpu_ms: Some(7),
                peak_kb: Some(100),
                oom_kills: Some(oom_kills),
                stdout_bytes: 0,
                stderr_bytes: 0,
            }),
        }
    }

    #[test]
    fn exit_codes_and_signals_come_from_the_wait_status() {
        let s = stage();
        assert_eq!(
            classify(Some(&phase(End::Exited(0), 0)), &s).status,
            Status::Succeeded
        );
        let o = classify(Some(&phase(End::Exited(3), 0)), &s);
        assert_eq!(
            (o.status, o.exit_code, o.signal),
            (Status::Failed, Some(3), None)
        );
        assert_eq!(o.usage.cpu_time_ms, Some(7));
        let o = classify(Some(&phase(End::Signaled(11), 0)), &s);
        assert_eq!(
            (o.status, o.exit_code, o.signal.as_deref()),
            (Status::Failed, Some(139), Some("SIGSEGV"))
        );
        // An exit code of 139 is just an exit code.
        let o = classify(Some(&phase(End::Exited(139), 0)), &s);
        assert_eq!((o.status, o.signal), (Status::Failed, None));
    }

    #[test]
    fn a_container_killed_from_outside_is_a_sandbox_error_that_says_so() {
        let mut s = stage();
        s.exit_code = Some(137);
        let started = Phase {
            end: None,
            ..phase(End::Exited(0), 0)
        };
        let o = classify(Some(&started), &s);
        assert_eq!(o.status, Status::SandboxError);
        assert!(
            o.problem
                .as_deref()
                .unwrap()
                .starts_with("the container was killed by SIGKILL (exit code 137) before codebox-init reported: something outside codebox ended it"),
            "{o:?}"
        );
        assert!(
            o.problem
                .as_deref()
                .unwrap()
                .contains("under gVisor on Podman, its memory limit"),
            "{o:?}"
        );
        s.exit_code = Some(139);
        assert_eq!(
            classify(Some(&started), &s).problem.as_deref(),
            Some("codebox-init died of SIGSEGV (exit code 139) before it reported")
        );
        s.exit_code = Some(1);
        assert_eq!(
            classify(Some(&started), &s).problem.as_deref(),
            Some("the container ended (exit code 1) before codebox-init reported")
        );
    }

    #[test]
    fn oom_needs_a_kill_and_evidence_of_the_memory_cgroup() {
        let mut s = stage();
        let plain_kill = classify(Some(&phase(End::Signaled(9), 0)), &s);
        assert_eq!(
            (plain_kill.status, plain_kill.signal.as_deref()),
            (Status::Failed, Some("SIGKILL"))
        );
        let counted = classify(Some(&phase(End::Signaled(9), 1)), &s);
        assert_eq!(counted.status, Status::OutOfMemory);
        s.oom_killed = true;
        assert_eq!(
            classify(Some(&phase(End::Signaled(9), 0)), &s).status,
            Status::OutOfMemory
        );
        assert_eq!(
            classify(Some(&phase(End::Exited(0), 1)), &s).status,
            Status::Succeeded,
            "surviving a child's OOM kill is success"
        );
        assert_eq!(
            classify(Some(&phase(End::Exited(137), 1)), &stage()).status,
            Status::OutOfMemory,
            "a shell whose child was OOM-killed"
        );
    }

    #[test]
    fn without_a_report_the_host_decides() {
        let started = Phase {
            end: None,
            ..phase(End::Exited(0), 0)
        };
        let mut s = stage();
        s.host_ending = HostEnding::Stopped;
        assert_eq!(classify(Some(&started), &s).status, Status::Stopped);
        let mut s = stage();
        s.host_ending = HostEnding::Backstop;
        assert_eq!(classify(Some(&started), &s).status, Status::TimedOut);
        assert_eq!(classify(None, &s).status, Status::SandboxError);
        let mut s = stage();
        s.oom_killed = true;
        assert_eq!(classify(Some(&started), &s).status, Status::OutOfMemory);
        let mut s = stage();
        s.exit_code = Some(127);
        s.stderr = b"exec: codebox-init: not found".to_vec();
        let o = classify(None, &s);
        assert_eq!(o.status, Status::SandboxError);
        let p = o.problem.unwrap();
        assert!(p.contains("127") && p.contains("not found"), "{p}");
    }
}
