//! The container engine: one trait in front of Docker, so the executor can be tested against a
//! fake that records every spec it is asked to create.
//!
//! `docker.rs` is the only file that knows bollard. `posture.rs` builds and re-checks the
//! locked-down spec; `guard.rs` owns removal.

pub mod docker;
pub mod fake;
pub mod guard;
pub mod posture;
pub mod seccomp;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::report::Usage;

/// Label on every container and volume codebox creates.
pub const LABEL_MANAGED: &str = "codebox.managed";
/// Label carrying the run id.
pub const LABEL_RUN: &str = "codebox.run";
/// Label carrying the id of the codebox process that created the object.
pub const LABEL_INSTANCE: &str = "codebox.instance";
/// Label carrying the Unix time after which the object is certainly abandoned.
pub const LABEL_EXPIRES: &str = "codebox.expires";

/// A volume mounted into a container.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub kind: MountKind,
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MountKind {
    /// A Docker volume (what codebox uses for the workspace).
    Volume,
    /// A host path. Never produced by codebox; representable so the posture check can refuse it.
    Bind,
}

/// Everything about a container to create, engine-neutral. Built by [`posture::locked_down`],
/// checked by [`posture::check`].
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    /// Container name, chosen before create so that a create interrupted mid-flight can
    /// still be removed by name.
    pub name: String,
    pub image: String,
    pub cmd: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub user: String,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
    pub network_mode: String,
    pub readonly_rootfs: bool,
    pub cap_drop: Vec<String>,
    pub cap_add: Vec<String>,
    pub security_opt: Vec<String>,
    pub privileged: bool,
    pub pids_limit: i64,
    pub memory_bytes: i64,
    pub memory_swap_bytes: i64,
    pub nano_cpus: i64,
    /// tmpfs mounts: path -> mount options.
    pub tmpfs: BTreeMap<String, String>,
    /// Size of `/dev/shm` (a noexec tmpfs Docker always mounts), in bytes.
    pub shm_bytes: i64,
    pub mounts: Vec<Mount>,
    pub devices: Vec<String>,
    /// (name, soft = hard limit)
    pub ulimits: Vec<(String, i64)>,
    /// Keep stdin open so the run can be fed input.
    pub open_stdin: bool,
    /// Run a minimal init as PID 1 (reaps zombies, forwards signals).
    pub init: bool,
}

/// Options for starting a created container and waiting for it.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Bytes written to the program's stdin (then closed). `None`: no stdin.
    pub stdin: Option<Vec<u8>>,
    /// Bytes kept per stream; the rest is counted and dropped.
    pub output_limit: u64,
    /// Wall-clock limit from start.
    pub timeout: Duration,
}

/// One captured output stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Captured {
    /// At most `output_limit` bytes.
    pub data: Vec<u8>,
    /// Every byte the program wrote, kept or not.
    pub total: u64,
}

impl Captured {
    pub fn push(&mut self, chunk: &[u8], limit: u64) {
        self.total += chunk.len() as u64;
        let room = (limit as usize).saturating_sub(self.data.len());
        self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    pub fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

/// How waiting for a container ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ending {
    /// The program exited by itself.
    Exited,
    /// The wall-clock limit was reached and the container was killed.
    TimedOut,
    /// The cancellation token fired and the container was killed.
    Cancelled,
}

/// What happened to a started container.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub ending: Ending,
    /// Exit code as the engine reports it (128 + n when killed by signal n).
    pub exit_code: Option<i64>,
    /// The engine saw the memory cgroup kill a process.
    pub oom_killed: bool,
    pub stdout: Captured,
    pub stderr: Captured,
    pub usage: Usage,
    pub duration: Duration,
}

/// Facts about an image.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImageInfo {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub size_bytes: i64,
}

/// A managed object left behind, as listed by the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Leftover {
    pub id: String,
    pub labels: BTreeMap<String, String>,
}

/// What the engine says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    pub address: String,
    pub version: String,
    pub api_version: String,
}

/// A failed engine operation. Each variant names the step that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error(
        "Docker is not reachable at {address}: start the daemon or set DOCKER_HOST ({detail})"
    )]
    Unreachable { address: String, detail: String },
    #[error("image {tag} is not present: build it with `codebox images build {image}`")]
    ImageMissing { tag: String, image: String },
    #[error("creating the workspace volume failed: {0}")]
    CreateVolume(String),
    #[error("creating the container failed: {0}")]
    CreateContainer(String),
    #[error("copying the code into the container failed: {0}")]
    UploadSources(String),
    #[error("attaching to the container failed: {0}")]
    Attach(String),
    #[error("starting the container failed: {0}")]
    StartContainer(String),
    #[error("waiting for the container failed: {0}")]
    WaitContainer(String),
    #[error("killing the container failed: {0}")]
    KillContainer(String),
    #[error("inspecting the container failed: {0}")]
    InspectContainer(String),
    #[error("removing the container failed: {0}")]
    RemoveContainer(String),
    #[error("removing the volume failed: {0}")]
    RemoveVolume(String),
    #[error("listing managed objects failed: {0}")]
    List(String),
    #[error("inspecting the image failed: {0}")]
    InspectImage(String),
    #[error("building image {tag} failed: {detail}")]
    BuildImage { tag: String, detail: String },
}

/// A line of progress from an image build.
pub type BuildProgress<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// The operations codebox needs from a container engine.
#[async_trait]
pub trait ContainerEngine: Send + Sync + 'static {
    /// Check the engine answers; report its address and version.
    async fn ping(&self) -> Result<EngineInfo, EngineError>;
    /// `Ok(None)` when the image does not exist.
    async fn inspect_image(&self, tag: &str) -> Result<Option<ImageInfo>, EngineError>;
    /// Build an image from a tar of its context (Dockerfile at the root).
    async fn build_image(
        &self,
        tag: &str,
        context_tar: Vec<u8>,
        labels: BTreeMap<String, String>,
        no_cache: bool,
        progress: BuildProgress<'_>,
    ) -> Result<String, EngineError>;
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), EngineError>;
    /// Create a volume backed by a tmpfs of `size_mb`, owned by `uid`. Its content lives
    /// only while some container has it mounted.
    async fn create_tmpfs_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        size_mb: u64,
        uid: u32,
    ) -> Result<(), EngineError> {
        let _ = (labels, size_mb, uid);
        Err(EngineError::CreateVolume(format!(
            "{name}: this engine has no tmpfs volumes"
        )))
    }
    /// Start a created container and leave it running (a holder: it never exits by itself).
    async fn start(&self, id: &str) -> Result<(), EngineError> {
        Err(EngineError::StartContainer(format!(
            "{id}: this engine cannot start containers without waiting"
        )))
    }
    /// Idempotent: removing a volume that does not exist is `Ok`.
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError>;
    /// Create (not start) a container; returns its id.
    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError>;
    /// Extract a tar archive at `path` inside a created container.
    async fn upload(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<(), EngineError>;
    /// Start a created container, feed stdin, capture output, and wait for it to end, killing
    /// it at the timeout or when `cancel` fires.
    async fn start_and_wait(
        &self,
        id: &str,
        options: StartOptions,
        cancel: CancellationToken,
    ) -> Result<Execution, EngineError>;
    /// Force-remove a container and its anonymous volumes. Idempotent.
    async fn remove_container(&self, id: &str) -> Result<(), EngineError>;
    /// Containers carrying `codebox.managed=true`.
    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError>;
    /// Volumes carrying `codebox.managed=true`.
    async fn list_managed_volumes(&self) -> Result<Vec<Leftover>, EngineError>;
}
