//! Containers for a run's stages: a ready one from the pool, else a new one created for the
//! stage; each locked down, checked, owned by a guard that removes it, and used for one stage.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::egress::ProgramEgress;
use super::ends::{Halt, SandboxFailure, BACKSTOP_GRACE};
use super::factory::{Factory, MakeError, Order, Purpose, Volume};
use super::images::{ImageIds, ImageRef};
use super::labels::labels;
pub(super) use super::pool::Mount;
use super::pool::{run_workspace_mb, Pool, Shape};
use super::stage::{run_stage, Answer, Bound, BoundError, LiveStage, StageRequest};
use super::timings::{Leg, Timings};
use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::guard::{Cleanup, ContainerGuard};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Collect, DecodeLimits, Payload};
use crate::engine::{ContainerEngine, EngineError};
use crate::report::Stage;

/// Extra time before a container counts as abandoned, beyond its limits.
const EXPIRY_MARGIN: Duration = Duration::from_secs(600);
/// Most entries a compile stage may hand back.
const MAX_ARTIFACT_ENTRIES: usize = 10_000;
/// Most entries listed from `outputs/` (`codebox-init` lists at most 1000).
pub(super) const MAX_OUTPUT_ENTRIES: usize = 1024;

/// The container a stage needs.
pub(super) struct Want {
    /// Its name, should it be created for the run.
    pub name: String,
    pub image_tag: String,
    /// The registry name of its image (for `codebox images build NAME`).
    pub image_name: String,
    pub limits: Limits,
    pub workspace_mb: u64,
    pub labels: BTreeMap<String, String>,
    /// An installed packages prefix to mount read-only (from the pool only with that prefix).
    pub prefix: Option<Mount>,
}

/// A container for one stage: created only, or started ahead of time (taken from the pool).
pub(super) struct Acquired {
    pub guard: ContainerGuard,
    pub started: bool,
    /// The image it was created from.
    pub image: ImageRef,
}

/// Where a run's stages get their containers: the pool of ready ones, else the factory (which
/// leases the uids and checks the posture), the image ids and the background removals, with
/// the rules every container of a stage follows (posture checked, one stage each, removed
/// after).
pub struct Containers {
    pub(super) engine: Arc<dyn ContainerEngine>,
    pub(super) config: Arc<Config>,
    pub(super) instance: String,
    /// Where every container is made (the pool's and the install step's too).
    pub(super) factory: Factory,
    pub(super) cleanup: Cleanup,
    pub(super) pool: Pool,
    images: Arc<ImageIds>,
    pub(super) timings: Arc<Timings>,
}

