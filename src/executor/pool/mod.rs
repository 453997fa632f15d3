//! Containers created and started before their run arrives: each is locked down like any
//! other, has run nothing but `codebox-init` waiting on its stdin, serves exactly one run, and
//! is removed after it. A run takes one instead of creating and starting its own, which takes
//! those two steps (about three quarters of a short run) off the critical path.
//!
//! A container is kept for a [`Shape`]: everything about its spec that is not its name,
//! labels or uid. A run takes a container of its exact shape, or of the same image and
//! working directory size whose memory and CPU it then updates (the Engine API can change
//! both on a started container; CPU because every container is created with a quota and
//! period; gVisor cannot, and an update costs the host about as much CPU as a tenth of a new
//! container).
//!
//! How many are kept follows demand: for each shape, the most runs that were in flight at
//! once (queued or running) in the last [`DEMAND_WINDOW`], plus as many as arrive while one
//! container is made when runs come faster than that (one client sending back to back), at
//! least `pool.sizes` (its floor) and at most `pool.max_ready` (its ceiling). A shape that is not a floor's (a limit class:
//! runs that ask for other limits) is kept only once [`CLASS_MIN_RUNS`] runs asked for it in
//! the window. Containers beyond what demand asks for are removed once it has been lower for
//! a whole window. The pool itself is passive: the run manager, which owns the memory budget,
//! tells it what runs ask for ([`Pool::asked`], [`Pool::done`]), decides when it may grow
//! ([`Pool::fill`]: only while no run waits for a slot, so filling never holds a queued run
//! back) and when it must give memory back (`Pool::shed`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

mod demand;
mod shape;

use demand::Demand;
pub use demand::{CLASS_MIN_RUNS, DEMAND_WINDOW};
pub use shape::{floors_for, run_workspace_mb, shapes_of, Mount, Shape};

use super::factory::{Factory, Made, MakeError, Order, Purpose, Volume};
use super::images::{ImageIds, ImageRef};
use super::packages::Prefix;
use super::stage::BoundError;
use crate::config::MAX_POOLED;
use crate::engine::guard::ContainerGuard;
use crate::engine::posture::PostureViolation;
use crate::engine::{ContainerSpec, EngineError};
use crate::registry::Language;

/// Containers started at once to fill the pool (filling competes with runs for the CPU).
const MAX_FILLING: usize = 2;
/// How long making a container is taken to last until one has been timed.
const FILL_GUESS: Duration = Duration::from_millis(200);
/// After a shape's fill failed, the next waits this long, doubling with each failure in a row
/// up to [`FILL_BACKOFF_MAX`] (a daemon that cannot start containers is not asked again and
/// again; runs still try their own).
const FILL_BACKOFF: Duration = Duration::from_secs(1);
const FILL_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// The value of `codebox.run` on a container that has no run yet.
pub const POOL_RUN_LABEL: &str = "pool";

/// A started container waiting for its run.
struct Idle {
    guard: ContainerGuard,
    spec: ContainerSpec,
    shape: Shape,
    image: ImageRef,
    since: Instant,
    /// The cached prefix it mounts: not evicted from the cache while it waits.
    _prefix: Option<Prefix>,
}

/// A container taken from the pool, started, ready for its payload.
pub struct Taken {
    pub guard: ContainerGuard,
    /// The image it was created from.
    pub image: ImageRef,
}

#[derive(Default)]
struct State {
    idle: Vec<Idle>,
    /// Shapes being created and started.
    filling: Vec<Shape>,
    /// `pool.sizes`: what is kept ready whatever the demand.
    floors: BTreeMap<Shape, usize>,
    demand: BTreeMap<Shape, Demand>,
    /// Set with the floors: a pool that was never started follows no demand.
    started: bool,
    closed: bool,
    /// Shapes whose fills failed lately: (failures in a row, no fill before).
    backoff: BTreeMap<Shape, (u32, Instant)>,
    /// Cached prefixes (by volume) runs used lately: containers mounting them may be kept
    /// ready, and the cache keeps them while they are here.
    prefixes: BTreeMap<String, Prefix>,
}

