//! The container engine: one trait in front of Docker, one method per Engine API call, so the
//! stage logic above it (deadline, kill, drain) is engine-neutral and tested on a fake.
//!
//! `docker/` is the only folder that knows bollard. `posture.rs` builds and re-checks the
//! locked-down spec; `guard.rs` owns removal; `fake.rs` records every spec and can fail at
//! every operation.

pub mod docker;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod guard;
pub mod posture;
pub mod protocol;
pub mod seccomp;
pub mod uids;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::Stream;
use tokio::io::AsyncWrite;

/// Label on every container and volume codebox creates.
pub(crate) const LABEL_MANAGED: &str = "codebox.managed";
/// Label carrying the run id (`pool` for a container started before its run).
pub(crate) const LABEL_RUN: &str = "codebox.run";
/// Label carrying the id of the codebox process that created the object.
pub(crate) const LABEL_INSTANCE: &str = "codebox.instance";
/// Label carrying the Unix time after which the object is certainly abandoned.
pub(crate) const LABEL_EXPIRES: &str = "codebox.expires";
/// Image label listing what the image's `codebox-init` takes beyond its first protocol
/// (`images/base/Dockerfile` sets it; language images inherit it), e.g. `check_in_run`.
pub(crate) const LABEL_INIT_FEATURES: &str = "codebox.init.features";

/// Everything about a container to create, engine-neutral. Built by [`posture::locked_down`],
/// checked by [`posture::check`]. There is no field for host mounts, devices or capabilities
/// to add: a spec cannot express them. The only mounts beyond tmpfs are a named volume of
/// codebox's own (an installed packages prefix, SPEC 13), read-only in every container that
/// runs, and the directory of an egress proxy's socket, always read-only.
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
    /// The OCI runtime (`runc`, `runsc`, ...).
    pub runtime: String,
    pub network_mode: String,
    pub readonly_rootfs: bool,
    pub cap_drop: Vec<String>,
    pub security_opt: Vec<String>,
    pub privileged: bool,
    pub pids_limit: i64,
    pub memory_bytes: i64,
    pub memory_swap_bytes: i64,
    /// CPU quota per `CPU_PERIOD_US` (quota and period rather than NanoCpus, so that a
    /// started container's share can still be updated).
    pub cpu_quota_us: i64,
    pub cpu_period_us: i64,
    /// tmpfs mounts: path -> mount options.
    pub tmpfs: BTreeMap<String, String>,
    /// Size of `/dev/shm` (a noexec tmpfs Docker always mounts), in bytes.
    pub shm_bytes: i64,
    /// (name, soft = hard limit)
    pub ulimits: Vec<(String, i64)>,
    /// Keep stdin open: the payload arrives there.
    pub open_stdin: bool,
    /// Docker's own init as PID 1. Off: `codebox-init` is PID 1.
    pub init: bool,
    /// Named volumes of codebox's own (installed package prefixes).
    pub volumes: Vec<VolumeMount>,
    /// The host directory of an egress proxy's socket, mounted read-only at
    /// `posture::EGRESS_MOUNT` (an install container, or a program under
    /// `sandbox.egress_hosts`): the only host path a spec can name.
    pub egress: Option<String>,
}

/// A named volume mounted into a container.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeMount {
    pub volume: String,
    pub target: String,
    pub read_only: bool,
}

/// CPU accounting period of every container, in microseconds.
pub(crate) const CPU_PERIOD_US: i64 = 100_000;

/// Memory and CPU of a container, as created or updated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources {
    pub memory_bytes: i64,
    pub cpu_quota_us: i64,
    pub cpu_period_us: i64,
}

/// A chunk of a container's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// The container's output stream, until it exits.
pub(crate) type OutputStream = Pin<Box<dyn Stream<Item = Result<Output, EngineError>> + Send>>;
/// The container's stdin; shutting it down closes the program's stdin.
pub(crate) type InputSink = Pin<Box<dyn AsyncWrite + Send>>;

/// An attach connection.
pub struct Attached {
    pub output: OutputStream,
    pub input: InputSink,
}

/// A signal codebox sends to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ask `codebox-init` to stop the program and report.
    Term,
    /// End everything at once.
    Kill,
}

