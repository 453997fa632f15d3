//! Packages on request (SPEC 13): an install step in a container of its own, whose only way
//! out is an egress proxy admitting the operator's index hosts, and a cache of installed
//! prefixes. The executor calls [`Packages::prepare`] once per run that asks for packages; it
//! gets back a read-only volume to mount into the program's container (which keeps
//! `network_mode=none`) and the report's `packages`.
//!
//! # Security
//! Install scripts (an sdist's `setup.py`, npm's lifecycle scripts) run only in the install
//! container: exactly the posture of section 4 (no network, read-only root, a sandbox user,
//! no capabilities, seccomp, limits). Its one way out is this install's `proxy::Proxy`,
//! listening on a Unix socket in a directory of its own that the container gets read-only;
//! codebox-init's relay carries `127.0.0.1:3128` inside the container there. With no network
//! there is no DNS, no route and no other address, the host's included. It writes only its working directory, a
//! tmpfs capped at `packages.prefix_mb`, which codebox-init hands back and codebox copies
//! into a fresh volume through a container that never starts (`Packages::copier`; for a
//! session the same one copies into the session's volume too, see [`session`]). Programs
//! mount that volume read-only.

pub mod cache;
pub mod proxy;
pub mod session;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Allowed;
use crate::contract::stays_inside;
use crate::engine::guard::ContainerGuard;
use crate::engine::posture::{Limits, EGRESS_PROXY_URL, PACKAGES_VOLUME_PREFIX, WORKSPACE};
use crate::engine::protocol::{Collect, DecodeLimits, EntryKind, Payload, PhaseName};
use crate::engine::LABEL_INIT_FEATURES;
use crate::executor::factory::{Factory, Made, MakeError, Order, Purpose, Volume};
use crate::executor::labels;
use crate::executor::outcome::classify;
use crate::executor::stage::{
    run_stage, Bound, BoundError, Interrupted, LiveStage, StageRequest, BACKSTOP_GRACE,
};
use crate::registry::Language;
use crate::report::{fmt_num, InstalledPackage, PackagesReport, Stage, Status, Usage};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Label on a packages volume carrying its cache key.
const LABEL_PACKAGES: &str = "codebox.packages";
/// Most entries an installed prefix may have.
const MAX_PREFIX_ENTRIES: usize = 200_000;

/// What the cache and the install step counted (`/metrics`).
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub failures: AtomicU64,
    /// Bytes of prefixes installed.
    pub installed_bytes: AtomicU64,
    /// Bytes downloaded through the proxy.
    pub downloaded_bytes: AtomicU64,
    /// Time installs spent in the install container (download and install), and copying
    /// prefixes into their volumes, in ms.
    pub install_container_ms: AtomicU64,
    pub copy_ms: AtomicU64,
}

/// A prefix ready to mount; the run holds it (no eviction) until it is dropped.
#[derive(Debug, Clone)]
pub struct Prefix {
    pub volume: String,
    pub target: String,
    /// What the program's environment gains (`PYTHONPATH`, ...).
    pub env: BTreeMap<String, String>,
    _held: Arc<cache::Entry>,
}

/// One request for a prefix: who asks, for which language, image and requirements, within
/// which bound.
#[derive(Clone, Copy)]
pub(super) struct Want<'a> {
    pub run_id: &'a str,
    pub lang: &'a Language,
    pub image_id: &'a str,
    pub requirements: &'a [String],
    pub bound: Bound<'a>,
}

/// What [`Packages::obtain`] found or installed.
pub(super) struct Obtained {
    pub prefix: Prefix,
    pub report: PackagesReport,
    /// Only after a fresh install for a session.
    pub staged: Option<Staged>,
}

/// A fresh install's prefix as a tar, and the container that copied it into the cache's
/// volume, kept for a session: created, never started, it mounts the session's volume
/// writable at [`SESSION_TARGET`] too, so the prefix reaches the session with no other
/// container. Dropping it removes the container.
pub(super) struct Staged {
    pub copier: ContainerGuard,
    pub tar: Vec<u8>,
}

/// Where a container that copies prefixes sees a session's packages volume; it sees a cached
/// prefix's at the language's own prefix, which must not overlap this (the posture check
/// refuses overlapping volumes).
pub(super) const SESSION_TARGET: &str = "/opt/codebox-session/packages";

/// How an install ended a run.
#[derive(Debug)]
pub enum InstallEnd {
    /// The install failed, timed out or ran out of memory: the run ends with this status
    /// and `stage: "install"`.
    Failed {
        status: Status,
        message: String,
        exit_code: Option<i64>,
        stdout: String,
        stderr: String,
        usage: Usage,
        install_ms: u64,
    },
    Stopped,
    /// codebox or Docker failed (`sandbox_error`).
    Sandbox(InstallFailure),
}