impl State {
    /// How many containers of `shape` to keep ready now.
    fn target(&self, shape: &Shape) -> usize {
        let floor = self.floors.get(shape).copied().unwrap_or(0);
        let Some(d) = self.demand.get(shape) else {
            return floor;
        };
        let wanted = if floor > 0 || d.arrivals.len() >= CLASS_MIN_RUNS {
            d.peak() + d.extra()
        } else {
            0
        };
        wanted.min(d.ceiling).max(floor)
    }

    fn held(&self, shape: &Shape) -> usize {
        self.idle.iter().filter(|i| &i.shape == shape).count()
            + self.filling.iter().filter(|s| *s == shape).count()
    }
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct PoolCounters {
    pub hits: AtomicU64,
    pub updated_hits: AtomicU64,
    pub misses: AtomicU64,
    pub created: AtomicU64,
    pub failed: AtomicU64,
    pub expired: AtomicU64,
    /// Removed because demand had fallen below what the pool held.
    pub trimmed: AtomicU64,
}

/// What the pool holds, for `/metrics` and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    /// Idle containers by image.
    pub idle: BTreeMap<String, usize>,
    pub filling: usize,
    /// Memory limit of idle and filling containers together, in MB.
    pub memory_mb: u64,
}

struct Inner {
    /// Makes its containers as every run's are made (their egress too), and checks a ready
    /// one again before it serves a run.
    factory: Factory,
    instance: String,
    images: Arc<ImageIds>,
    state: Mutex<State>,
    counters: PoolCounters,
    /// Set when the runtime refused to change a started container's limits (runsc cannot):
    /// from then on only a container of the exact shape serves a run.
    no_updates: AtomicBool,
    /// Told whenever the pool came to hold less of the budget, or a fill ended either way.
    listener: OnceLock<Listener>,
    /// How long making a container took lately, in microseconds (0: not yet timed).
    fill_us: AtomicU64,
}

/// What the pool tells when it changed (the run manager: admit what can start now).
type Listener = Box<dyn Fn(Change) + Send + Sync>;

/// What the pool tells the run manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// A run took a container: queued runs may start; refilling waits.
    Taken,
    /// A fill ended or containers were removed.
    Other,
}