/// What the engine knows about a container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerState {
    pub running: bool,
    /// The exit code of PID 1, once it exited.
    pub exit_code: Option<i64>,
    /// The engine saw the memory cgroup kill a process.
    pub oom_killed: bool,
    /// The image id it was created from.
    pub image_id: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineInfo {
    pub address: String,
    pub version: String,
    pub api_version: String,
    /// OCI runtimes the daemon offers (`runc`, `runsc`, ...).
    pub runtimes: Vec<String>,
    /// Each runtime's program and the arguments the daemon gives it, where the daemon says
    /// (`runsc` -> (`/usr/bin/runsc`, [`--network=none`, ...])).
    pub runtime_args: BTreeMap<String, (String, Vec<String>)>,
    /// The cgroup version of the daemon's host (1 or 2), when the daemon says.
    pub cgroup_version: Option<u8>,
    /// The daemon's security options as it lists them (`name=apparmor`, `name=rootless`,
    /// `name=seccomp,profile=default`, ...).
    pub security_options: Vec<String>,
    /// Whether the daemon is Podman's Docker-compatible service rather than Docker.
    pub podman: bool,
    /// The runtime a container gets when it names none (`DefaultRuntime`; empty when the
    /// daemon does not say).
    pub default_runtime: String,
}

/// Why a container that asks for `asked` would not get it from Podman, whose default runtime
/// is `default`: Podman 4's Docker-compatible API ignores the runtime a container names
/// (`HostConfig.Runtime`) and runs it under its default, so a gVisor asked for would silently
/// be the host's kernel. `runc`, codebox's default, asks for no sandbox of its own: under
/// Podman it means Podman's default (runc or crun: the host's kernel either way).
pub(crate) fn podman_runtime_problem(asked: &str, default: &str) -> Option<String> {
    if asked == "runc" || asked == default {
        return None;
    }
    let default = if default.is_empty() {
        "its default runtime".to_string()
    } else {
        format!("its default runtime `{default}`")
    };
    Some(format!(
        "the daemon is Podman, whose Docker-compatible API runs every container under \
         {default} whatever the container asks for, so the runtime `{asked}` cannot be \
         honoured: make `{asked}` Podman's default (runtime = \"{asked}\" under [engine] in \
         /etc/containers/containers.conf) and restart Podman, or set sandbox.runtime (and \
         packages.install_runtime) to Podman's default"
    ))
}

impl EngineInfo {
    /// Why containers asking for `runtime` would not get it from this daemon as codebox needs
    /// it: Podman gives every container its default runtime; a runtime registered with
    /// `--ignore-cgroups` (how gVisor is made to start under rootless Docker) applies no
    /// memory, CPU or process limit.
    pub(crate) fn runtime_problem(&self, runtime: &str) -> Option<String> {
        if self.podman {
            if let Some(p) = podman_runtime_problem(runtime, &self.default_runtime) {
                return Some(p);
            }
        }
        let (_, args) = self.runtime_args.get(runtime)?;
        let ignores = args.iter().any(|a| {
            matches!(
                a.trim_start_matches('-'),
                "ignore-cgroups" | "ignore-cgroups=true"
            )
        });
        ignores.then(|| {
            format!(
                "the runtime `{runtime}` is registered with --ignore-cgroups, so the daemon's \
                 memory, CPU and process limits are not applied to its containers: register it \
                 without that flag (gVisor needs it under rootless Docker, so run gVisor under \
                 rootful Docker or Podman, or use runc there)"
            )
        })
    }

    /// Why containers under `runtime` cannot reach a host Unix socket (the egress proxy's):
    /// a gVisor registered without `--host-uds=open` (or `all`) refuses to connect to one.
    pub(crate) fn host_uds_problem(&self, runtime: &str) -> Option<String> {
        let (path, args) = self.runtime_args.get(runtime)?;
        let gvisor = runtime == "runsc" || path.ends_with("runsc");
        let open = args.iter().any(|a| {
            matches!(
                a.trim_start_matches('-'),
                "host-uds=open" | "host-uds=all" | "fsgofer-host-uds" | "fsgofer-host-uds=true"
            )
        });
        (gvisor && !open).then(|| {
            format!(
                "the runtime `{runtime}` (gVisor) is registered without --host-uds=open, so its containers cannot reach codebox's egress proxy: add \"--host-uds=open\" to its runtimeArgs in the daemon's daemon.json (scripts/ensure-docker.sh --with-runsc does it) and reload the daemon"
            )
        })
    }
}

