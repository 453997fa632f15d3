//! From what the engine saw to a status: one function, no guessing from one signal alone.

use crate::engine::{Ending, Execution};
use crate::report::Status;

/// Name of a Linux signal number.
pub fn signal_name(n: i64) -> Option<&'static str> {
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

/// How a stage ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: Status,
    pub exit_code: Option<i64>,
    pub signal: Option<String>,
}

/// Classify a run-stage execution.
///
/// - cancelled: `stopped`; deadline: `timed_out` (we killed it: no exit code, SIGKILL);
/// - `out_of_memory` needs both the engine's OOM flag and a non-zero exit: a program that
///   survived an OOM kill of a child and exited 0 succeeded;
/// - exit codes 129..=159 are a signal death (the container's init reports 128 + n).
pub fn classify(e: &Execution) -> Outcome {
    match e.ending {
        Ending::Cancelled => Outcome {
            status: Status::Stopped,
            exit_code: None,
            signal: Some("SIGKILL".into()),
        },
        Ending::TimedOut => Outcome {
            status: Status::TimedOut,
            exit_code: None,
            signal: Some("SIGKILL".into()),
        },
        Ending::Exited => {
            let code = e.exit_code.unwrap_or(-1);
            let signal = (129..=159)
                .contains(&code)
                .then(|| signal_name(code - 128))
                .flatten()
                .map(str::to_string);
            let status = if code == 0 {
                Status::Succeeded
            } else if e.oom_killed {
                Status::OutOfMemory
            } else {
                Status::Failed
            };
            Outcome {
                status,
                exit_code: e.exit_code,
                signal,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::exited;

    #[test]
    fn exit_codes_map_to_statuses_and_signals() {
        assert_eq!(classify(&exited(0, "")).status, Status::Succeeded);
        let o = classify(&exited(3, ""));
        assert_eq!(
            (o.status, o.exit_code, o.signal),
            (Status::Failed, Some(3), None)
        );
        let o = classify(&exited(139, ""));
        assert_eq!(o.signal.as_deref(), Some("SIGSEGV"));
        assert_eq!(o.status, Status::Failed);
    }

    #[test]
    fn oom_needs_the_engine_flag_not_just_exit_137() {
        let plain_kill = exited(137, "");
        let o = classify(&plain_kill);
        assert_eq!(
            (o.status, o.signal.as_deref()),
            (Status::Failed, Some("SIGKILL"))
        );
        let mut oom = exited(137, "");
        oom.oom_killed = true;
        assert_eq!(classify(&oom).status, Status::OutOfMemory);
        let mut survived = exited(0, "");
        survived.oom_killed = true;
        assert_eq!(classify(&survived).status, Status::Succeeded);
    }

    #[test]
    fn deadline_and_cancel_win_over_exit_code() {
        let mut t = exited(137, "partial");
        t.ending = Ending::TimedOut;
        assert_eq!(classify(&t).status, Status::TimedOut);
        t.ending = Ending::Cancelled;
        assert_eq!(classify(&t).status, Status::Stopped);
    }
}
