//! The Docker engine, over the Engine API (bollard). The only file that imports bollard.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, ContainerUpdateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, BuildImageOptionsBuilder, CreateContainerOptionsBuilder,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::{
    detail, Attached, BuildProgress, Cause, ContainerEngine, ContainerSpec, ContainerState,
    EngineError, EngineInfo, ImageInfo, Leftover, Output, Resources, Signal, LABEL_MANAGED,
};

/// Where bollard looks when `DOCKER_HOST` is not set.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// A Docker daemon reached through the Engine API.
#[derive(Clone)]
pub struct DockerEngine {
    docker: Docker,
    /// Image builds can take many minutes; they get a client with a long timeout.
    builder: Docker,
    address: String,
    /// Set when the client could not even be set up (e.g. the socket does not exist); every
    /// operation then reports the daemon unreachable.
    broken: Option<Cause>,
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
                        source: Arc::new(e2),
                    })?,
                Some(Arc::new(e) as Cause),
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
            Some(cause) => Err(EngineError::Unreachable {
                address: self.address.clone(),
                source: cause.clone(),
            }),
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// Turn a bollard error into the step's error, or `Unreachable` when the daemon could not
    /// be talked to at all.
    fn fail(&self, step: impl FnOnce(Cause) -> EngineError, e: BollardError) -> EngineError {
        match e {
            BollardError::SocketNotFoundError(_)
            | BollardError::HyperLegacyError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError => EngineError::Unreachable {
                address: self.address.clone(),
                source: Arc::new(e),
            },
            other => step(Arc::new(other)),
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

/// The create body for a spec. Every field that matters for isolation is set explicitly.
fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let host_config = HostConfig {
        runtime: Some(spec.runtime.clone()),
        network_mode: Some(spec.network_mode.clone()),
        readonly_rootfs: Some(spec.readonly_rootfs),
        cap_drop: Some(spec.cap_drop.clone()),
        cap_add: Some(Vec::new()),
        security_opt: Some(spec.security_opt.clone()),
        privileged: Some(false),
        pids_limit: Some(spec.pids_limit),
        memory: Some(spec.memory_bytes),
        memory_swap: Some(spec.memory_swap_bytes),
        memory_swappiness: Some(0),
        cpu_quota: Some(spec.cpu_quota_us),
        cpu_period: Some(spec.cpu_period_us),
        tmpfs: Some(to_hash(&spec.tmpfs)),
        shm_size: Some(spec.shm_bytes),
        mounts: Some(Vec::new()),
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
        let unreachable = |e: BollardError| EngineError::Unreachable {
            address: self.address.clone(),
            source: Arc::new(e),
        };
        let v = self.docker.version().await.map_err(unreachable)?;
        let info = self.docker.info().await.map_err(unreachable)?;
        let mut runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        runtimes.sort();
        Ok(EngineInfo {
            address: self.address.clone(),
            version: v.version.unwrap_or_default(),
            api_version: v.api_version.unwrap_or_default(),
            runtimes,
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
        let build_err = |source: Cause| EngineError::BuildImage {
            tag: tag.to_string(),
            source,
        };
        let mut stream =
            self.builder
                .build_image(options, None, Some(bollard::body_full(context_tar.into())));
        let mut image_id = None;
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| self.fail(build_err, e))?;
            if let Some(d) = info.error_detail {
                return Err(build_err(detail(d.message.unwrap_or_default())));
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
                .ok_or_else(|| build_err(detail("the build finished without an image")))?
                .id),
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
            }),
            Err(e) => Err(self.fail(EngineError::CreateContainer, e)),
        }
    }

    async fn start_container(&self, id: &str) -> Result<(), EngineError> {
        self.usable()?;
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| self.fail(EngineError::StartContainer, e))
    }

    async fn attach_container(&self, id: &str) -> Result<Attached, EngineError> {
        self.usable()?;
        let options = AttachContainerOptionsBuilder::new()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .build();
        let attached = self
            .docker
            .attach_container(id, Some(options))
            .await
            .map_err(|e| self.fail(EngineError::Attach, e))?;
        let output = attached.output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    Some(Ok(Output::Stdout(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(Output::Stderr(message))),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(EngineError::ReadOutput(Arc::new(e)))),
            }
        });
        Ok(Attached {
            output: Box::pin(output),
            input: attached.input,
        })
    }

    async fn wait_container(&self, id: &str) -> Result<i64, EngineError> {
        self.usable()?;
        match self
            .docker
            .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>)
            .next()
            .await
        {
            Some(Ok(r)) => Ok(r.status_code),
            // bollard reports any non-zero exit as an error; here it is an outcome.
            Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(self.fail(EngineError::WaitContainer, e)),
            None => Err(EngineError::WaitContainer(detail(
                "the daemon closed the wait without an exit code",
            ))),
        }
    }

    async fn kill_container(&self, id: &str, signal: Signal) -> Result<(), EngineError> {
        self.usable()?;
        let name = match signal {
            Signal::Term => "SIGTERM",
            Signal::Kill => "SIGKILL",
        };
        let options = KillContainerOptionsBuilder::new().signal(name).build();
        match self.docker.kill_container(id, Some(options)).await {
            // Not running (any more), or gone.
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::KillContainer, e)),
        }
    }

    async fn inspect_container(&self, id: &str) -> Result<ContainerState, EngineError> {
        self.usable()?;
        let c = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| self.fail(EngineError::InspectContainer, e))?;
        let state = c.state.unwrap_or_default();
        Ok(ContainerState {
            running: state.running.unwrap_or(false),
            exit_code: state.exit_code.filter(|_| !state.running.unwrap_or(false)),
            oom_killed: state.oom_killed.unwrap_or(false),
            image_id: c.image,
        })
    }

    async fn update_container(&self, id: &str, resources: Resources) -> Result<(), EngineError> {
        self.usable()?;
        let body = ContainerUpdateBody {
            memory: Some(resources.memory_bytes),
            memory_swap: Some(resources.memory_bytes),
            cpu_quota: Some(resources.cpu_quota_us),
            cpu_period: Some(resources.cpu_period_us),
            ..Default::default()
        };
        self.docker
            .update_container(id, body)
            .await
            .map_err(|e| self.fail(EngineError::UpdateContainer, e))
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

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.usable()?;
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Err(e) if is_status(&e, 404) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::RemoveVolume, e)),
        }
    }
}
