//! The Docker engine, over the Engine API (bollard). This folder is the only place that
//! imports bollard: `tls.rs` reaches a remote daemon over TCP and TLS, `spec.rs` turns the
//! locked-down spec into a create body.

mod podman;
mod spec;
mod tls;

use podman::{is_podman, seccomp_form, Dialect};

use spec::{managed_filter, to_hash};
use tls::{connection_detail, is_loopback, tcp_client, tls_error, TlsFiles};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::ContainerUpdateBody;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, BuildImageOptionsBuilder, CreateContainerOptionsBuilder,
    EventsOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;

use crate::config::DockerSettings;

use super::{
    detail, Attached, BuildProgress, Cause, ContainerEngine, ContainerSpec, ContainerState,
    EngineError, EngineInfo, ImageInfo, Leftover, Output, Resources, Signal,
};

pub use crate::config::DEFAULT_DOCKER_HOST;

/// Seconds an Engine API request may take to answer (bollard's default).
const REQUEST_TIMEOUT_SECONDS: u64 = 120;

/// A Docker daemon reached through the Engine API.
#[derive(Clone)]
pub struct DockerEngine {
    client: Client,
    address: String,
    /// The certificates of a TLS connection.
    tls: Option<TlsFiles>,
    /// The network of image builds' `RUN` steps (`docker.build_network`).
    build_network: Option<String>,
    /// How this daemon is spoken to (Docker, or Podman: the seccomp profile as a file, the
    /// tmpfs owner as `U`), learnt from its version answer at the first create.
    dialect: Arc<tokio::sync::OnceCell<Dialect>>,
    /// codebox's data folder: Podman's seccomp profile file is written under it.
    data_dir: std::path::PathBuf,
}

/// The Engine API client, or why there is none.
#[derive(Clone)]
enum Client {
    Ready {
        docker: Docker,
        /// Image builds can take many minutes; they get a client with a long timeout.
        builder: Docker,
    },
    /// The client could not even be set up (e.g. the socket does not exist, the CA
    /// certificate cannot be read): every operation fails with this.
    Unusable(EngineError),
}

impl DockerEngine {
    /// Connect to the daemon the settings name (see [`DockerSettings`]: a local socket, or
    /// `tcp://` with or without TLS). Connecting does not talk to the daemon yet;
    /// [`ContainerEngine::ping`] does.
    ///
    /// A client that cannot be set up (a socket that does not exist, an unreadable CA
    /// certificate) is not an error here: the engine is returned and every operation reports
    /// the problem, so callers get a `sandbox_error` that says where codebox looked.
    pub fn connect(settings: &DockerSettings) -> Result<DockerEngine, EngineError> {
        let address = settings.address().to_string();
        let tls = settings
            .uses_tls()
            .then(|| TlsFiles::in_dir(&settings.cert_dir()));
        if address.starts_with("tcp://") && tls.is_none() && !is_loopback(&address) {
            tracing::warn!(
                address,
                "Docker is reached over plain TCP, without TLS: anyone on the path can read the code and control the daemon (set docker.tls_verify)"
            );
        }
        let client = if address.starts_with("tcp://") {
            tcp_client(&address, tls.as_ref()).map_err(|reason| EngineError::Tls {
                address: address.clone(),
                reason,
            })
        } else {
            Docker::connect_with_host(&address).map_err(|e| EngineError::Unreachable {
                address: address.clone(),
                source: Arc::new(e),
            })
        };
        let client = match client {
            Ok(docker) => Client::Ready {
                builder: docker.clone().with_timeout(Duration::from_secs(3 * 3600)),
                docker,
            },
            Err(e) => Client::Unusable(e),
        };
        Ok(DockerEngine {
            client,
            address,
            tls,
            build_network: settings.build_network.clone(),
            dialect: Arc::default(),
            data_dir: crate::config::Config::default().data_dir,
        })
    }

    /// Keep files of codebox's own (Podman's seccomp profile) under `data_dir` (`data_dir`
    /// of the config; the user's data folder if not told).
    pub(crate) fn with_data_dir(mut self, data_dir: &std::path::Path) -> DockerEngine {
        self.data_dir = data_dir.to_path_buf();
        self
    }

    /// Connect to an explicit address (`unix:///path`, `tcp://host:port` without TLS).
    pub fn connect_to(address: &str) -> Result<DockerEngine, EngineError> {
        DockerEngine::connect(&DockerSettings {
            host: Some(address.to_string()),
            ..DockerSettings::default()
        })
    }

    /// The client, or the error that says why there is none.
    fn docker(&self) -> Result<&Docker, EngineError> {
        match &self.client {
            Client::Ready { docker, .. } => Ok(docker),
            Client::Unusable(e) => Err(e.clone()),
        }
    }

