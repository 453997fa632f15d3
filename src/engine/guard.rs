//! Ownership of containers: each container has exactly one [`ContainerGuard`], made by the
//! executor's container factory right before the engine is asked to create it (so an
//! interrupted create is still cleaned up), whose removal runs on every path: explicitly
//! (`ContainerGuard::remove_later`) or from `Drop` (error, panic, cancellation). Removal is
//! idempotent. The sandbox uid the container runs as is returned only once it is gone.
//!
//! Removals that happen in the background are tracked by [`Cleanup`], so that shutdown can
//! wait for them and a process whose removals failed for good keeps its instance lock file
//! (the next start then reaps at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use tokio::sync::watch;

use super::uids::UidLease;
use super::{detail, ContainerEngine, ContainerSpec, EngineError};

/// How often a background removal retries a removal the engine refused.
const CLEANUP_ATTEMPTS: u32 = 5;
const CLEANUP_BACKOFF: Duration = Duration::from_millis(500);
/// How long a removal waits for the answer to a create nobody waits for any more (a stop or
/// a deadline came first): the daemon that received it may still make the container.
const CREATE_SETTLE: Duration = Duration::from_secs(30);

/// Told how long each background removal took.
type RemovalObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// The background removals of one process.
#[derive(Clone, Default)]
pub struct Cleanup {
    tracker: TaskTracker,
    failed: Arc<AtomicBool>,
    observer: Option<RemovalObserver>,
}

impl Cleanup {
    /// Background removals report their duration to `observer`.
    pub(crate) fn observed(observer: RemovalObserver) -> Cleanup {
        Cleanup {
            observer: Some(observer),
            ..Cleanup::default()
        }
    }

    /// Wait (up to `timeout`) for every background removal; `true` if all finished.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.tracker.close();
        let done = tokio::time::timeout(timeout, self.tracker.wait())
            .await
            .is_ok();
        self.tracker.reopen();
        done
    }

    /// Whether some container could not be removed (it is left for the reaper).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Removals under way.
    pub fn pending(&self) -> usize {
        self.tracker.len()
    }

    /// Run `task` in the background as part of cleanup: [`Cleanup::drain`] waits for it too
    /// (used for containers being started ahead of time, which must not outlive shutdown).
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task);
    }
}

/// The one owner of a container.
pub struct ContainerGuard {
    engine: Arc<dyn ContainerEngine>,
    cleanup: Cleanup,
    name: Option<String>,
    lease: Option<UidLease>,
    /// Set once a create was asked for; `true` when it has answered.
    created: Option<watch::Receiver<bool>>,
    /// `true` once the removal has ended (the container is gone, or left for the reaper).
    removed: Arc<watch::Sender<bool>>,
}

impl ContainerGuard {
    /// Own the container `name` (not created yet) that runs as the lease's uid. Only the
    /// executor's container factory makes guards, right after the spec passed its check.
    pub(crate) fn new(
        engine: Arc<dyn ContainerEngine>,
        cleanup: Cleanup,
        name: String,
        lease: UidLease,
    ) -> ContainerGuard {
        ContainerGuard {
            engine,
            cleanup,
            name: Some(name),
            lease: Some(lease),
            created: None,
            removed: Arc::new(watch::channel(false).0),
        }
    }

    /// Becomes `true` when the container's removal has ended (whoever started it).
    pub fn removed(&self) -> watch::Receiver<bool> {
        self.removed.subscribe()
    }

    /// Ask the engine to create the container. The request runs to its answer even when the
    /// caller stops waiting (a stop, a deadline, shutdown), and the removal waits for that
    /// answer: whatever path creates a container is the one that removes it, and nothing is
    /// left `Created`.
    pub(crate) async fn create(&mut self, spec: &ContainerSpec) -> Result<String, EngineError> {
        let (answered, rx) = watch::channel(false);
        self.created = Some(rx);
        let engine = self.engine.clone();
        let spec = spec.clone();
        let call = self.cleanup.tracker.spawn(async move {
            let r = engine.create_container(&spec).await;
            let _ = answered.send(true);
            r
        });
        match call.await {
            Ok(r) => r,
            Err(e) => Err(EngineError::CreateContainer(detail(format!(
                "the create call's task ended: {e}"
            )))),
        }
    }

    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// Remove the container in the background (after the report is on its way).
    pub(crate) fn remove_later(mut self) {
        self.spawn_removal();
    }

    fn spawn_removal(&mut self) {
        let Some(name) = self.name.take() else { return };
        let lease = self.lease.take();
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                container = name,
                "no runtime to remove a container; it will be reaped at the next start"
            );
            self.cleanup.failed.store(true, Ordering::Relaxed);
            self.removed.send_replace(true);
            return;
        };
        let removed = self.removed.clone();
        let engine = self.engine.clone();
        let failed = self.cleanup.failed.clone();
        let observer = self.cleanup.observer.clone();
        let created = self.created.take();
        let task = async move {
            let _told = Told(removed);
            let began = tokio::time::Instant::now();
            if let Some(mut answered) = created {
                let _ = tokio::time::timeout(CREATE_SETTLE, answered.wait_for(|a| *a)).await;
            }
            for attempt in 1..=CLEANUP_ATTEMPTS {
                match engine.remove_container(&name).await {
                    Ok(()) => {
                        drop(lease);
                        if let Some(observe) = observer {
                            observe(began.elapsed());
                        }
                        return;
                    }
                    Err(e) if attempt == CLEANUP_ATTEMPTS => {
                        failed.store(true, Ordering::Relaxed);
                        tracing::warn!(error = %e, container = name, "removal failed; the container will be reaped at the next start");
                    }
                    Err(_) => tokio::time::sleep(CLEANUP_BACKOFF * attempt).await,
                }
            }
        };
        self.cleanup.tracker.spawn_on(task, &handle);
    }
}

/// Tells the guard's watchers that the removal ended, however its task ends.
struct Told(Arc<watch::Sender<bool>>);

impl Drop for Told {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        self.spawn_removal();
    }
}
