//! Building the images in `images/` through the Engine API, and reporting which are present
//! and which toolchain versions they carry.
//!
//! A build has two steps: the image folder's Dockerfile, then each language's `version`
//! command run in a locked-down container from the new image; the answers become image labels
//! (`codebox.version.<language>`) on the final tag, so versions are recorded at build time,
//! never typed by hand.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::engine::{ContainerEngine, EngineError};
use crate::executor::{Executor, SandboxFailure};
use crate::registry::{Image, Registry};

/// Label prefix under which toolchain versions are recorded.
pub const VERSION_LABEL_PREFIX: &str = "codebox.version.";
/// How long a version command may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);

/// What is known of one image.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ImageStatus {
    pub name: String,
    pub tag: String,
    pub present: bool,
    pub id: Option<String>,
    pub size_bytes: Option<i64>,
    /// Language id -> toolchain version, from the image's labels.
    pub versions: BTreeMap<String, String>,
}

/// Presence, size and versions of every image in the registry.
pub async fn status(
    engine: &dyn ContainerEngine,
    registry: &Registry,
) -> Result<Vec<ImageStatus>, EngineError> {
    let mut out = Vec::new();
    for image in registry.images.values() {
        let info = engine.inspect_image(&image.tag).await?;
        let versions = info
            .as_ref()
            .map(|i| {
                i.labels
                    .iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(VERSION_LABEL_PREFIX)
                            .map(|lang| (lang.to_string(), v.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ImageStatus {
            name: image.name.clone(),
            tag: image.tag.clone(),
            present: info.is_some(),
            id: info.as_ref().map(|i| i.id.clone()),
            size_bytes: info.as_ref().map(|i| i.size_bytes),
            versions,
        });
    }
    Ok(out)
}

/// A failed image build.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("unknown image `{name}`; known: {known}")]
    Unknown { name: String, known: String },
    #[error("cannot read the build context {path}: {source}")]
    Context {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("image {tag}: the version command of `{language}` failed: {source}")]
    Version {
        tag: String,
        language: String,
        #[source]
        source: SandboxFailure,
    },
    #[error("image {tag}: the version command of `{language}` printed nothing (exit code {exit_code:?})")]
    NoVersion {
        tag: String,
        language: String,
        exit_code: Option<i64>,
    },
}

/// Tar a build context folder (the Dockerfile at its root).
fn context_tar(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)?;
    b.into_inner()
}

/// The registry images an image's Dockerfile builds `FROM` (the base image, for a language
/// image).
pub fn dependencies<'a>(registry: &'a Registry, image: &Image) -> Vec<&'a Image> {
    let dockerfile = registry.root().join(&image.context).join("Dockerfile");
    let text = std::fs::read_to_string(dockerfile).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .filter_map(|from| from.split_whitespace().next())
        .filter_map(|tag| registry.images.values().find(|i| i.tag == tag))
        .filter(|i| i.name != image.name)
        .collect()
}

/// The images to build for `names`, each after the images it builds on (which are added).
pub fn build_order<'a>(
    registry: &'a Registry,
    names: &[String],
) -> Result<Vec<&'a Image>, ImageError> {
    fn visit<'a>(registry: &'a Registry, image: &'a Image, out: &mut Vec<&'a Image>, depth: usize) {
        if depth > registry.images.len() || out.iter().any(|i| i.name == image.name) {
            return;
        }
        for dep in dependencies(registry, image) {
            visit(registry, dep, out, depth + 1);
        }
        out.push(image);
    }
    let mut out = Vec::new();
    for name in names {
        visit(registry, find(registry, name)?, &mut out, 0);
    }
    Ok(out)
}

/// Look up an image by its registry name.
pub fn find<'a>(registry: &'a Registry, name: &str) -> Result<&'a Image, ImageError> {
    registry
        .images
        .get(name)
        .ok_or_else(|| ImageError::Unknown {
            name: name.to_string(),
            known: registry
                .images
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Build one image and record its languages' versions. Returns the final image id.
/// `no_cache` rebuilds every layer (to pick up the distribution's security updates).
pub async fn build(
    executor: &Executor,
    registry: &Registry,
    image: &Image,
    no_cache: bool,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<String, ImageError> {
    let engine = executor.engine().as_ref();
    let dir = registry.root().join(&image.context);
    let tar = {
        let d = dir.clone();
        tokio::task::spawn_blocking(move || context_tar(&d))
            .await
            .map_err(|e| ImageError::Context {
                path: dir.display().to_string(),
                source: std::io::Error::other(e),
            })?
            .map_err(|source| ImageError::Context {
                path: dir.display().to_string(),
                source,
            })?
    };
    let base_labels = BTreeMap::from([("codebox.image".to_string(), image.name.clone())]);
    let id = engine
        .build_image(&image.tag, tar, base_labels.clone(), no_cache, progress)
        .await?;

    let mut labels = base_labels;
    for lang in registry.languages_of_image(&image.name) {
        let Some(cmd) = &lang.version else { continue };
        progress(&format!(
            "recording the {} version: {}",
            lang.id,
            cmd.join(" ")
        ));
        let exec = executor
            .probe(&image.tag, cmd.clone(), VERSION_TIMEOUT)
            .await
            .map_err(|source| ImageError::Version {
                tag: image.tag.clone(),
                language: lang.id.clone(),
                source,
            })?;
        let text = format!("{}\n{}", exec.stdout, exec.stderr);
        let Some(version) = text.lines().map(str::trim).find(|l| !l.is_empty()) else {
            return Err(ImageError::NoVersion {
                tag: image.tag.clone(),
                language: lang.id.clone(),
                exit_code: exec.exit_code,
            });
        };
        labels.insert(
            format!("{VERSION_LABEL_PREFIX}{}", lang.id),
            version.to_string(),
        );
    }
    if labels.len() == 1 {
        return Ok(id);
    }
    // A one-line Dockerfile on top of the new image, carrying the version labels.
    let mut b = tar::Builder::new(Vec::new());
    let dockerfile = format!("FROM {id}\n");
    let mut h = tar::Header::new_gnu();
    h.set_size(dockerfile.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
        .expect("tar into memory");
    let tar = b.into_inner().expect("tar into memory");
    Ok(engine
        .build_image(&image.tag, tar, labels, false, &|_| {})
        .await?)
}