/// Why codebox or the engine could not carry out an install (`sandbox_error`), one variant
/// per failing step.
#[derive(Debug, thiserror::Error)]
pub enum InstallFailure {
    #[error("{language} has no install step")]
    NoInstallStep { language: String },
    #[error("packages are not enabled for {language}")]
    NotEnabled { language: String },
    #[error("this {language} session has no packages volume")]
    NoVolume { language: String },
    #[error("image {tag} is not present: build it with `codebox images build {image}`")]
    ImageMissing { tag: String, image: String },
    #[error("image {tag} was built before codebox-init had its egress relay, which installs need: rebuild it with `codebox images build {image}`")]
    NoEgressRelay { tag: String, image: String },
    #[error("the install proxy could not listen in {}: {source}", dir.display())]
    ProxyListen {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    #[error(transparent)]
    Posture(#[from] crate::engine::posture::PostureViolation),
    /// The programs' egress could not be given to a container (why); never to the install's
    /// own, which go out through the install's proxy.
    #[error("{0}")]
    Egress(String),
    /// The deadline or the engine interrupted a call of the install.
    #[error(transparent)]
    Interrupted(BoundError),
    /// The install container ended in a way its frames do not explain (the problem found).
    #[error("{0}")]
    Unexplained(String),
    /// `codebox-init`'s own fatal error, as the container wrote it.
    #[error("{0}")]
    InitFatal(String),
    /// The installed files could not be packed (why).
    #[error("{0}")]
    Tar(String),
}

impl From<InstallFailure> for InstallEnd {
    fn from(f: InstallFailure) -> InstallEnd {
        InstallEnd::Sandbox(f)
    }
}

impl From<MakeError> for InstallEnd {
    fn from(e: MakeError) -> InstallEnd {
        match e {
            MakeError::Egress(m) => InstallFailure::Egress(m).into(),
            MakeError::Posture(v) => InstallFailure::Posture(v).into(),
            MakeError::Create(e) => e.into(),
        }
    }
}

impl From<BoundError> for InstallEnd {
    fn from(e: BoundError) -> InstallEnd {
        match e {
            BoundError::Interrupted(Interrupted::Stopped) => InstallEnd::Stopped,
            other => InstallEnd::Sandbox(InstallFailure::Interrupted(other)),
        }
    }
}

/// The install step and its cache, one per executor.
pub struct Packages {
    /// Where its containers are made; its engine, settings and background removals.
    factory: Factory,
    instance: String,
    cache: Mutex<cache::Lru>,
    locks: Locks,
    /// Numbers the containers it creates, so that no name is used twice (the container of
    /// that name may still be being removed).
    made: AtomicU64,
    counters: Counters,
}

/// One install lock per cache key, for as long as someone holds or awaits it.
type Locks = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// A claim on one key's install lock; the key's entry goes with its last claim.
struct KeyLock<'a> {
    locks: &'a Locks,
    key: String,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl<'a> KeyLock<'a> {
    fn new(locks: &'a Locks, key: &str) -> KeyLock<'a> {
        let mut map = locks.lock().unwrap_or_else(|p| p.into_inner());
        let lock = map.entry(key.to_string()).or_default().clone();
        KeyLock {
            locks,
            key: key.to_string(),
            lock: Some(lock),
        }
    }

    fn lock(&self) -> &tokio::sync::Mutex<()> {
        self.lock.as_ref().expect("held until dropped")
    }
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Counted and dropped under the map's lock, where claims are made: this one and the
        // map's own mean nobody else holds or awaits the key.
        if let Some(lock) = self.lock.take() {
            if Arc::strong_count(&lock) == 2 {
                map.remove(&self.key);
            }
        }
    }
}

/// The cache key: language, image, index and the exact sorted requirement list.
pub fn key(language: &str, image_id: &str, index: &str, requirements: &[String]) -> String {
    let mut h = Sha256::new();
    for part in [language, image_id, index] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for r in requirements {
        h.update(r.as_bytes());
        h.update([b'\n']);
    }
    format!("{:x}", h.finalize())
}

impl Packages {
    /// The install step and its cache, whose containers `factory` makes.
    pub(crate) fn new(factory: Factory, instance: String) -> Packages {
        Packages {
            factory,
            instance,
            cache: Mutex::new(cache::Lru::default()),
            locks: Mutex::new(HashMap::new()),
            made: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// `<run_id>-<what>-<n>`, a name this executor never gave before.
    fn unique(&self, run_id: &str, what: &str) -> String {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        format!("{run_id}-{what}-{n}")
    }

    /// Bytes and entries the cache holds.
    pub fn cached(&self) -> (u64, usize) {
        let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        (c.bytes(), c.len())
    }

    /// The volumes the cache holds now.
    pub fn volumes(&self) -> Vec<String> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .volumes()
    }

    /// Whether `lang` takes packages here: its entry has an install step and the operator
    /// named its index.
    pub fn takes(&self, lang: &Language) -> bool {
        lang.install.is_some() && self.factory.config().packages.index_for(&lang.id).is_some()
    }

    /// A prefix with `requirements` installed for `lang` on image `image_id`: from the cache,
    /// or installed now (once, whoever else asks for the same key meanwhile).
    pub async fn prepare(
        &self,
        run_id: &str,
        lang: &Language,
        image_id: &str,
        requirements: &[String],
        bound: Bound<'_>,
    ) -> Result<(Prefix, PackagesReport), InstallEnd> {
        let want = Want {
            run_id,
            lang,
            image_id,
            requirements,
            bound,
        };
        let got = self.obtain(want, None).await?;
        Ok((got.prefix, got.report))
    }

    /// [`Packages::prepare`] for a session whose packages volume is `session`: a fresh
    /// install comes back [`Staged`] for it too.
    pub(super) async fn obtain(
        &self,
        want: Want<'_>,
        session: Option<&str>,
    ) -> Result<Obtained, InstallEnd> {
        let Want {
            lang,
            requirements,
            bound,
            ..
        } = want;
        let Some(install) = &lang.install else {
            return Err(InstallFailure::NoInstallStep {
                language: lang.id.clone(),
            }
            .into());
        };
        let Some((index, _)) = self.factory.config().packages.index_for(&lang.id) else {
            return Err(InstallFailure::NotEnabled {
                language: lang.id.clone(),
            }
            .into());
        };
        let key = key(&lang.id, want.image_id, index, requirements);
        let claim = KeyLock::new(&self.locks, &key);
        let _guard = tokio::select! {
            g = claim.lock().lock() => g,
            _ = bound.cancel.cancelled() => return Err(InstallEnd::Stopped),
        };
        let prefix = |entry: Arc<cache::Entry>| Prefix {
            volume: entry.volume.clone(),
            target: install.prefix.clone(),
            env: install.env.clone(),
            _held: entry,
        };
        let report = |entry: &cache::Entry, cached: bool, install_ms: u64| PackagesReport {
            requested: requirements.to_vec(),
            installed: entry.installed.clone(),
            cached,
            install_ms,
        };
        let hit = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key);
        if let Some(entry) = hit {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Obtained {
                report: report(&entry, true, 0),
                prefix: prefix(entry),
                staged: None,
            });
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let installed = self.install(want, index, &key, session).await;
        let install_ms = began.elapsed().as_millis() as u64;
        let (entry, staged) = match installed {
            Ok((e, staged)) => (Arc::new(e), staged),
            Err(mut end) => {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                if let InstallEnd::Failed { install_ms: ms, .. } = &mut end {
                    *ms = install_ms;
                }
                return Err(end);
            }
        };
        self.counters
            .installed_bytes
            .fetch_add(entry.bytes, Ordering::Relaxed);
        let evicted = {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            c.insert(key.clone(), entry.clone());
            c.evict(self.factory.config().packages.cache_mb * 1024 * 1024)
        };
        for e in evicted {
            self.remove_volume_later(e.volume.clone(), None);
        }
        Ok(Obtained {
            report: report(&entry, false, install_ms),
            prefix: prefix(entry),
            staged,
        })
    }

    /// Remove an evicted or unfinished prefix's volume once no container holds it any more
    /// (after `gone` turns true, the removal of the container that held it, when given).
    fn remove_volume_later(&self, volume: String, gone: Option<watch::Receiver<bool>>) {
        let engine = self.factory.engine().clone();
        self.factory.cleanup().spawn(async move {
            if let Some(mut gone) = gone {
                let _ = gone.wait_for(|g| *g).await;
            }
            for _ in 0..30 {
                if engine.remove_volume(&volume).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            tracing::warn!(%volume, "an evicted packages volume could not be removed");
        });
    }

    /// Install into a fresh container, copy the prefix into a new volume (and keep the
    /// container that copied it for `session`'s volume, when given).
    async fn install(
        &self,
        want: Want<'_>,
        index: &str,
        key: &str,
        session: Option<&str>,
    ) -> Result<(cache::Entry, Option<Staged>), InstallEnd> {
        let Want {
            run_id,
            lang,
            requirements,
            bound,
            ..
        } = want;
        let p = &self.factory.config().packages;
        let install = lang.install.as_ref().expect("checked by prepare");
        let (_, also) = p.index_for(&lang.id).unwrap_or((index, &[]));
        let mut allowed: Vec<Allowed> = Allowed::from_url(index).into_iter().collect();
        allowed.extend(also.iter().filter_map(|h| Allowed::from_host(h)));
        let timeout = Duration::from_secs_f64(p.install_timeout_seconds);
        let image = self
            .factory
            .engine()
            .inspect_image(&lang.image.tag)
            .await
            .map_err(InstallFailure::Engine)?
            .ok_or_else(|| InstallFailure::ImageMissing {
                tag: lang.image.tag.clone(),
                image: lang.image.name.clone(),
            })?;
        let relays = image
            .labels
            .get(LABEL_INIT_FEATURES)
            .is_some_and(|f| f.split_whitespace().any(|x| x == "egress"));
        if !relays {
            return Err(InstallFailure::NoEgressRelay {
                tag: lang.image.tag.clone(),
                image: lang.image.name.clone(),
            }
            .into());
        }
        let install_name = self.unique(run_id, "install");
        let dir = self
            .factory
            .config()
            .data_dir
            .join("egress")
            .join(&install_name);
        let gate = proxy::Proxy::start(
            &dir,
            proxy::Policy { allowed },
            p.max_download_mb * 1024 * 1024,
        )
        .await
        .map_err(|source| InstallFailure::ProxyListen {
            dir: dir.clone(),
            source,
        })?;
        let runtime = p
            .install_runtime
            .as_deref()
            .unwrap_or(&self.factory.config().sandbox.runtime);
        let order = Order {
            name: format!("codebox-{install_name}"),
            image: &image.id,
            limits: Limits {
                memory_mb: p.install_memory_mb,
                cpus: 1.0,
            },
            workspace_mb: p.prefix_mb,
            labels: labels(run_id, &self.instance, timeout + Duration::from_secs(600)),
            purpose: Purpose::Install {
                runtime,
                egress: gate.dir(),
            },
        };
        let Made { guard, .. } = self.factory.make(order, Some(bound)).await?;
        let mut run: Vec<String> = install
            .command
            .iter()
            .map(|a| a.replace("{prefix}", WORKSPACE).replace("{index}", index))
            .collect();
        run.extend(requirements.iter().cloned());
        // HTTP(S)_PROXY come with the container (posture::with_egress); npm reads its own.
        let mut env = BTreeMap::new();
        env.insert("npm_config_proxy".into(), EGRESS_PROXY_URL.into());
        env.insert("npm_config_https_proxy".into(), EGRESS_PROXY_URL.into());
        env.insert("PIP_BREAK_SYSTEM_PACKAGES".into(), "1".into());
        let prefix_bytes = p.prefix_mb * 1024 * 1024;
        let payload = Payload {
            env,
            run: Some(run),
            timeout,
            output_limit: self.factory.config().sandbox.output_limit_bytes,
            collect: Some(Collect::WorkspaceOnSuccess {
                max_bytes: prefix_bytes,
            }),
            ..Default::default()
        };
        let request = StageRequest {
            payload: payload.encode(),
            backstop: timeout + BACKSTOP_GRACE,
            run_backstop: None,
            // Watchers see the install begin and the package manager's output.
            live: bound.feed.map(|feed| LiveStage {
                feed: feed.clone(),
                stage: Stage::Install,
                case: None,
            }),
            limits: DecodeLimits {
                output: self.factory.config().sandbox.output_limit_bytes,
                content: prefix_bytes,
                entries: MAX_PREFIX_ENTRIES,
            },
        };
        let began = Instant::now();
        let answer = run_stage(
            self.factory.engine().as_ref(),
            guard.name(),
            true,
            request,
            bound,
        )
        .await;
        self.counters
            .install_container_ms
            .fetch_add(began.elapsed().as_millis() as u64, Ordering::Relaxed);
        guard.remove_later();
        let answer = answer?;
        self.counters
            .downloaded_bytes
            .fetch_add(gate.downloaded(), Ordering::Relaxed);
        let phase = answer.decoded.phase(PhaseName::Run);
        let o = classify(phase, &answer);
        let stdout = phase
            .map(|p| String::from_utf8_lossy(&p.stdout).into_owned())
            .unwrap_or_default();
        let stderr = phase
            .map(|p| String::from_utf8_lossy(&p.stderr).into_owned())
            .unwrap_or_default();
        if o.status != Status::Succeeded {
            let message = match o.status {
                Status::Stopped => return Err(InstallEnd::Stopped),
                Status::SandboxError => {
                    return Err(InstallFailure::Unexplained(o.problem.unwrap_or_else(|| {
                        "the install container ended without a report".into()
                    }))
                    .into())
                }
                Status::TimedOut => format!(
                    "installing {} was killed at its {} s limit (packages.install_timeout_seconds)",
                    requirements.join(", "),
                    fmt_num(p.install_timeout_seconds)
                ),
                Status::OutOfMemory => format!(
                    "installing {} was killed by the out-of-memory killer at its {} MB limit (packages.install_memory_mb; the prefix being written counts against it)",
                    requirements.join(", "),
                    p.install_memory_mb
                ),
                _ => failure_message(
                    requirements,
                    &stderr,
                    o.exit_code,
                    gate.over_cap().then_some(p.max_download_mb),
                    p.prefix_mb,
                    &gate.refusals(),
                ),
            };
            return Err(InstallEnd::Failed {
                status: o.status,
                message,
                exit_code: o.exit_code,
                stdout,
                stderr,
                usage: o.usage,
                install_ms: 0,
            });
        }
        if let Some(fatal) = &answer.decoded.fatal {
            return Err(InstallFailure::InitFatal(fatal.clone()).into());
        }
        let (tar, bytes, installed) =
            prefix_tar(&answer.decoded.files).map_err(InstallFailure::Tar)?;
        let copy_began = Instant::now();
        // A name of its own: an evicted volume of this key may still be being removed, and
        // another server on this daemon may cache the same key.
        let volume = format!(
            "{PACKAGES_VOLUME_PREFIX}{}-{}",
            &key[..32],
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        // Not the run's: the volume outlives it (the cache), until eviction or shutdown.
        let mut vlabels = labels(
            "packages",
            &self.instance,
            Duration::from_secs(10 * 365 * 86400),
        );
        vlabels.insert(LABEL_PACKAGES.to_string(), volume.clone());
        self.factory
            .engine()
            .create_volume(&volume, vlabels)
            .await
            .map_err(InstallFailure::Engine)?;
        let cached = Volume {
            name: &volume,
            target: &install.prefix,
        };
        let mut into = vec![cached];
        into.extend(session.map(|name| Volume {
            name,
            target: SESSION_TARGET,
        }));
        let copier = match self.copier(run_id, &image.id, &into, None, bound).await {
            Ok(c) => c,
            Err(e) => {
                self.remove_volume_later(volume, None);
                return Err(e);
            }
        };
        // The tar goes on to the session, when there is one.
        let (tar, kept) = match session {
            Some(_) => (tar.clone(), Some(tar)),
            None => (tar, None),
        };
        let filled = self.upload(&copier, &install.prefix, tar, bound).await;
        if let Err(e) = filled {
            let gone = copier.removed();
            copier.remove_later();
            self.remove_volume_later(volume, Some(gone));
            return Err(e);
        }
        self.counters
            .copy_ms
            .fetch_add(copy_began.elapsed().as_millis() as u64, Ordering::Relaxed);
        let staged = match kept {
            Some(tar) => Some(Staged { copier, tar }),
            None => {
                copier.remove_later();
                None
            }
        };
        let entry = cache::Entry {
            volume,
            bytes,
            installed,
        };
        Ok((entry, staged))
    }

    /// A container that copies prefixes into the volumes of `into` (writable) and out of
    /// `from` (read-only): created, never started, removed when its guard goes; named after
    /// the run and numbered (one run may copy twice).
    pub(super) async fn copier(
        &self,
        run_id: &str,
        image_id: &str,
        into: &[Volume<'_>],
        from: Option<Volume<'_>>,
        bound: Bound<'_>,
    ) -> Result<ContainerGuard, InstallEnd> {
        let order = Order {
            name: format!("codebox-{}", self.unique(run_id, "copy")),
            image: image_id,
            limits: Limits {
                memory_mb: 64,
                cpus: 1.0,
            },
            workspace_mb: 1,
            labels: labels(run_id, &self.instance, Duration::from_secs(600)),
            purpose: Purpose::Copy { into, from },
        };
        let Made { guard, .. } = self.factory.make(order, Some(bound)).await?;
        Ok(guard)
    }

    /// Unpack a prefix's tar into the volume `copier` mounts writable at `target`.
    pub(super) async fn upload(
        &self,
        copier: &ContainerGuard,
        target: &str,
        tar: Vec<u8>,
        bound: Bound<'_>,
    ) -> Result<(), InstallEnd> {
        let upload = self.factory.engine().upload(copier.name(), target, tar);
        bound.call("copying the installed packages", upload).await?;
        Ok(())
    }

    /// The prefix in the volume `copier` mounts at `target`, as a tar whose paths are
    /// relative to the prefix.
    pub(super) async fn download(
        &self,
        copier: &ContainerGuard,
        target: &str,
        bound: Bound<'_>,
    ) -> Result<Vec<u8>, InstallEnd> {
        // The prefix's tar, its files' headers and the archive's own ending.
        let max = (self.factory.config().packages.prefix_mb * 1024 * 1024)
            .saturating_mul(2)
            .saturating_add(64 * 1024 * 1024);
        let download = self.factory.engine().download(copier.name(), target, max);
        let tar = bound
            .call("reading the installed packages", download)
            .await?;
        Ok(relative_tar(&tar).map_err(InstallFailure::Tar)?)
    }

    /// Forget every cached prefix and remove its volume (`codebox bench` measures cold
    /// installs so).
    pub(crate) async fn evict_all(&self) {
        let entries = self.cache.lock().unwrap_or_else(|p| p.into_inner()).drain();
        for e in entries {
            // A container that mounted it may still be being removed: try again then.
            if self
                .factory
                .engine()
                .remove_volume(&e.volume)
                .await
                .is_err()
            {
                self.remove_volume_later(e.volume.clone(), None);
            }
        }
    }

    /// Remove the cache's volumes (at shutdown).
    pub async fn close(&self) {
        let entries = self.cache.lock().unwrap_or_else(|p| p.into_inner()).drain();
        for e in entries {
            let _ = self.factory.engine().remove_volume(&e.volume).await;
        }
    }
}

/// The message of a failed install: the requirement it names when the package manager's
/// output names one.
fn failure_message(
    requirements: &[String],
    stderr: &str,
    exit_code: Option<i64>,
    over_download: Option<u64>,
    prefix_mb: u64,
    refusals: &[String],
) -> String {
    if let Some(max) = over_download {
        return format!(
            "installing {} downloaded more than packages.max_download_mb ({max} MB); the download was cut",
            requirements.join(", ")
        );
    }
    if stderr.contains("No space left on device") || stderr.contains("ENOSPC") {
        return format!(
            "installing {} needs more than the {prefix_mb} MB prefix (packages.prefix_mb)",
            requirements.join(", ")
        );
    }
    let lower = stderr.to_ascii_lowercase();
    let named = requirements.iter().find(|r| {
        let name = requirement_name(r).to_ascii_lowercase();
        lower
            .lines()
            .filter(|l| l.contains("error") || l.contains("404") || l.contains("not found"))
            .any(|l| l.contains(&name) || l.contains(&name.replace('-', "_")))
    });
    let code = exit_code.map_or(String::new(), |c| format!(" (exit code {c})"));
    let refused = if refusals.is_empty() {
        String::new()
    } else {
        format!("; the proxy refused: {}", refusals.join("; "))
    };
    match named {
        Some(r) => format!(
            "installing `{r}` failed{code}: the package manager's output is in stderr{refused}"
        ),
        None => format!(
            "installing {} failed{code}: the package manager's output is in stderr{refused}",
            requirements.join(", ")
        ),
    }
}

/// The project name of a requirement (`requests==2.32.3` -> `requests`, `@scope/x@1` ->
/// `@scope/x`).
fn requirement_name(r: &str) -> &str {
    let (head, rest) = match r.strip_prefix('@') {
        Some(rest) => ("@", rest),
        None => ("", r),
    };
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
        .unwrap_or(rest.len());
    &r[..head.len() + end]
}

/// The prefix as a tar owned by root, world-readable (every sandbox user runs as its own
/// uid), with its size and what it holds.
fn prefix_tar(
    files: &[crate::engine::protocol::FileEntry],
) -> Result<(Vec<u8>, u64, Vec<InstalledPackage>), String> {
    let mut b = tar::Builder::new(Vec::new());
    let mut bytes = 0u64;
    let mut installed = Vec::new();
    for f in files {
        if !stays_inside(&f.path) {
            return Err(format!(
                "the install step handed back a path outside its prefix: {:?}",
                f.path
            ));
        }
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        match f.kind {
            EntryKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, &f.path, std::io::empty())
                    .map_err(|e| e.to_string())?;
                if let Some(dist) = f.path.strip_suffix(".dist-info") {
                    if !dist.contains('/') {
                        if let Some((name, version)) = dist.rsplit_once('-') {
                            installed.push(InstalledPackage {
                                name: name.to_string(),
                                version: version.to_string(),
                            });
                        }
                    }
                }
            }
            EntryKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if f.mode & 0o111 != 0 { 0o755 } else { 0o644 });
                h.set_size(f.content.len() as u64);
                bytes += f.content.len() as u64;
                b.append_data(&mut h, &f.path, &f.content[..])
                    .map_err(|e| e.to_string())?;
                if let Some(pkg) = npm_package(&f.path, &f.content) {
                    installed.push(pkg);
                }
            }
            EntryKind::Link => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, &f.path, &f.target)
                    .map_err(|e| e.to_string())?;
            }
        }
        bytes += 512;
    }
    installed.sort_by(|a, b| {
        a.name
            .to_ascii_lowercase()
            .cmp(&b.name.to_ascii_lowercase())
    });
    let tar = b.into_inner().map_err(|e| e.to_string())?;
    Ok((tar, bytes, installed))
}

