//! Building the images in `images/` through the Engine API, and reporting which are present
//! and which toolchain versions they carry.
//!
//! A build has two steps: the image folder's Dockerfile, then each language's `version`
//! command run in a locked-down container from the new image; the answers become image labels
//! (`codebox.version.<language>`) on the final tag, so versions are recorded at build time,
//! never typed by hand.
//!
//! An image folder may also hold `pypi-wheels.txt`: PyPI wheels (a toolchain that Debian does
//! not package, such as Zig's) that the build downloads on the host, with pip, pinned by
//! version and hash, into the build context's `wheels/` folder. Nothing is fetched inside the
//! build, whose containers may not reach the registry.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::{ContainerEngine, EngineError};
use crate::executor::{Executor, SandboxFailure};
use crate::registry::{Image, Registry};

/// Label prefix under which toolchain versions are recorded.
pub(super) const VERSION_LABEL_PREFIX: &str = "codebox.version.";
/// How long a version command may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);
/// The file of an image folder that lists PyPI wheels to download into the build context.
const WHEELS_FILE: &str = "pypi-wheels.txt";
/// Where the downloaded wheels appear in the build context.
const WHEELS_DIR: &str = "wheels";

/// What is known of one image.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct ImageStatus {
    pub name: String,
    pub tag: String,
    pub present: bool,
    pub id: Option<String>,
    pub size_bytes: Option<i64>,
    /// Language id -> toolchain version, from the image's labels.
    pub versions: BTreeMap<String, String>,
}

/// Presence, size and versions of every image in the registry.
pub(crate) async fn status(
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
pub(crate) enum ImageError {
    #[error("unknown image `{name}`; known: {known}")]
    Unknown { name: String, known: String },
    #[error("cannot read the build context {path}: {source}")]
    Context {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot download the wheels listed in {path}: {detail}")]
    Wheels { path: String, detail: String },
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

/// Tar a build context folder (the Dockerfile at its root), with the downloaded wheels, if
/// any, under `wheels/`.
fn context_tar(dir: &Path, wheels: Option<&Path>) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)?;
    if let Some(w) = wheels {
        b.append_dir_all(WHEELS_DIR, w)?;
    }
    b.into_inner()
}

/// The pip arguments that download the wheels listed in `list` into `dest`. Every line must
/// pin a hash (`--require-hashes`), and only built wheels are taken (`--only-binary`): a
/// source distribution would run its build script on the host.
fn pip_download_args(list: &Path, dest: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--dest",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push(dest.into());
    args.push("--requirement".into());
    args.push(list.into());
    args
}

/// A folder of downloaded wheels, removed when dropped.
#[derive(Debug)]
struct Wheels {
    pub dir: PathBuf,
}

impl Drop for Wheels {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Download the wheels listed in `list` (pip's requirements format, each line pinned with
/// `--hash`) into a fresh temporary folder, with the host's `python3 -m pip` (pip keeps its own
/// download cache, so a rebuild does not fetch them again).
async fn fetch_wheels(list: &Path) -> Result<Wheels, ImageError> {
    let failed = |detail: String| ImageError::Wheels {
        path: list.display().to_string(),
        detail,
    };
    let wheels = Wheels {
        dir: std::env::temp_dir().join(format!("codebox-wheels-{}", uuid::Uuid::new_v4().simple())),
    };
    std::fs::create_dir_all(&wheels.dir).map_err(|e| failed(e.to_string()))?;
    let out = tokio::process::Command::new("python3")
        .args(pip_download_args(list, &wheels.dir))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| {
            failed(format!(
                "cannot run `python3 -m pip` on this host ({e}); install pip"
            ))
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        return Err(failed(format!(
            "pip exited with {}: {}",
            out.status,
            tail[tail.len().saturating_sub(6)..].join(" / ")
        )));
    }
    Ok(wheels)
}

/// The registry images an image's Dockerfile builds `FROM` (the base image, for a language
/// image).
pub(super) fn dependencies<'a>(registry: &'a Registry, image: &Image) -> Vec<&'a Image> {
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
pub(super) fn build_order<'a>(
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
pub(crate) fn find<'a>(registry: &'a Registry, name: &str) -> Result<&'a Image, ImageError> {
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
pub(crate) async fn build(
    executor: &Executor,
    registry: &Registry,
    image: &Image,
    no_cache: bool,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<String, ImageError> {
    let engine = executor.engine().as_ref();
    let dir = registry.root().join(&image.context);
    let list = dir.join(WHEELS_FILE);
    let wheels = if list.is_file() {
        progress(&format!(
            "downloading the wheels listed in {}",
            list.display()
        ));
        Some(fetch_wheels(&list).await?)
    } else {
        None
    };
    let tar = {
        let d = dir.clone();
        let w = wheels.as_ref().map(|w| w.dir.clone());
        tokio::task::spawn_blocking(move || context_tar(&d, w.as_deref()))
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
    drop(wheels);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_context_carries_the_downloaded_wheels_under_wheels() {
        let context = tempfile::tempdir().unwrap();
        std::fs::write(context.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        let wheels = tempfile::tempdir().unwrap();
        std::fs::write(wheels.path().join("tool-1.0-py3-none-any.whl"), b"zip").unwrap();
        let names = |tar: Vec<u8>| -> Vec<String> {
            tar::Archive::new(&tar[..])
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect()
        };
        let with = names(context_tar(context.path(), Some(wheels.path())).unwrap());
        assert!(with.iter().any(|n| n == "Dockerfile"), "{with:?}");
        assert!(
            with.iter().any(|n| n == "wheels/tool-1.0-py3-none-any.whl"),
            "{with:?}"
        );
        let without = names(context_tar(context.path(), None).unwrap());
        assert!(
            !without.iter().any(|n| n.starts_with("wheels")),
            "{without:?}"
        );
    }

    #[test]
    fn wheels_are_downloaded_pinned_by_hash_and_never_built_on_the_host() {
        let args: Vec<String> = pip_download_args(Path::new("/x/pypi-wheels.txt"), Path::new("/d"))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        for flag in ["--require-hashes", "--only-binary=:all:", "--no-deps"] {
            assert!(
                args.iter().any(|a| a == flag),
                "{flag} missing from {args:?}"
            );
        }
        assert_eq!(args[..3], ["-m", "pip", "download"]);
        assert!(args.ends_with(&[
            "--dest".to_string(),
            "/d".to_string(),
            "--requirement".to_string(),
            "/x/pypi-wheels.txt".to_string()
        ]));
    }

    #[test]
    fn the_wheels_folder_is_removed_when_dropped() {
        let dir = std::env::temp_dir().join(format!("codebox-wheels-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.whl"), b"x").unwrap();
        drop(Wheels { dir: dir.clone() });
        assert!(!dir.exists());
    }
}
