//! What the run stage lays out and how long it may take, shared by every test case.

use std::time::Duration;

use bytes::Bytes;

use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::protocol::{Collect, Files, Payload};

/// What the run stage lays out and how long it may take, shared by every test case.
pub(super) struct Program {
    /// The image's `codebox-init` can check in the program's own process.
    pub(super) check_in_run: bool,
    pub(super) files: Files,
    /// The syntax check's limit (zero without one).
    pub(super) check_budget: Duration,
    pub(super) timeout: Duration,
}

impl Program {
    /// The check's and the program's limits together.
    pub(super) fn limit(&self) -> Duration {
        self.check_budget + self.timeout
    }

    pub(super) fn payload(
        &self,
        req: &ValidRequest,
        config: &Config,
        args: &[String],
        stdin: Option<Bytes>,
        check: bool,
        collect: Collect,
    ) -> Payload {
        let lang = &req.language;
        let check = check && lang.check.is_some();
        // One interpreter start where the language can check in the program's process.
        let (check_cmd, mut run, check_in_run) = match (&lang.checked_run, check) {
            (Some(both), true) if self.check_in_run => (None, both.clone(), true),
            _ => (
                lang.check.clone().filter(|_| check),
                lang.run.clone(),
                false,
            ),
        };
        run.extend(args.iter().cloned());
        Payload {
            env: lang.env.clone(),
            check: check_cmd,
            run: Some(run),
            check_in_run,
            check_timeout: self.check_budget,
            timeout: self.timeout,
            output_limit: config.sandbox.output_limit_bytes,
            collect: Some(collect),
            files: self.files.clone(),
            stdin,
        }
    }
}