impl Containers {
    pub(super) fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        instance: String,
    ) -> Containers {
        let timings = Arc::new(Timings::default());
        let cleanup = {
            let timings = timings.clone();
            Cleanup::observed(Arc::new(move |d| timings.record(Leg::Remove, d)))
        };
        let images = Arc::new(ImageIds::new(engine.clone()));
        let egress = ProgramEgress::new(&config, &instance).map(Arc::new);
        let factory = Factory::new(engine.clone(), config.clone(), cleanup.clone(), egress);
        let pool = Pool::new(factory.clone(), instance.clone(), images.clone());
        Containers {
            engine,
            config,
            instance,
            factory,
            cleanup,
            pool,
            images,
            timings,
        }
    }

    /// The labels of a run's containers, for a run that may take `budget`.
    pub(super) fn run_labels(&self, run_id: &str, budget: Duration) -> BTreeMap<String, String> {
        labels(run_id, &self.instance, budget + EXPIRY_MARGIN)
    }

    /// The container a run stage (or test case) gets: `suffix` names it.
    pub(super) fn run_want(
        &self,
        run_id: &str,
        req: &ValidRequest,
        suffix: &str,
        prefix: Option<&crate::executor::packages::Prefix>,
    ) -> Want {
        let lang = &req.language;
        let memory_mb = req.limits.memory_mb;
        Want {
            name: format!("codebox-{run_id}-{suffix}"),
            image_tag: lang.image.tag.clone(),
            image_name: lang.image.name.clone(),
            limits: Limits {
                memory_mb,
                cpus: req.limits.cpus,
            },
            workspace_mb: run_workspace_mb(&self.config, memory_mb),
            labels: self.run_labels(run_id, super::ends::budget_with_install(&self.config, req)),
            prefix: prefix.map(|p| Mount {
                volume: p.volume.clone(),
                target: p.target.clone(),
            }),
        }
    }

    /// Create one locked-down container (not started) through the factory, and hand back
    /// its owner.
    pub(super) async fn create(&self, want: &Want, bound: Bound<'_>) -> Result<Acquired, Halt> {
        let image = self.image(&want.image_tag, &want.image_name, bound).await?;
        let order = Order {
            name: want.name.clone(),
            image: &image.id,
            limits: want.limits,
            workspace_mb: want.workspace_mb,
            labels: want.labels.clone(),
            purpose: Purpose::Program {
                prefix: want.prefix.as_ref().map(|p| Volume {
                    name: &p.volume,
                    target: &p.target,
                }),
                relay: image.egress,
                image_name: &want.image_name,
            },
        };
        match self.factory.make(order, Some(bound)).await {
            Ok(made) => Ok(Acquired {
                guard: made.guard,
                started: false,
                image,
            }),
            Err(MakeError::Egress(m)) => Err(Halt::Failed(SandboxFailure::Egress(m))),
            Err(MakeError::Posture(v)) => Err(v.into()),
            Err(MakeError::Create(BoundError::Engine(EngineError::ImageMissing { .. }))) => {
                self.images.forget(&want.image_tag);
                Err(SandboxFailure::ImageMissing {
                    tag: want.image_tag.clone(),
                    image: want.image_name.clone(),
                }
                .into())
            }
            Err(MakeError::Create(e)) => Err(Halt::bound(e)),
        }
    }

    /// The image tagged `tag` (the `[images]` entry `name`): containers are created from
    /// its id, and the compile cache keys on it.
    pub(super) async fn image(
        &self,
        tag: &str,
        name: &str,
        bound: Bound<'_>,
    ) -> Result<ImageRef, Halt> {
        bound
            .call("inspecting the image", self.images.resolve(tag))
            .await
            .map_err(Halt::bound)?
            .ok_or_else(|| {
                SandboxFailure::ImageMissing {
                    tag: tag.to_string(),
                    image: name.to_string(),
                }
                .into()
            })
    }

    /// A container for a stage: a ready one from the pool, else a new one (created only).
    pub(super) async fn acquire(&self, want: &Want, bound: Bound<'_>) -> Result<Acquired, Halt> {
        let began = Instant::now();
        let shape = Shape::new(&want.image_tag, want.limits, want.workspace_mb)
            .with_packages(want.prefix.clone());
        let pooled = self.pool.take(&shape).await;
        let acquired = match pooled {
            Some(taken) => Ok(Acquired {
                guard: taken.guard,
                started: true,
                image: taken.image,
            }),
            None => self.create(want, bound).await,
        };
        self.timings.record(Leg::Acquire, began.elapsed());
        acquired
    }

    /// Run a payload in `container`, then hand it to removal. A container taken from the pool
    /// that turns out dead (it never answered) is replaced by a new one, once: nothing of the
    /// run had started in it. `limits_total` is the stage's own time limit; `content_bytes`
    /// the file content it may send back.
    pub(super) async fn run_in(
        &self,
        want: &Want,
        container: Acquired,
        payload: Payload,
        limits_total: Duration,
        content_bytes: u64,
        bound: Bound<'_>,
    ) -> Result<Answer, Halt> {
        let (entries, stage) = match payload.collect {
            Some(Collect::WorkspaceOnSuccess { .. }) => (MAX_ARTIFACT_ENTRIES, Stage::Compile),
            _ => (MAX_OUTPUT_ENTRIES, Stage::Run),
        };
        let request = StageRequest {
            run_backstop: (payload.check.is_some() || payload.check_in_run)
                .then(|| payload.timeout + BACKSTOP_GRACE),
            payload: payload.encode(),
            backstop: limits_total + BACKSTOP_GRACE,
            limits: DecodeLimits {
                output: self.config.sandbox.output_limit_bytes,
                content: content_bytes,
                entries,
            },
            live: bound.feed.map(|feed| LiveStage {
                feed: feed.clone(),
                stage,
                case: bound.case,
            }),
        };
        let mut container = container;
        loop {
            let result = run_stage(
                self.engine.as_ref(),
                container.guard.name(),
                !container.started,
                request.clone(),
                bound,
            )
            .await
            .map(|mut r| {
                // What it was created from, whether or not the engine was asked after.
                r.image_id = Some(container.image.id.clone());
                r
            });
            let dead_on_arrival = container.started
                && !bound.cancel.is_cancelled()
                && match &result {
                    Err(BoundError::Engine(EngineError::Attach(_))) => true,
                    Ok(r) => {
                        r.decoded.phases.is_empty()
                            && !r.decoded.complete
                            && r.decoded.fatal.is_none()
                            && r.protocol_error.is_none()
                    }
                    Err(_) => false,
                };
            container.guard.remove_later();
            if let Ok(r) = &result {
                let t = &r.times;
                self.timings.record(Leg::Deliver, t.deliver);
                self.timings.record(Leg::Run, t.run);
                self.timings.record(Leg::Collect, t.collect);
            }
            if !dead_on_arrival {
                return result.map_err(Halt::bound);
            }
            tracing::warn!("a container started ahead of time never answered; using a new one");
            self.pool
                .counters()
                .failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            container = self.create(want, bound).await?;
        }
    }
}