/// A tar the engine made of a folder (its entries under the folder's own name) with that
/// first component taken off and the folder's own entry left out.
fn relative_tar(tar: &[u8]) -> Result<Vec<u8>, String> {
    let bad = |e: std::io::Error| format!("the packages volume's archive is unreadable: {e}");
    let mut out = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let path = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        let rest = match path.trim_end_matches('/').split_once('/') {
            Some((_, rest)) if !rest.is_empty() => rest.to_string(),
            _ => continue,
        };
        if !stays_inside(&rest) {
            return Err(format!(
                "the packages volume holds a path outside it: {rest:?}"
            ));
        }
        let mut h = entry.header().clone();
        match h.entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(bad)?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if h.entry_type() == tar::EntryType::Link {
                    // Hard links name a path in the archive: under the same folder.
                    let t = target.to_string_lossy().into_owned();
                    let t = t.split_once('/').map(|(_, r)| r.to_string()).unwrap_or(t);
                    out.append_link(&mut h, &rest, t).map_err(bad)?;
                } else {
                    out.append_link(&mut h, &rest, target).map_err(bad)?;
                }
            }
            _ => out.append_data(&mut h, &rest, &mut entry).map_err(bad)?,
        }
    }
    out.into_inner().map_err(bad)
}

/// An npm package's name and version, from `node_modules/<name>/package.json`.
fn npm_package(path: &str, content: &[u8]) -> Option<InstalledPackage> {
    let rest = path
        .strip_prefix("node_modules/")?
        .strip_suffix("/package.json")?;
    let depth = rest.split('/').count();
    if rest.contains("node_modules") || depth > 2 || (depth == 2 && !rest.starts_with('@')) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(content).ok()?;
    Some(InstalledPackage {
        name: v.get("name")?.as_str()?.to_string(),
        version: v.get("version")?.as_str()?.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::fake::FakeEngine;
    use crate::engine::guard::Cleanup;
    use session::SessionPrefix;
    use std::collections::BTreeSet;
    use tokio_util::sync::CancellationToken;

    /// Packages on the fake engine, python's enabled with an index nobody reaches (the fake's
    /// install container answers at once).
    struct Harness {
        fake: Arc<FakeEngine>,
        packages: Packages,
        lang: Language,
        cleanup: Cleanup,
        cancel: CancellationToken,
        _data: tempfile::TempDir,
    }

    const IMAGE: &str = "sha256:fake-python";

    fn harness(tune: impl FnOnce(&mut Config)) -> Harness {
        let data = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: data.path().to_path_buf(),
            ..Config::default()
        };
        config.packages.python.index_url = Some("http://127.0.0.1:9/simple".into());
        tune(&mut config);
        let registry = crate::registry::Registry::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("languages.toml"),
        )
        .unwrap();
        let lang = registry.resolve("python").unwrap().clone();
        let fake = Arc::new(FakeEngine::new());
        let cleanup = Cleanup::default();
        let factory = Factory::new(fake.clone(), Arc::new(config), cleanup.clone(), None);
        let packages = Packages::new(factory, "test".into());
        Harness {
            fake,
            packages,
            lang,
            cleanup,
            cancel: CancellationToken::new(),
            _data: data,
        }
    }

    impl Harness {
        fn bound(&self) -> Bound<'_> {
            Bound::new(
                &self.cancel,
                tokio::time::Instant::now() + Duration::from_secs(60),
            )
        }

        async fn prepare(&self, run_id: &str, requirements: &[&str]) -> Prefix {
            let reqs: Vec<String> = requirements.iter().map(|r| r.to_string()).collect();
            let (prefix, _) = self
                .packages
                .prepare(run_id, &self.lang, IMAGE, &reqs, self.bound())
                .await
                .unwrap();
            prefix
        }

        async fn session(&self) -> SessionPrefix {
            SessionPrefix::create(
                &self.packages,
                &self.lang,
                "codebox-s1",
                Duration::from_secs(600),
            )
            .await
            .unwrap()
        }

        async fn add(
            &self,
            s: &SessionPrefix,
            run_id: &str,
            requested: &[&str],
        ) -> Result<PackagesReport, InstallEnd> {
            let reqs: Vec<String> = requested.iter().map(|r| r.to_string()).collect();
            s.add(
                &self.packages,
                run_id,
                &self.lang,
                IMAGE,
                &reqs,
                self.bound(),
            )
            .await
        }

        /// The files a volume holds.
        fn files(&self, volume: &str) -> Option<BTreeSet<String>> {
            self.fake
                .volumes()
                .get(volume)
                .map(|f| f.keys().cloned().collect())
        }
    }

    #[tokio::test]
    async fn installs_into_one_session_use_containers_named_once_each() {
        let h = harness(|_| {});
        let s = h.session().await;
        h.add(&s, "s1", &["a==1"]).await.unwrap();
        h.add(&s, "s1", &["b==1"]).await.unwrap();
        let names: Vec<String> = h.fake.specs().into_iter().map(|s| s.name).collect();
        let once: BTreeSet<&String> = names.iter().collect();
        assert_eq!(once.len(), names.len(), "a name was used twice: {names:?}");
    }

    #[tokio::test]
    async fn a_session_install_takes_two_containers_and_a_cached_one_one() {
        let h = harness(|_| {});
        let first = h.session().await;
        h.add(&first, "s1", &["a==1"]).await.unwrap();
        let fresh = h.fake.specs().len();
        let second = h.session().await;
        h.add(&second, "s2", &["a==1"]).await.unwrap();
        let names: Vec<String> = h.fake.specs().into_iter().map(|s| s.name).collect();
        // The install, then one container that fills the cache and the session; a hit only
        // the one that copies from the cache into the session.
        assert_eq!((fresh, names.len() - fresh), (2, 1), "{names:?}");
        let held = h.files(first.volume()).unwrap();
        assert!(!held.is_empty());
        assert_eq!(h.files(second.volume()), Some(held));
    }

    #[tokio::test]
    async fn a_copy_cut_short_leaves_the_session_with_all_or_nothing() {
        let h = harness(|_| {});
        let s = h.session().await;
        h.add(&s, "s1", &["a==1"]).await.unwrap();
        // From the cache (installed before for another run), then from a fresh install.
        h.prepare("c1", &["a==1", "b==1"]).await;
        for (run, requested, union) in [
            ("s2", "b==1", &["a==1", "b==1"][..]),
            ("s3", "c==1", &["a==1", "b==1", "c==1"][..]),
        ] {
            let before = h.files(s.volume()).unwrap();
            h.fake.cut_uploads(s.volume(), 1);
            let added = h.add(&s, run, &[requested]).await;
            let after = h.files(s.volume()).unwrap();
            match added {
                Ok(_) => {
                    // What the cache holds for the union is what the session holds.
                    let whole = h.prepare("c2", union).await;
                    assert_eq!(Some(after), h.files(&whole.volume), "{run}");
                }
                Err(e) => assert_eq!(after, before, "{run}: {e:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_evicted_prefix_removed_late_never_takes_its_keys_new_install() {
        let h = harness(|_| {});
        let first = h.prepare("r1", &["a==1"]).await.volume.clone();
        // Its container is still being removed: the removal tries again later.
        h.fake.fail_volume_removals(2);
        h.packages.evict_all().await;
        let again = h.prepare("r2", &["a==1"]).await;
        assert!(h.cleanup.drain(Duration::from_secs(10)).await);
        assert!(
            h.files(&again.volume).is_some(),
            "the re-installed prefix {} (first {first}) was removed",
            again.volume
        );
        assert!(h.files(&first).is_none(), "the evicted prefix was left");
    }

    #[tokio::test]
    async fn the_install_locks_go_with_their_last_holder() {
        let h = harness(|_| {});
        h.prepare("r1", &["a==1"]).await;
        h.prepare("r2", &["b==1"]).await;
        h.prepare("r3", &["a==1"]).await;
        let (a, b) = tokio::join!(h.prepare("r4", &["c==1"]), h.prepare("r5", &["c==1"]));
        drop((a, b));
        assert_eq!(h.packages.locks.lock().unwrap().len(), 0);
    }

    #[test]
    fn keys_differ_for_different_lists_images_and_indexes() {
        let a = key("python", "sha256:1", "http://i/simple", &["a==1".into()]);
        assert_ne!(
            a,
            key("python", "sha256:1", "http://i/simple", &["a==2".into()])
        );
        assert_ne!(
            a,
            key("python", "sha256:2", "http://i/simple", &["a==1".into()])
        );
        assert_ne!(
            a,
            key("python", "sha256:1", "http://j/simple", &["a==1".into()])
        );
        assert_ne!(
            key("python", "x", "i", &["ab".into(), "c".into()]),
            key("python", "x", "i", &["a".into(), "bc".into()])
        );
        assert_eq!(
            a,
            key("python", "sha256:1", "http://i/simple", &["a==1".into()])
        );
    }

    #[test]
    fn a_failure_names_the_requirement_the_output_names() {
        let reqs = vec!["good==1".to_string(), "no-such-pkg==9".to_string()];
        let stderr = "ERROR: Could not find a version that satisfies the requirement no-such-pkg==9\nERROR: No matching distribution found for no-such-pkg==9\n";
        let m = failure_message(&reqs, stderr, Some(1), None, 10, &[]);
        assert!(m.contains("`no-such-pkg==9`"), "{m}");
        let m = failure_message(&reqs, "boom", Some(1), Some(5), 10, &[]);
        assert!(m.contains("packages.max_download_mb (5 MB)"), "{m}");
        assert_eq!(requirement_name("requests>=2,<3"), "requests");
        assert_eq!(requirement_name("@scope/pkg@^1"), "@scope/pkg");
    }
}