/// Why a container could not be started ahead of time.
#[derive(Debug, thiserror::Error)]
enum FillError {
    #[error("image {tag} is not present")]
    ImageMissing { tag: String },
    #[error(transparent)]
    Posture(#[from] PostureViolation),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A stop or a deadline cut its create short (fills have neither today).
    #[error(transparent)]
    Interrupted(super::stage::Interrupted),
    #[error("{0}")]
    Egress(String),
    #[error("its packages prefix is no longer held")]
    PrefixGone,
}

impl From<MakeError> for FillError {
    fn from(e: MakeError) -> FillError {
        match e {
            MakeError::Egress(m) => FillError::Egress(m),
            MakeError::Posture(v) => FillError::Posture(v),
            MakeError::Create(BoundError::Engine(e)) => FillError::Engine(e),
            MakeError::Create(BoundError::Interrupted(i)) => FillError::Interrupted(i),
        }
    }
}

/// Demand told to the pool, taken back (`Pool::done`) when dropped.
pub(crate) struct Asked {
    pool: Pool,
    shapes: Vec<(Shape, usize)>,
}

impl Asked {
    pub fn new(pool: Pool, shapes: Vec<(Shape, usize)>) -> Asked {
        Asked { pool, shapes }
    }
}

impl Drop for Asked {
    fn drop(&mut self) {
        self.pool.done(&self.shapes);
    }
}

/// The pool of one process. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    pub(super) fn new(factory: Factory, instance: String, images: Arc<ImageIds>) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                factory,
                instance,
                images,
                state: Mutex::new(State::default()),
                counters: PoolCounters::default(),
                no_updates: AtomicBool::new(false),
                listener: OnceLock::new(),
                fill_us: AtomicU64::new(0),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a few pushes and removals: a poisoned lock holds consistent data.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Call `listener` (never under the pool's lock) whenever the pool came to hold less of
    /// the memory budget or a fill ended, succeeded or not. Set once.
    pub(crate) fn on_change(&self, listener: impl Fn(Change) + Send + Sync + 'static) {
        let _ = self.inner.listener.set(Box::new(listener));
    }

    fn changed(&self, change: Change) {
        if let Some(listener) = self.inner.listener.get() {
            listener(change);
        }
    }

    pub fn counters(&self) -> &PoolCounters {
        &self.inner.counters
    }

    /// Keep these containers ready whatever the demand: the shapes of a default run (and
    /// compile stage) of each language of `pool.sizes`.
    pub(crate) fn set_floors(&self, floors: BTreeMap<Shape, usize>) {
        let mut st = self.state();
        st.floors = floors;
        st.started = true;
    }

    /// Runs in flight ask for `shapes` (from [`shapes_of`]) until [`Pool::done`]: what
    /// the pool keeps ready follows the most that were asked for at once lately.
    pub fn asked(&self, lang: &Language, shapes: &[(Shape, usize)]) {
        let config = &self.inner.factory.config().pool;
        let ceiling = config
            .max_ready
            .get(&lang.id)
            .copied()
            .unwrap_or(config.default_max_ready);
        let fill = match self.inner.fill_us.load(Ordering::Relaxed) {
            0 => FILL_GUESS,
            us => Duration::from_micros(us),
        };
        let mut st = self.state();
        if !st.started || st.closed {
            return;
        }
        // Read under the lock: each shape's records stay in time order.
        let now = Instant::now();
        for (shape, n) in shapes {
            let d = st.demand.entry(shape.clone()).or_default();
            d.ceiling = d.ceiling.max(ceiling);
            d.arrivals.push(now);
            d.arrived(now, fill);
            let level = d.in_flight + n;
            d.change(now, level);
        }
    }

    /// A run with packages asks for `n` containers of `shape` mounting `prefix` (its volume
    /// is `shape.packages`) until [`Pool::done`]: as [`Pool::asked`], and the prefix is held
    /// (never evicted from the cache) while containers mounting it may be kept.
    pub(crate) fn asked_with_prefix(
        &self,
        lang: &Language,
        shape: &Shape,
        n: usize,
        prefix: &Prefix,
    ) {
        {
            let mut st = self.state();
            if !st.started || st.closed {
                return;
            }
            st.prefixes.insert(prefix.volume.clone(), prefix.clone());
        }
        self.asked(lang, &[(shape.clone(), n)]);
    }

    /// Remove the ready containers that mount a packages prefix and let go of the prefixes
    /// (their volumes may be removed); what runs asked for is remembered.
    pub(crate) fn forget_packages(&self) {
        let mut st = self.state();
        st.prefixes.clear();
        let (gone, keep): (Vec<Idle>, Vec<Idle>) =
            st.idle.drain(..).partition(|i| i.shape.packages.is_some());
        st.idle = keep;
        drop(st);
        for idle in gone {
            idle.guard.remove_later();
        }
    }

    /// The runs that asked for `shapes` ended.
    pub fn done(&self, shapes: &[(Shape, usize)]) {
        let mut st = self.state();
        let now = Instant::now();
        for (shape, n) in shapes {
            if let Some(d) = st.demand.get_mut(shape) {
                let level = d.in_flight.saturating_sub(*n);
                d.change(now, level);
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.state();
        let mut idle = BTreeMap::new();
        for i in &st.idle {
            *idle.entry(i.shape.image.clone()).or_default() += 1;
        }
        PoolStats {
            idle,
            filling: st.filling.len(),
            memory_mb: st.idle.iter().map(|i| i.shape.memory_mb).sum::<u64>()
                + st.filling.iter().map(|s| s.memory_mb).sum::<u64>(),
        }
    }

    /// Memory limit of idle and filling containers together, in MB: what the pool holds of
    /// the admission budget.
    pub fn memory_mb(&self) -> u64 {
        self.stats().memory_mb
    }

    /// The next shape short of its target, if a fill may start now (the floors first).
    pub fn wanted(&self) -> Option<Shape> {
        let st = self.state();
        if st.closed
            || st.filling.len() >= MAX_FILLING
            || st.idle.len() + st.filling.len() >= MAX_POOLED
        {
            return None;
        }
        let now = Instant::now();
        st.floors
            .keys()
            .chain(st.demand.keys())
            .filter(|shape| {
                st.backoff
                    .get(*shape)
                    .is_none_or(|(_, until)| *until <= now)
            })
            .filter(|shape| {
                shape
                    .packages
                    .as_ref()
                    .is_none_or(|m| st.prefixes.contains_key(&m.volume))
            })
            .find(|shape| st.held(shape) < st.target(shape))
            .cloned()
    }

    /// Create and start one container of `shape`, in the background. Its memory counts in
    /// [`Pool::memory_mb`] from now on.
    pub fn fill(&self, shape: Shape) {
        let pool = self.clone();
        self.state().filling.push(shape.clone());
        self.inner.factory.cleanup().spawn(async move {
            let began = Instant::now();
            let made = pool.make(&shape).await;
            if made.is_ok() {
                // A moving average: the last eight fills or so.
                let us = began.elapsed().as_micros() as u64;
                let t = &pool.inner.fill_us;
                let old = t.load(Ordering::Relaxed);
                t.store(if old == 0 { us } else { (old * 7 + us) / 8 }, Ordering::Relaxed);
            }
            {
                let mut st = pool.state();
                if let Some(i) = st.filling.iter().position(|s| *s == shape) {
                    st.filling.remove(i);
                }
                if made.is_ok() {
                    st.backoff.remove(&shape);
                } else {
                    let failures = st.backoff.get(&shape).map_or(0, |(n, _)| *n) + 1;
                    let wait = FILL_BACKOFF
                        .saturating_mul(1 << failures.min(6).saturating_sub(1))
                        .min(FILL_BACKOFF_MAX);
                    st.backoff.insert(shape.clone(), (failures, Instant::now() + wait));
                }
                match made {
                    Ok(idle) if !st.closed => st.idle.push(idle),
                    Ok(idle) => drop(idle),
                    Err(FillError::ImageMissing { tag }) => {
                        pool.inner.counters.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(image = tag, "could not start a container ahead of time: the image is not there");
                    }
                    Err(e) => {
                        pool.inner.counters.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(image = shape.image, error = %e, "could not start a container ahead of time");
                    }
                }
            }
            // A queued run may have waited for this memory, ready or given back.
            pool.changed(Change::Other);
        });
    }

    async fn make(&self, shape: &Shape) -> Result<Idle, FillError> {
        let i = &self.inner;
        let name = format!("codebox-pool-{}", uuid::Uuid::new_v4().simple());
        let c = i.factory.config();
        // A pooled container may wait `pool.idle_seconds`, then serve the longest run.
        let lifetime = Duration::from_secs(c.pool.idle_seconds)
            + Duration::from_secs_f64(c.limits.max_timeout_seconds)
            + Duration::from_secs(3600);
        let labels = super::labels::labels(POOL_RUN_LABEL, &i.instance, lifetime);
        let image =
            i.images
                .resolve(&shape.image)
                .await?
                .ok_or_else(|| FillError::ImageMissing {
                    tag: shape.image.clone(),
                })?;
        let prefix = match &shape.packages {
            None => None,
            Some(m) => {
                let held = self.state().prefixes.get(&m.volume).cloned();
                let Some(p) = held else {
                    return Err(FillError::PrefixGone);
                };
                Some(p)
            }
        };
        // Ready containers get the programs' egress as every run's container does.
        let order = Order {
            name,
            image: &image.id,
            limits: shape.limits(),
            workspace_mb: shape.workspace_mb,
            labels,
            purpose: Purpose::Program {
                prefix: shape.packages.as_ref().map(|m| Volume {
                    name: &m.volume,
                    target: &m.target,
                }),
                relay: image.egress,
                image_name: &shape.image,
            },
        };
        let Made { guard, spec } = match i.factory.make(order, None).await {
            Ok(made) => made,
            Err(e) => {
                if let MakeError::Create(BoundError::Engine(EngineError::ImageMissing { .. })) = e {
                    i.images.forget(&shape.image);
                }
                return Err(e.into());
            }
        };
        i.factory.engine().start_container(guard.name()).await?;
        i.counters.created.fetch_add(1, Ordering::Relaxed);
        Ok(Idle {
            guard,
            spec,
            shape: shape.clone(),
            image,
            since: Instant::now(),
            _prefix: prefix,
        })
    }

    /// A started container for `shape`: one of exactly that shape, else one of the same image
    /// and working directory whose memory and CPU are updated to the shape's. `None` on a miss.
    pub async fn take(&self, shape: &Shape) -> Option<Taken> {
        let (idle, exact) = {
            let mut st = self.state();
            let exact = st.idle.iter().position(|i| &i.shape == shape);
            let updates = !self.inner.no_updates.load(Ordering::Relaxed);
            let close = || {
                st.idle.iter().position(|i| {
                    updates
                        && i.shape.image == shape.image
                        && i.shape.workspace_mb == shape.workspace_mb
                        && i.shape.packages == shape.packages
                })
            };
            match exact
                .map(|i| (i, true))
                .or_else(|| close().map(|i| (i, false)))
            {
                Some((i, exact)) => (st.idle.swap_remove(i), exact),
                None => {
                    drop(st);
                    self.inner.counters.misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        };
        // The pool holds less now: a queued run may start. Its replacement waits until runs
        // end (or the pool's tick): made now, it would take CPU from the run that took it.
        self.changed(Change::Taken);
        let factory = &self.inner.factory;
        let mut spec = idle.spec.clone();
        if !exact {
            let limits = shape.limits();
            let r = limits.resources();
            spec.memory_bytes = r.memory_bytes;
            spec.memory_swap_bytes = r.memory_bytes;
            spec.cpu_quota_us = r.cpu_quota_us;
            spec.cpu_period_us = r.cpu_period_us;
            // /tmp and /dev/shm were sized for the old memory: the update may only keep
            // them within the new one.
            if factory.check_ready(&spec).is_err() {
                self.inner.counters.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if let Err(e) = factory
                .engine()
                .update_container(idle.guard.name(), r)
                .await
            {
                if !self.inner.no_updates.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "the runtime cannot change a started container's limits; from now on a run \
                         is served only by a ready container of its own limits (the pool keeps \
                         those of the limit classes runs ask for)"
                    );
                }
                self.inner.counters.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            self.inner
                .counters
                .updated_hits
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.inner.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
        // The spec may only have been tightened while it waited; check it once more.
        if factory.check_ready(&spec).is_err() {
            return None;
        }
        Some(Taken {
            guard: idle.guard,
            image: idle.image,
        })
    }

    /// Give back at least `mb` of memory by removing idle containers (oldest first); returns
    /// what was given back.
    pub(crate) fn shed(&self, mb: u64) -> u64 {
        let mut st = self.state();
        st.idle.sort_by_key(|i| i.since);
        let mut freed = 0;
        while freed < mb && !st.idle.is_empty() {
            let idle = st.idle.remove(0);
            freed += idle.shape.memory_mb;
            idle.guard.remove_later();
        }
        freed
    }

    /// Remove containers that waited longer than `pool.idle_seconds` (they are replaced by
    /// the next fill), and those beyond what demand has asked for over the last window
    /// (oldest first); forget demand older than the window.
    pub fn expire(&self) {
        let max = Duration::from_secs(self.inner.factory.config().pool.idle_seconds);
        let now = Instant::now();
        let mut st = self.state();
        for d in st.demand.values_mut() {
            d.prune(now);
        }
        st.demand.retain(|_, d| !d.is_forgotten());
        // A prefix no demand names any more is let go (its containers go below).
        let named: std::collections::BTreeSet<String> = st
            .demand
            .keys()
            .filter_map(|s| s.packages.as_ref().map(|m| m.volume.clone()))
            .collect();
        st.prefixes.retain(|v, _| named.contains(v));
        let (mut old, keep): (Vec<Idle>, Vec<Idle>) =
            st.idle.drain(..).partition(|i| i.since.elapsed() >= max);
        let expired = old.len();
        st.idle = keep;
        st.idle.sort_by_key(|i| i.since);
        let shapes: Vec<Shape> = st.idle.iter().map(|i| i.shape.clone()).collect();
        for shape in shapes {
            if st.held(&shape) > st.target(&shape) {
                if let Some(at) = st.idle.iter().position(|i| i.shape == shape) {
                    old.push(st.idle.remove(at));
                }
            }
        }
        drop(st);
        let freed = !old.is_empty();
        self.inner
            .counters
            .expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        self.inner
            .counters
            .trimmed
            .fetch_add((old.len() - expired) as u64, Ordering::Relaxed);
        for idle in old {
            idle.guard.remove_later();
        }
        if freed {
            self.changed(Change::Other);
        }
    }

    /// Stop filling and remove every idle container.
    pub fn close(&self) {
        let mut st = self.state();
        st.closed = true;
        st.floors.clear();
        st.demand.clear();
        st.prefixes.clear();
        for idle in st.idle.drain(..) {
            idle.guard.remove_later();
        }
    }
}
