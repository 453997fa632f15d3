//! How a run ends, in the words the executor and its stages share: why the sequence halted,
//! what the stages learnt on the way, how the run ended, and the limits every stage keeps.
//! A leaf: it uses the stages' own vocabulary, never the executor's face.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::outcome::{Outcome, Streams};
use super::packages::{InstallEnd, Prefix};
use super::stage::{Bound, BoundError, Interrupted};
use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::posture::PostureViolation;
use crate::engine::protocol::Entry;
use crate::engine::EngineError;
use crate::live::Feed;
use crate::report::{CompileReport, FileReport, PackagesReport, Stage, Status, TestReport};

pub(super) use super::stage::BACKSTOP_GRACE;
/// Space a file or directory takes in a tmpfs beyond its content, roughly.
pub(super) const ENTRY_OVERHEAD_BYTES: u64 = 4096;

/// One run (or session execution) as the executor is asked to carry it out.
pub struct Call<'a> {
    pub run_id: &'a str,
    pub req: &'a ValidRequest,
    /// How long it waited for admission, for its report.
    pub queued_ms: u64,
    pub cancel: CancellationToken,
    /// Where it is shown as it goes, when someone may watch.
    pub feed: Option<&'a Arc<Feed>>,
}

impl Call<'_> {
    /// What its stages answer to: its stop, its deadline (its limits, the install step's
    /// when it asks for packages, and the backstop grace) and its feed.
    pub(super) fn bound(&self, config: &Config) -> Bound<'_> {
        Bound {
            cancel: &self.cancel,
            deadline: tokio::time::Instant::now()
                + budget_with_install(config, self.req)
                + BACKSTOP_GRACE,
            feed: self.feed,
            case: None,
        }
    }
}

/// Why a run could not be carried out: the sandbox's fault, never the program's.
#[derive(Debug, thiserror::Error)]
pub enum SandboxFailure {
    #[error("image {tag} is not present: build it with `codebox images build {image}`")]
    ImageMissing { tag: String, image: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Posture(#[from] PostureViolation),
    /// The run's deadline passed while Docker had not answered a call.
    #[error("{0}")]
    Late(Interrupted),
    #[error("the program's files take {needed_mb} MB, more than its {workspace_mb} MB working directory holds (sandbox.workspace_mb = {setting_mb}, at most half of the run's memory)")]
    WorkspaceTooSmall {
        needed_mb: u64,
        workspace_mb: u64,
        setting_mb: u64,
    },
    #[error("the compile stage handed back a path outside its working directory: {path:?}")]
    ArtifactPath { path: String },
    #[error("the compile stage did not start")]
    CompileNotStarted,
    /// `codebox-init`'s own fatal error, as the container wrote it.
    #[error("{0}")]
    InitFatal(String),
    /// A stage's end that classifying its frames could not explain (the problem found).
    #[error("{0}")]
    Unexplained(String),
    /// A stop came while the image was being looked up.
    #[error("stopped")]
    Stopped,
    /// A stop came while a session's container was being opened.
    #[error("stopped while opening")]
    StoppedOpening,
    /// The packages' install step ended the opening (its own message).
    #[error("{0}")]
    Install(String),
    /// The image cannot carry the programs' egress relay (the reason, naming the image).
    #[error("{0}")]
    Egress(String),
    /// A session's helper answered its opening with an error (its text).
    #[error("{0}")]
    OpenRefused(String),
    /// A session's helper ended its opening without an answer.
    #[error("the session's container did not open")]
    NotOpened,
    /// A session's container broke while it was being opened.
    #[error("the session's container did not open: {0}")]
    OpenBroken(#[source] Broken),
    /// A session's container broke during an execution (why).
    #[error("the session ended: its sandbox failed: {0}")]
    SessionBroke(String),
    /// A session's helper answered an execution with an error (its text).
    #[error("{0}")]
    ExecutionRefused(String),
}

/// Why a session's container serves nothing more.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Broken {
    /// The container died of an out-of-memory kill (under gVisor, one takes its kernel).
    #[error("out of memory")]
    OutOfMemory,
    #[error("its sandbox failed: {0}")]
    Failed(String),
}

/// Why the stage sequence ended before its end.
pub(super) enum Halt {
    /// A stop came before the program could run.
    Stopped,
    Failed(SandboxFailure),
}

impl<E: Into<SandboxFailure>> From<E> for Halt {
    fn from(e: E) -> Halt {
        Halt::Failed(e.into())
    }
}

impl From<BoundError> for SandboxFailure {
    fn from(e: BoundError) -> SandboxFailure {
        match e {
            BoundError::Engine(e) => SandboxFailure::Engine(e),
            BoundError::Interrupted(i) => SandboxFailure::Late(i),
        }
    }
}

impl Halt {
    pub(super) fn bound(e: BoundError) -> Halt {
        match e {
            BoundError::Interrupted(Interrupted::Stopped) => Halt::Stopped,
            other => Halt::Failed(other.into()),
        }
    }
}

/// A new run id: 32 lowercase hex digits.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub(super) fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

pub(super) fn mb(n: u64) -> u64 {
    n * 1024 * 1024
}

/// What the stages learnt on the way, whatever ends the run.
#[derive(Default)]
pub(super) struct Known {
    /// The stage the run last entered.
    pub(super) stage: Option<Stage>,
    pub(super) image_id: Option<String>,
    pub(super) compile: Option<CompileReport>,
    pub(super) packages: Option<PackagesReport>,
    /// The installed prefix the run's containers mount read-only.
    pub(super) prefix: Option<Prefix>,
}

/// How the compile stage or the syntax check ended a run.
pub(super) struct CompileEnd {
    pub(super) status: Status,
    pub(super) exit_code: Option<i64>,
    pub(super) signal: Option<String>,
    pub(super) message: String,
}

/// How a run ended, before it becomes a report.
pub(super) enum Ended {
    /// The compile stage or the syntax check ended the run.
    AtCompile(CompileEnd),
    /// The program ran.
    Ran {
        outcome: Outcome,
        streams: Streams,
        files: Vec<FileReport>,
        /// A session's cell: the final expression's value, and whether it was cut.
        result: Option<(String, bool)>,
    },
    /// Every test case ran (or was stopped).
    Cases(Vec<TestReport>),
    /// Stopped before the program ran.
    Stopped,
    Failed(SandboxFailure),
    /// Installing the request's packages failed.
    AtInstall(InstallEnd),
}

/// The longest a run may take: its check or compile stage's limit, then its program's.
pub fn budget(req: &ValidRequest) -> Duration {
    let lang = &req.language;
    let before = if lang.can_fail_to_compile() {
        lang.compile_limits.timeout_seconds
    } else {
        0.0
    };
    Duration::from_secs_f64(before + req.limits.timeout_seconds)
}

/// [`budget`] plus the install step's limit when the run asks for packages.
pub(super) fn budget_with_install(config: &Config, req: &ValidRequest) -> Duration {
    let install = if req.packages.is_empty() {
        Duration::ZERO
    } else {
        Duration::from_secs_f64(config.packages.install_timeout_seconds)
            + BACKSTOP_GRACE
            + Duration::from_secs(30)
    };
    budget(req) + install
}

/// The source and the request's files, as working-directory entries.
pub(super) fn sources(req: &ValidRequest) -> Vec<Entry> {
    let mut entries = vec![Entry::file(
        req.language.source_file.clone(),
        0o644,
        Bytes::from(req.code.clone().into_bytes()),
    )];
    entries.extend(
        req.files
            .iter()
            .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone())),
    );
    entries
}