    /// The client for image builds (a long timeout).
    fn builder(&self) -> Result<&Docker, EngineError> {
        match &self.client {
            Client::Ready { builder, .. } => Ok(builder),
            Client::Unusable(e) => Err(e.clone()),
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// How this daemon is spoken to; asks the daemon once.
    async fn dialect(&self) -> Result<&Dialect, EngineError> {
        self.dialect
            .get_or_try_init(|| async {
                let v = self
                    .docker()?
                    .version()
                    .await
                    .map_err(|e| self.unreachable(e))?;
                let podman = version_is_podman(&v);
                let profile = crate::engine::seccomp::security_opt()
                    .strip_prefix("seccomp=")
                    .unwrap_or_default();
                // Podman runs every container under its default runtime: which one it is.
                let default_runtime = if podman {
                    let info = self
                        .docker()?
                        .info()
                        .await
                        .map_err(|e| self.unreachable(e))?;
                    info.default_runtime.unwrap_or_default()
                } else {
                    String::new()
                };
                Ok(Dialect {
                    podman,
                    seccomp: seccomp_form(podman, &self.address, profile, &self.data_dir),
                    default_runtime,
                })
            })
            .await
    }

    /// Turn a bollard error into the step's error, or a connection error when the daemon
    /// could not be talked to at all.
    fn fail(&self, step: impl FnOnce(Cause) -> EngineError, e: BollardError) -> EngineError {
        match e {
            BollardError::SocketNotFoundError(_)
            | BollardError::HyperLegacyError { .. }
            | BollardError::HyperResponseError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError => self.unreachable(e),
            other => step(Arc::new(other)),
        }
    }

    /// The daemon could not be talked to: say why in the operator's terms when TLS is what
    /// failed (no client certificate, one the daemon refused, a daemon certificate that does
    /// not verify against `ca.pem`).
    fn unreachable(&self, e: BollardError) -> EngineError {
        let address = self.address.clone();
        if let (Some(files), Some(tls)) = (&self.tls, tls_error(&e)) {
            return match (tls, files.missing_client_file()) {
                (rustls::Error::AlertReceived(_), Some(missing)) => {
                    EngineError::NoClientCertificate {
                        address,
                        cert: missing.to_path_buf(),
                    }
                }
                (rustls::Error::AlertReceived(alert), None) => EngineError::Tls {
                    address,
                    reason: format!(
                        "the daemon refused the client certificate {} ({alert:?})",
                        files.cert.display()
                    ),
                },
                (other, _) => EngineError::Tls {
                    address,
                    reason: format!(
                        "{other} (the daemon's certificate is checked against {})",
                        files.ca.display()
                    ),
                },
            };
        }
        if self.tls.is_none()
            && matches!(&e, BollardError::DockerResponseServerError { status_code: 400, message } if message.contains("HTTPS"))
        {
            return EngineError::Tls {
                address,
                reason: "the daemon speaks TLS and codebox does not: set docker.tls_verify (or DOCKER_TLS_VERIFY) and docker.cert_path (or DOCKER_CERT_PATH)".to_string(),
            };
        }
        EngineError::Unreachable {
            address,
            source: detail(connection_detail(&e)),
        }
    }
}

/// Whether the daemon that gave this version answer is Podman.
fn version_is_podman(v: &bollard::models::SystemVersion) -> bool {
    is_podman(
        v.components
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .chain(v.platform.as_ref().map(|p| p.name.as_str())),
    )
}

fn is_status(e: &BollardError, code: u16) -> bool {
    matches!(e, BollardError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

#[async_trait]
impl ContainerEngine for DockerEngine {
    async fn ping(&self) -> Result<EngineInfo, EngineError> {
        let v = self
            .docker()?
            .version()
            .await
            .map_err(|e| self.unreachable(e))?;
        let info = self
            .docker()?
            .info()
            .await
            .map_err(|e| self.unreachable(e))?;
        let offered = info.runtimes.unwrap_or_default();
        let runtime_args = offered
            .iter()
            .map(|(name, r)| {
                let path = r.path.clone().unwrap_or_default();
                (
                    name.clone(),
                    (path, r.runtime_args.clone().unwrap_or_default()),
                )
            })
            .collect();
        let mut runtimes: Vec<String> = offered.into_keys().collect();
        runtimes.sort();
        let podman = version_is_podman(&v);
        Ok(EngineInfo {
            address: self.address.clone(),
            version: v.version.unwrap_or_default(),
            api_version: v.api_version.unwrap_or_default(),
            runtimes,
            runtime_args,
            cgroup_version: info.cgroup_version.and_then(|c| c.to_string().parse().ok()),
            security_options: info.security_options.unwrap_or_default(),
            podman,
            default_runtime: info.default_runtime.unwrap_or_default(),
        })
    }

    async fn inspect_image(&self, tag: &str) -> Result<Option<ImageInfo>, EngineError> {
        match self.docker()?.inspect_image(tag).await {
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
        let mut options = BuildImageOptionsBuilder::new()
            .t(tag)
            .rm(true)
            .forcerm(true)
            .nocache(no_cache)
            .labels(&to_hash(&labels));
        if let Some(network) = &self.build_network {
            options = options.networkmode(network);
        }
        let options = options.build();
        let build_err = |source: Cause| EngineError::BuildImage {
            tag: tag.to_string(),
            source,
        };
        let mut stream = self.builder()?.build_image(
            options,
            None,
            Some(bollard::body_full(context_tar.into())),
        );
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
        let options = CreateContainerOptionsBuilder::new()
            .name(&spec.name)
            .build();
        let body = self
            .dialect()
            .await?
            .create_body(spec)
            .map_err(|why| EngineError::CreateContainer(detail(why)))?;
        match self.docker()?.create_container(Some(options), body).await {
            Ok(r) => Ok(r.id),
            Err(e) if is_status(&e, 404) => Err(EngineError::ImageMissing {
                tag: spec.image.clone(),
            }),
            Err(e) => Err(self.fail(EngineError::CreateContainer, e)),
        }
    }

    async fn start_container(&self, id: &str) -> Result<(), EngineError> {
        self.docker()?
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| self.fail(EngineError::StartContainer, e))
    }

    async fn attach_container(&self, id: &str) -> Result<Attached, EngineError> {
        let options = AttachContainerOptionsBuilder::new()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .build();
        let attached = self
            .docker()?
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
        match self
            .docker()?
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
        let name = match signal {
            Signal::Term => "SIGTERM",
            Signal::Kill => "SIGKILL",
        };
        let options = KillContainerOptionsBuilder::new().signal(name).build();
        match self.docker()?.kill_container(id, Some(options)).await {
            // Not running (any more), or gone.
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::KillContainer, e)),
        }
    }

    async fn inspect_container(&self, id: &str) -> Result<ContainerState, EngineError> {
        let c = self
            .docker()?
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

    async fn oom_event(&self, id: &str) -> Result<bool, EngineError> {
        // From the oldest event the daemon keeps (a timestamp of 1, so no clock of ours is
        // compared with the daemon's), then live: only this container's OOM kills.
        let filters = HashMap::from([("container", vec![id]), ("event", vec!["oom"])]);
        let options = EventsOptionsBuilder::new()
            .since("1")
            .filters(&filters)
            .build();
        match self.docker()?.events(Some(options)).next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(self.fail(EngineError::ContainerEvents, e)),
            None => Ok(false),
        }
    }

    async fn update_container(&self, id: &str, resources: Resources) -> Result<(), EngineError> {
        let body = ContainerUpdateBody {
            memory: Some(resources.memory_bytes),
            memory_swap: Some(resources.memory_bytes),
            cpu_quota: Some(resources.cpu_quota_us),
            cpu_period: Some(resources.cpu_period_us),
            ..Default::default()
        };
        match self.docker()?.update_container(id, body).await {
            Err(BollardError::DockerResponseServerError {
                status_code,
                message,
            }) if podman::is_missing_route(status_code, &message)
                && self.dialect().await?.podman =>
            {
                Err(EngineError::UpdateContainer(crate::engine::detail(
                    podman::NO_UPDATE,
                )))
            }
            other => other.map_err(|e| self.fail(EngineError::UpdateContainer, e)),
        }
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self.docker()?.remove_container(id, Some(options)).await {
            Err(e) if is_status(&e, 404) => Ok(()),
            // "removal already in progress"
            Err(e) if is_status(&e, 409) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::RemoveContainer, e)),
        }
    }

