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

    /// Remove one container now (it stays tracked if removal fails).
    pub async fn remove_container(&mut self, name: &str) -> Result<(), EngineError> {
        self.engine.remove_container(name).await?;
        self.containers.retain(|c| c != name);
        Ok(())
    }

    /// Remove everything, containers first (a volume in use cannot be removed).
    pub async fn release(mut self) -> Result<(), EngineError> {
        let containers = std::mem::take(&mut self.containers);
        let volume = self.volume.take();
        remove_all(self.engine.as_ref(), containers, volume).await
    }
}

async fn remove_all(
    engine: &dyn ContainerEngine,
    containers: Vec<String>,
    volume: Option<String>,
) -> Result<(), EngineError> {
    let mut first_error = None;
    for c in &containers {
        if let Err(e) = engine.remove_container(c).await {
            first_error.get_or_insert(e);
        }
    }
    if let Some(v) = &volume {
        if let Err(e) = engine.remove_volume(v).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

impl Drop for RunResources {
    fn drop(&mut self) {
        let containers = std::mem::take(&mut self.containers);
        let volume = self.volume.take();
        if containers.is_empty() && volume.is_none() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(?containers, ?volume, "no runtime to remove containers; they will be reaped at the next start");
            return;
        };
        let engine = self.engine.clone();
        handle.spawn(async move {
            for attempt in 1..=CLEANUP_ATTEMPTS {
                match remove_all(engine.as_ref(), containers.clone(), volume.clone()).await {
                    Ok(()) => return,
                    Err(e) if attempt == CLEANUP_ATTEMPTS => {
                        tracing::warn!(error = %e, ?containers, "cleanup failed; the objects will be reaped at the next start");
                    }
                    Err(_) => tokio::time::sleep(CLEANUP_BACKOFF * attempt).await,
                }
            }
        });
    }
}
