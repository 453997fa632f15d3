//! Images by tag, kept for a few seconds: their ids, and what their `codebox-init` can do.
//! Every container is created from an image id, not a tag: the run's report then names the
//! image the run really had without asking the engine about the container afterwards, and a
//! tag rebuilt meanwhile cannot slip in between. A rebuilt image serves new containers within
//! `IMAGE_ID_TTL`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::{ContainerEngine, EngineError, LABEL_INIT_FEATURES};

/// How long a tag's id is used without asking the engine again.
const IMAGE_ID_TTL: Duration = Duration::from_secs(10);

/// An image as containers are created from it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRef {
    pub id: String,
    /// Its `codebox-init` takes `check_in_run` (an image built before it does not).
    pub check_in_run: bool,
    /// Its `codebox-init` has the egress relay (`CODEBOX_EGRESS`).
    pub egress: bool,
}

/// Images by tag, shared by the executor and its pool.
pub(super) struct ImageIds {
    engine: Arc<dyn ContainerEngine>,
    known: Mutex<HashMap<String, (ImageRef, Instant)>>,
}

impl ImageIds {
    pub fn new(engine: Arc<dyn ContainerEngine>) -> ImageIds {
        ImageIds {
            engine,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, (ImageRef, Instant)>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The image `tag` names now; `None` when it is not there.
    pub async fn resolve(&self, tag: &str) -> Result<Option<ImageRef>, EngineError> {
        if let Some((image, at)) = self.known().get(tag) {
            if at.elapsed() < IMAGE_ID_TTL {
                return Ok(Some(image.clone()));
            }
        }
        let Some(info) = self.engine.inspect_image(tag).await? else {
            self.known().remove(tag);
            return Ok(None);
        };
        let features = info.labels.get(LABEL_INIT_FEATURES);
        let has =
            |feature: &str| features.is_some_and(|f| f.split_whitespace().any(|x| x == feature));
        let image = ImageRef {
            id: info.id,
            check_in_run: has("check_in_run"),
            egress: has("egress"),
        };
        self.known()
            .insert(tag.to_string(), (image.clone(), Instant::now()));
        Ok(Some(image))
    }

    /// Forget `tag`'s id (the engine no longer has that image).
    pub(crate) fn forget(&self, tag: &str) {
        self.known().remove(tag);
    }
}
