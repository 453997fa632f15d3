//! The Docker engine, over the Engine API (bollard). The only file that imports bollard.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount as DockerMount, MountType, ResourcesUlimits,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, BuildImageOptionsBuilder, CreateContainerOptionsBuilder,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, StatsOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::{
    BuildProgress, Captured, ContainerEngine, ContainerSpec, Ending, EngineError, EngineInfo,
    Execution, ImageInfo, Leftover, MountKind, StartOptions, LABEL_MANAGED,
};
use crate::report::Usage;

/// Where bollard looks when `DOCKER_HOST` is not set.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// How often resource usage is sampled while a container runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How long to wait for a killed container to be reported as exited.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long output may keep arriving after the container has exited.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// A Docker daemon reached through the Engine API.
#[derive(Clone)]
pub struct DockerEngine {
    docker: Docker,
    /// Image builds can take many minutes; they get a client with a long timeout.
    builder: Docker,
    address: String,
    /// Set when the client could not even be set up (e.g. the socket does not exist); every
    /// operation then reports the daemon unreachable.
    broken: Option<String>,
}

impl DockerEngine {
    /// Connect as the docker CLI would: `DOCKER_HOST`, else the local socket. Connecting does
    /// not talk to the daemon yet; [`ContainerEngine::ping`] does.
    pub fn connect() -> Result<DockerEngine, EngineError> {
        let address = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_string());
        DockerEngine::connect_to(&address)
    }

    /// Connect to an explicit address (`unix:///path`, `tcp://host:port`).
    ///
    /// A client that cannot be set up (a socket that does not exist) is not an error here:
    /// the engine is returned and every operation reports the daemon unreachable, so callers
    /// get a `sandbox_error` that says where codebox looked.
    pub fn connect_to(address: &str) -> Result<DockerEngine, EngineError> {
        let address = address.to_string();
        let (docker, broken) = match Docker::connect_with_host(&address) {
            Ok(d) => (d, None),
            // A placeholder client that is never used while `broken` is set.
            Err(e) => (
                Docker::connect_with_http("http://127.0.0.1:9", 1, bollard::API_DEFAULT_VERSION)
                    .map_err(|e2| EngineError::Unreachable {
                        address: address.clone(),
                        detail: format!("{e}; {e2}"),
                    })?,
                Some(e.to_string()),
            ),
        };
        Ok(DockerEngine {
            builder: docker.clone().with_timeout(Duration::from_secs(3 * 3600)),
            docker,
            address,
            broken,
        })
    }

    fn usable(&self) -> Result<(), EngineError> {
        match &self.broken {
            None => Ok(()),
            Some(detail) => Err(EngineError::Unreachable {
                address: self.address.clone(),
                detail: detail.clone(),
            }),
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// Turn a bollard error into the step's error, or `Unreachable` when the daemon could not
    /// be talked to at all.
    fn fail(&self, step: fn(String) -> EngineError, e: BollardError) -> EngineError {
        match e {
            BollardError::SocketNotFoundError(_)
            | BollardError::HyperLegacyError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError => EngineError::Unreachable {
                address: self.address.clone(),
                detail: e.to_string(),
            },
            BollardError::DockerResponseServerError { message, .. } => step(message),
            other => step(other.to_string()),
        }
    }
}

fn is_status(e: &BollardError, code: u16) -> bool {
    matches!(e, BollardError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

fn to_hash(labels: &BTreeMap<String, String>) -> HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn managed_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])])
}

/// Read the container's cgroup once and fold it into `usage` (peak memory, CPU time so far).
async fn sample_usage(docker: &Docker, id: &str, usage: &Mutex<Usage>) {
    let opts = StatsOptionsBuilder::new()
        .stream(false)
        .one_shot(true)
        .build();
    let Some(Ok(s)) = docker.stats(id, Some(opts)).next().await else {
        return;
    };
    let mut u = usage.lock().unwrap();
    if let Some(peak) = s
        .memory_stats
        .as_ref()
        .and_then(|m| m.max_usage)
        .filter(|p| *p > 0)
    {
        u.peak_memory_kb = Some(u.peak_memory_kb.unwrap_or(0).max(peak / 1024));
    }
    if let Some(cpu) = s
        .cpu_stats
        .as_ref()
        .and_then(|c| c.cpu_usage.as_ref())
        .and_then(|c| c.total_usage)
        .filter(|c| *c > 0)
    {
        u.cpu_time_ms = Some(u.cpu_time_ms.unwrap_or(0).max(cpu / 1_000_000));
    }
}

