//! The labels every container codebox creates carries: shared by the containers of runs,
//! the pool's and sessions' (a leaf: it uses neither).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::engine::{LABEL_EXPIRES, LABEL_INSTANCE, LABEL_MANAGED, LABEL_RUN};

/// The labels of every container codebox creates: managed, its run (or `pool`), this
/// process, and the time after which it is certainly abandoned (`lifetime` from now).
pub fn labels(run: &str, instance: &str, lifetime: Duration) -> BTreeMap<String, String> {
    let expires = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        + lifetime;
    BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_RUN.to_string(), run.to_string()),
        (LABEL_INSTANCE.to_string(), instance.to_string()),
        (LABEL_EXPIRES.to_string(), expires.as_secs().to_string()),
    ])
}