    async fn list_managed_containers(&self) -> Result<Vec<Leftover>, EngineError> {
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&managed_filter())
            .build();
        let list = self
            .docker()?
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
        let options = ListVolumesOptionsBuilder::new()
            .filters(&managed_filter())
            .build();
        let list = self
            .docker()?
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
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker()?.remove_volume(name, Some(options)).await {
            Err(e) if is_status(&e, 404) => Ok(()),
            other => other.map_err(|e| self.fail(EngineError::RemoveVolume, e)),
        }
    }

    async fn create_volume(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<(), EngineError> {
        let body = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            driver: Some("local".to_string()),
            labels: Some(spec::to_hash(&labels)),
            ..Default::default()
        };
        self.docker()?
            .create_volume(body)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(EngineError::CreateVolume, e))
    }

    async fn download(&self, id: &str, path: &str, max_bytes: u64) -> Result<Vec<u8>, EngineError> {
        let options = bollard::query_parameters::DownloadFromContainerOptionsBuilder::new()
            .path(path)
            .build();
        let mut stream = self.docker()?.download_from_container(id, Some(options));
        let mut tar = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.fail(EngineError::Download, e))?;
            if (tar.len() + chunk.len()) as u64 > max_bytes {
                return Err(EngineError::Download(detail(format!(
                    "{path} holds more than {max_bytes} bytes"
                ))));
            }
            tar.extend_from_slice(&chunk);
        }
        Ok(tar)
    }

    async fn upload(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<(), EngineError> {
        let options = bollard::query_parameters::UploadToContainerOptionsBuilder::new()
            .path(path)
            .build();
        self.docker()?
            .upload_to_container(id, Some(options), bollard::body_full(tar.into()))
            .await
            .map_err(|e| self.fail(EngineError::Upload, e))
    }
}