/// The create body for a spec. Every field that matters for isolation is set explicitly.
fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let mounts = spec
        .mounts
        .iter()
        .map(|m| DockerMount {
            target: Some(m.target.clone()),
            source: Some(m.source.clone()),
            typ: Some(match m.kind {
                MountKind::Volume => MountType::VOLUME,
                MountKind::Bind => MountType::BIND,
            }),
            read_only: Some(m.read_only),
            ..Default::default()
        })
        .collect();
    let host_config = HostConfig {
        network_mode: Some(spec.network_mode.clone()),
        readonly_rootfs: Some(spec.readonly_rootfs),
        cap_drop: Some(spec.cap_drop.clone()),
        cap_add: Some(spec.cap_add.clone()),
        security_opt: Some(spec.security_opt.clone()),
        privileged: Some(spec.privileged),
        pids_limit: Some(spec.pids_limit),
        memory: Some(spec.memory_bytes),
        memory_swap: Some(spec.memory_swap_bytes),
        memory_swappiness: Some(0),
        nano_cpus: Some(spec.nano_cpus),
        tmpfs: Some(to_hash(&spec.tmpfs)),
        shm_size: Some(spec.shm_bytes),
        mounts: Some(mounts),
        binds: Some(Vec::new()),
        devices: Some(Vec::new()),
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|(name, v)| ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(*v),
                    hard: Some(*v),
                })
                .collect(),
        ),
        init: Some(spec.init),
        ipc_mode: Some("private".to_string()),
        // Output is streamed over attach and capped there; nothing is written to the
        // daemon's disk.
        log_config: Some(bollard::models::HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        auto_remove: Some(false),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        // Not the container id: nothing about the host or the daemon leaks through the name.
        hostname: Some("sandbox".to_string()),
        cmd: Some(spec.cmd.clone()),
        entrypoint: Some(Vec::new()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: Some(spec.user.clone()),
        working_dir: Some(spec.working_dir.clone()),
        labels: Some(to_hash(&spec.labels)),
        network_disabled: Some(spec.network_mode == "none"),
        open_stdin: Some(spec.open_stdin),
        stdin_once: Some(spec.open_stdin),
        attach_stdin: Some(spec.open_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}

#[async_trait]
impl ContainerEngine for DockerEngine {
    async fn ping(&self) -> Result<EngineInfo, EngineError> {
        self.usable()?;
        let v = self
            .docker
            .version()
            .await
            .map_err(|e| EngineError::Unreachable {
                address: self.address.clone(),
                detail: e.to_string(),
            })?;
        Ok(EngineInfo {
            address: self.address.clone(),
            version: v.version.unwrap_or_default(),
            api_version: v.api_version.unwrap_or_default(),
        })
    }

    async fn inspect_image(&self, tag: &str) -> Result<Option<ImageInfo>, EngineError> {
        self.usable()?;
        match self.docker.inspect_image(tag).await {
            Ok(img) => Ok(Some(ImageInfo {
                id: img.id.unwrap_or_default(),
                labels: img
                    .config
                    .and_then(|c| c.labels)
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
                size_bytes: img.size.unwrap_or_default(),
            })),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(self.fail(EngineError::InspectImage, e)),
        }
    }

    async fn build_image(
        &self,
        tag: &str,
        context_tar: Vec<u8>,
        labels: BTreeMap<String, String>,
        no_cache: bool,
        progress: BuildProgress<'_>,
    ) -> Result<String, EngineError> {
        self.usable()?;
        let options = BuildImageOptionsBuilder::new()
            .t(tag)
            .rm(true)
            .forcerm(true)
            .nocache(no_cache)
            .labels(&to_hash(&labels))
            .build();
        let build_err = |detail: String| EngineError::BuildImage {
            tag: tag.to_string(),
            detail,
        };
        let mut stream =
            self.builder
                .build_image(options, None, Some(bollard::body_full(context_tar.into())));
        let mut image_id = None;
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| match self.fail(EngineError::CreateContainer, e) {
                EngineError::Unreachable { address, detail } => {
                    EngineError::Unreachable { address, detail }
                }
                other => build_err(other.to_string()),
            })?;
            if let Some(detail) = info.error_detail {
                return Err(build_err(detail.message.unwrap_or_default()));
            }
            if let Some(line) = info.stream {
                let line = line.trim_end();
                if !line.is_empty() {
                    progress(line);
                }
            }
            if let Some(aux) = info.aux {
                if let Some(id) = aux.id {
                    image_id = Some(id);
                }
            }
        }
        match image_id {
            Some(id) => Ok(id),
            None => Ok(self
                .inspect_image(tag)
                .await?
                .ok_or_else(|| build_err("the build finished without an image".into()))?
                .id),
        }
    }

    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), EngineError> {
        self.usable()?;
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(to_hash(labels)),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| self.fail(EngineError::CreateVolume, e))
    }

    async fn create_tmpfs_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        size_mb: u64,
        uid: u32,
    ) -> Result<(), EngineError> {
        self.usable()?;
        let gid = uid;
        let options = HashMap::from([
            ("type".to_string(), "tmpfs".to_string()),
            ("device".to_string(), "tmpfs".to_string()),
            (
                "o".to_string(),
                format!("size={size_mb}m,uid={uid},gid={gid},mode=0755,nosuid,nodev"),
            ),
        ]);
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.to_string()),
                driver: Some("local".to_string()),
                driver_opts: Some(options),
                labels: Some(to_hash(labels)),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| self.fail(EngineError::CreateVolume, e))
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.usable()?;
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| self.fail(EngineError::StartContainer, e))
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.usable()?;
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Err(e) if is_status(&e, 404) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::RemoveVolume, e)),
        }
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        self.usable()?;
        let options = CreateContainerOptionsBuilder::new()
            .name(&spec.name)
            .build();
        match self
            .docker
            .create_container(Some(options), create_body(spec))
            .await
        {
            Ok(r) => Ok(r.id),
            Err(e) if is_status(&e, 404) => Err(EngineError::ImageMissing {
                tag: spec.image.clone(),
                image: spec.image.clone(),
            }),
            Err(e) => Err(self.fail(EngineError::CreateContainer, e)),
        }
    }

    async fn upload(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<(), EngineError> {
        self.usable()?;
        let options = UploadToContainerOptionsBuilder::new().path(path).build();
        self.docker
            .upload_to_container(id, Some(options), bollard::body_full(tar.into()))
            .await
            .map_err(|e| self.fail(EngineError::UploadSources, e))
    }

    async fn start_and_wait(
        &self,
        id: &str,
        options: StartOptions,
        cancel: CancellationToken,
    ) -> Result<Execution, EngineError> {
        self.usable()?;
        let attach = self
            .docker
            .attach_container(
                id,
                Some(
                    AttachContainerOptionsBuilder::new()
                        .stream(true)
                        .stdout(true)
                        .stderr(true)
                        .stdin(options.stdin.is_some())
                        .build(),
                ),
            )
            .await
            .map_err(|e| self.fail(EngineError::Attach, e))?;
        let mut output = attach.output;
        let mut input = attach.input;

        // Output is shared so that what arrived before a kill is kept even if the reader
        // has to be abandoned.
        let captured = Arc::new(Mutex::new((Captured::default(), Captured::default())));
        let limit = options.output_limit;
        let sink = captured.clone();
        let mut reader = tokio::spawn(async move {
            while let Some(Ok(item)) = output.next().await {
                let mut c = sink.lock().unwrap();
                match item {
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        c.0.push(&message, limit)
                    }
                    LogOutput::StdErr { message } => c.1.push(&message, limit),
                    LogOutput::StdIn { .. } => {}
                }
            }
        });

        let started = Instant::now();
        tracing::debug!(id, "attached");
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| self.fail(EngineError::StartContainer, e))?;

        tracing::debug!(id, ms = started.elapsed().as_millis() as u64, "started");
        let writer = tokio::spawn(async move {
            if let Some(data) = options.stdin {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
            }
            // Keep the write half open until the run ends when there is no stdin.
            std::future::pending::<()>().await;
        });

        let usage = Arc::new(Mutex::new(Usage::default()));
        let sampler = {
            let docker = self.docker.clone();
            let id = id.to_string();
            let usage = usage.clone();
            tokio::spawn(async move {
                loop {
                    sample_usage(&docker, &id, &usage).await;
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
            })
        };

        let wait = {
            let docker = self.docker.clone();
            let id = id.to_string();
            async move {
                match docker
                    .wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>)
                    .next()
                    .await
                {
                    Some(Ok(r)) => Ok(Some(r.status_code)),
                    Some(Err(BollardError::DockerContainerWaitError { code, .. })) => {
                        Ok(Some(code))
                    }
                    Some(Err(e)) => Err(e),
                    None => Ok(None),
                }
            }
        };
        tokio::pin!(wait);
        let ending = tokio::select! {
            r = &mut wait => {
                r.map_err(|e| self.fail(EngineError::WaitContainer, e))?;
                Ending::Exited
            }
            _ = tokio::time::sleep(options.timeout) => Ending::TimedOut,
            _ = cancel.cancelled() => Ending::Cancelled,
        };
        if ending != Ending::Exited {
            // Kill first, at the deadline: a stats read can take up to a second on this API
            // (the daemon answers at its next collection tick), so no last sample here.
            sampler.abort();
            let kill = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
            match self.docker.kill_container(id, Some(kill)).await {
                Ok(()) => {}
                // Already exited between the deadline and the kill.
                Err(e) if is_status(&e, 409) => {}
                Err(e) => {
                    sampler.abort();
                    writer.abort();
                    reader.abort();
                    return Err(self.fail(EngineError::KillContainer, e));
                }
            }
            tracing::debug!(id, ms = started.elapsed().as_millis() as u64, "killed");
            let _ = tokio::time::timeout(KILL_GRACE, &mut wait).await;
        }
        let duration = started.elapsed();
        tracing::debug!(id, ms = duration.as_millis() as u64, ?ending, "ended");
        sampler.abort();
        writer.abort();
        if tokio::time::timeout(DRAIN_GRACE, &mut reader)
            .await
            .is_err()
        {
            reader.abort();
        }

        let state = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| self.fail(EngineError::InspectContainer, e))?
            .state
            .unwrap_or_default();
        let (stdout, stderr) = captured.lock().unwrap().clone();
        let usage = usage.lock().unwrap().clone();
        Ok(Execution {
            ending,
            exit_code: state.exit_code,
            oom_killed: state.oom_killed.unwrap_or(false),
            stdout,
            stderr,
            usage,
            duration,
        })
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        self.usable()?;
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(options)).await {
            Err(e) if is_status(&e, 404) => Ok(()),
            // "removal already in progress"
            Err(e) if is_status(&e, 409) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::RemoveContainer, e)),
        }
    }

    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError> {
        self.usable()?;
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&managed_filter())
            .build();
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| self.fail(EngineError::List, e))?;
        Ok(list
            .into_iter()
            .map(|c| Leftover {
                id: c.id.unwrap_or_default(),
                labels: c.labels.unwrap_or_default().into_iter().collect(),
            })
            .collect())
    }

    async fn list_managed_volumes(&self) -> Result<Vec<Leftover>, EngineError> {
        self.usable()?;
        let options = ListVolumesOptionsBuilder::new()
            .filters(&managed_filter())
            .build();
        let list = self
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(|e| self.fail(EngineError::List, e))?;
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| Leftover {
                id: v.name,
                labels: v.labels.into_iter().collect(),
            })
            .collect())
    }
}
