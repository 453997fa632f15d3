//! Ownership of a run's containers and volume: whatever is tracked here is removed, on the
//! happy path by [`RunResources::release`], on every other path (error, timeout, panic,
//! cancellation) by `Drop`.

use std::sync::Arc;
use std::time::Duration;

use super::{ContainerEngine, EngineError};

/// How often a background cleanup retries a removal the engine refused.
const CLEANUP_ATTEMPTS: u32 = 5;
const CLEANUP_BACKOFF: Duration = Duration::from_millis(500);

/// The containers and volume of one run. Names are tracked *before* the engine is asked to
/// create them, so an interrupted create is still cleaned up (removal is idempotent).
pub struct RunResources {
    engine: Arc<dyn ContainerEngine>,
    containers: Vec<String>,
    volume: Option<String>,
}

impl RunResources {
    pub fn new(engine: Arc<dyn ContainerEngine>) -> Self {
        RunResources {
            engine,
            containers: Vec::new(),
            volume: None,
        }
    }

    pub fn track_container(&mut self, name: &str) {
        self.containers.push(name.to_string());
    }

    pub fn track_volume(&mut self, name: &str) {
        self.volume = Some(name.to_string());
    }

    /// Stop owning a container that was removed by other means.
    pub fn untrack_container(&mut self, name: &str) {
        self.containers.retain(|c| c != name);
    }

    /// Remove everything, containers first (a volume in use cannot be removed). What could
    /// not be removed is retried in the background (by `Drop`), and the error returned.
    pub async fn release(mut self) -> Result<(), EngineError> {
        let containers = std::mem::take(&mut self.containers);
        let volume = self.volume.take();
        let left = remove_all(self.engine.as_ref(), containers, volume).await;
        match left.error {
            None => Ok(()),
            Some(e) => {
                self.containers = left.containers;
                self.volume = left.volume;
                Err(e)
            }
        }
    }
}

/// What a removal pass could not remove.
struct Left {
    containers: Vec<String>,
    volume: Option<String>,
    error: Option<EngineError>,
}

async fn remove_all(
    engine: &dyn ContainerEngine,
    containers: Vec<String>,
    volume: Option<String>,
) -> Left {
    let mut left = Left {
        containers: Vec::new(),
        volume: None,
        error: None,
    };
    for c in containers {
        if let Err(e) = engine.remove_container(&c).await {
            left.error.get_or_insert(e);
            left.containers.push(c);
        }
    }
    if let Some(v) = volume {
        if let Err(e) = engine.remove_volume(&v).await {
            left.error.get_or_insert(e);
            left.volume = Some(v);
        }
    }
    left
}

impl Drop for RunResources {
    fn drop(&mut self) {
        let containers = std::mem::take(&mut self.containers);
        let volume = self.volume.take();
        if containers.is_empty() && volume.is_none() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                ?containers,
                ?volume,
                "no runtime to remove containers; they will be reaped at the next start"
            );
            return;
        };
        let engine = self.engine.clone();
        handle.spawn(async move {
            let (mut containers, mut volume) = (containers, volume);
            for attempt in 1..=CLEANUP_ATTEMPTS {
                let left = remove_all(engine.as_ref(), containers, volume).await;
                let Some(e) = left.error else { return };
                if attempt == CLEANUP_ATTEMPTS {
                    tracing::warn!(error = %e, containers = ?left.containers, volume = ?left.volume, "cleanup failed; the objects will be reaped at the next start");
                    return;
                }
                (containers, volume) = (left.containers, left.volume);
                tokio::time::sleep(CLEANUP_BACKOFF * attempt).await;
            }
        });
    }
}