/// What an engine call failed with, kept as the error's source.
pub(crate) type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// A cause that is only a message (the fake engine, protocol problems).
#[derive(Debug, Clone)]
struct Detail(String);

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Detail {}

/// A cause from a message.
pub(crate) fn detail(message: impl Into<String>) -> Cause {
    Arc::new(Detail(message.into()))
}

/// A failed engine operation. Each variant names the step that failed and keeps what the
/// engine said as its source.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error(
        "Docker is not reachable at {address}: start the daemon or set DOCKER_HOST or docker.host ({source})"
    )]
    Unreachable {
        address: String,
        #[source]
        source: Cause,
    },
    #[error("Docker at {address} refused the connection: it requires a TLS client certificate, and there is none at {} (set docker.cert_path or DOCKER_CERT_PATH to a folder holding ca.pem, cert.pem and key.pem)", cert.display())]
    NoClientCertificate {
        address: String,
        cert: std::path::PathBuf,
    },
    #[error("TLS with Docker at {address} failed: {reason}")]
    Tls { address: String, reason: String },
    #[error("Docker stopped answering while the container was being ended (nothing for {seconds} s after its time was up); codebox keeps trying to remove it, and the next start reaps it if that fails")]
    Unresponsive { seconds: u64 },
    #[error("image {tag} is not present")]
    ImageMissing { tag: String },
    #[error("creating the container failed: {0}")]
    CreateContainer(#[source] Cause),
    #[error("starting the container failed: {0}")]
    StartContainer(#[source] Cause),
    #[error("attaching to the container failed: {0}")]
    Attach(#[source] Cause),
    #[error("reading the container's output failed: {0}")]
    ReadOutput(#[source] Cause),
    #[error("waiting for the container failed: {0}")]
    WaitContainer(#[source] Cause),
    #[error("signalling the container failed: {0}")]
    KillContainer(#[source] Cause),
    #[error("inspecting the container failed: {0}")]
    InspectContainer(#[source] Cause),
    #[error("reading the container's events failed: {0}")]
    ContainerEvents(#[source] Cause),
    #[error("updating the container's limits failed: {0}")]
    UpdateContainer(#[source] Cause),
    #[error("removing the container failed: {0}")]
    RemoveContainer(#[source] Cause),
    #[error("removing the volume failed: {0}")]
    RemoveVolume(#[source] Cause),
    #[error("creating the volume failed: {0}")]
    CreateVolume(#[source] Cause),
    #[error("copying files into the container failed: {0}")]
    Upload(#[source] Cause),
    #[error("copying files out of the container failed: {0}")]
    Download(#[source] Cause),
    #[error("listing managed objects failed: {0}")]
    List(#[source] Cause),
    #[error("inspecting the image failed: {0}")]
    InspectImage(#[source] Cause),
    #[error("building image {tag} failed: {source}")]
    BuildImage {
        tag: String,
        #[source]
        source: Cause,
    },
}

/// A line of progress from an image build.
pub(crate) type BuildProgress<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// The operations codebox needs from a container engine: one per Engine API call.
#[async_trait]
pub trait ContainerEngine: Send + Sync + 'static {
    /// Check the engine answers; report its address, version and runtimes.
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
    /// Create (not start) a container; returns its id. A missing image is
    /// [`EngineError::ImageMissing`].
    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError>;
    async fn start_container(&self, id: &str) -> Result<(), EngineError>;
    /// Attach to stdin, stdout and stderr (what the container wrote before is not replayed).
    async fn attach_container(&self, id: &str) -> Result<Attached, EngineError>;
    /// Wait until the container exits; its exit code, whatever it is (non-zero is `Ok`).
    async fn wait_container(&self, id: &str) -> Result<i64, EngineError>;
    /// Send a signal; a container that already exited is `Ok`.
    async fn kill_container(&self, id: &str, signal: Signal) -> Result<(), EngineError>;
    async fn inspect_container(&self, id: &str) -> Result<ContainerState, EngineError>;
    /// `true` once the engine has recorded an OOM kill of the container, whenever that
    /// happened or happens: Docker's OOM event can come after the exit, too late for the
    /// state `inspect_container` reads. It waits for one; the caller bounds the wait.
    async fn oom_event(&self, id: &str) -> Result<bool, EngineError>;
    /// Change a container's memory and CPU (created with a CPU quota and period).
    async fn update_container(&self, id: &str, resources: Resources) -> Result<(), EngineError>;
    /// Force-remove a container and its anonymous volumes. Idempotent.
    async fn remove_container(&self, id: &str) -> Result<(), EngineError>;
    /// Containers carrying `codebox.managed=true`.
    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError>;
    /// Volumes carrying `codebox.managed=true` (only older codebox versions made any).
    async fn list_managed_volumes(&self) -> Result<Vec<Leftover>, EngineError>;
    /// Idempotent: removing a volume that does not exist is `Ok`.
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError>;
    /// Create a named volume with these labels (an existing one of that name is reused).
    async fn create_volume(
        &self,
        _name: &str,
        _labels: BTreeMap<String, String>,
    ) -> Result<(), EngineError> {
        Err(EngineError::CreateVolume(detail(
            "this engine has no volumes",
        )))
    }
    /// A tar of `path` in a created (not started) container, at most `max_bytes` of it.
    async fn download(
        &self,
        _id: &str,
        _path: &str,
        _max_bytes: u64,
    ) -> Result<Vec<u8>, EngineError> {
        Err(EngineError::Download(detail(
            "this engine cannot copy files",
        )))
    }
    /// Unpack a tar into a created (not started) container at `path`.
    async fn upload(&self, _id: &str, _path: &str, _tar: Vec<u8>) -> Result<(), EngineError> {
        Err(EngineError::Upload(detail("this engine cannot copy files")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gvisor_without_host_uds_is_named_and_others_pass() {
        let info = |args: &[&str]| EngineInfo {
            runtime_args: BTreeMap::from([
                ("runc".to_string(), ("runc".to_string(), Vec::new())),
                (
                    "runsc".to_string(),
                    (
                        "/usr/bin/runsc".to_string(),
                        args.iter().map(|a| a.to_string()).collect(),
                    ),
                ),
            ]),
            ..Default::default()
        };
        let old = info(&["--network=none"]);
        let problem = old.host_uds_problem("runsc").expect("refused");
        assert!(problem.contains("--host-uds=open"), "{problem}");
        assert_eq!(old.host_uds_problem("runc"), None);
        assert_eq!(old.host_uds_problem("unknown"), None);
        let new = info(&["--network=none", "--host-uds=open"]);
        assert_eq!(new.host_uds_problem("runsc"), None);
    }

    #[test]
    fn podman_refuses_a_runtime_other_than_its_default_and_docker_none() {
        let podman = |default: &str| EngineInfo {
            podman: true,
            default_runtime: default.into(),
            ..Default::default()
        };
        // What Podman 4.3 in the guest does: asked runsc, it ran crun (the posture probe saw
        // the host's kernel).
        let problem = podman("crun").runtime_problem("runsc").expect("refused");
        assert!(
            problem.contains("`crun`") && problem.contains("runtime = \"runsc\""),
            "{problem}"
        );
        assert_eq!(podman("runsc").runtime_problem("runsc"), None);
        assert_eq!(podman("crun").runtime_problem("crun"), None);
        // codebox's default asks for the host's kernel, which Podman's default gives.
        assert_eq!(podman("crun").runtime_problem("runc"), None);
        assert!(podman("").runtime_problem("runsc").is_some());
        let docker = EngineInfo {
            default_runtime: "runc".into(),
            ..Default::default()
        };
        assert_eq!(docker.runtime_problem("runsc"), None);
    }

    #[test]
    fn a_runtime_that_ignores_cgroups_is_refused() {
        // How gVisor starts under rootless Docker in the guest; a 64 MB run grew past 700 MB.
        let info = |args: &[&str]| EngineInfo {
            runtime_args: BTreeMap::from([(
                "runsc".to_string(),
                (
                    "/usr/bin/runsc".to_string(),
                    args.iter().map(|a| a.to_string()).collect(),
                ),
            )]),
            ..Default::default()
        };
        let problem = info(&["--network=none", "--ignore-cgroups"])
            .runtime_problem("runsc")
            .expect("refused");
        assert!(problem.contains("--ignore-cgroups"), "{problem}");
        assert_eq!(info(&["--network=none"]).runtime_problem("runsc"), None);
        assert_eq!(info(&["--ignore-cgroups"]).runtime_problem("runc"), None);
    }
}
