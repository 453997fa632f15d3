//! Removes containers and volumes that a crashed or killed codebox instance left behind.

use std::path::Path;

use crate::engine::{ContainerEngine, EngineError, Leftover, LABEL_EXPIRES, LABEL_INSTANCE};
use crate::instance::{Instance, Liveness};

/// What one sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Reaped {
    pub containers: usize,
    pub volumes: usize,
}

/// Each instance is judged once per sweep (one lock-file check per instance).
fn abandoned(
    obj: &Leftover,
    own: &str,
    data_dir: &Path,
    now: u64,
    seen: &mut std::collections::HashMap<String, Liveness>,
) -> bool {
    let instance = obj
        .labels
        .get(LABEL_INSTANCE)
        .map(String::as_str)
        .unwrap_or("");
    if instance == own {
        return false;
    }
    let expired = obj
        .labels
        .get(LABEL_EXPIRES)
        .and_then(|e| e.parse::<u64>().ok())
        .is_none_or(|e| e <= now);
    expired
        || *seen
            .entry(instance.to_string())
            .or_insert_with(|| Instance::liveness(data_dir, instance))
            == Liveness::Dead
}

/// Remove every managed container and volume whose instance is dead or whose expiry passed.
/// Objects of live instances (another codebox process on this host) are left alone.
pub async fn reap(
    engine: &dyn ContainerEngine,
    own_instance: &str,
    data_dir: &Path,
) -> Result<Reaped, EngineError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut reaped = Reaped::default();
    let mut seen = std::collections::HashMap::new();
    for c in engine.list_managed_containers().await? {
        if abandoned(&c, own_instance, data_dir, now, &mut seen) {
            engine.remove_container(&c.id).await?;
            reaped.containers += 1;
        }
    }
    for v in engine.list_managed_volumes().await? {
        if abandoned(&v, own_instance, data_dir, now, &mut seen) {
            match engine.remove_volume(&v.id).await {
                Ok(()) => reaped.volumes += 1,
                // Still used by a container of a live instance.
                Err(e) => tracing::debug!(volume = %v.id, error = %e, "volume not reaped"),
            }
        }
    }
    // Only now that everything a dead instance left is gone may its lock file go: an
    // interrupted sweep (an error above) leaves it, so the next sweep still knows it is dead.
    for (id, liveness) in &seen {
        if *liveness == Liveness::Dead {
            Instance::forget(data_dir, id);
        }
    }
    if reaped != Reaped::default() {
        tracing::info!(
            containers = reaped.containers,
            volumes = reaped.volumes,
            "removed what earlier instances left behind"
        );
    }
    Ok(reaped)
}
