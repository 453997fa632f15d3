//! A session's own packages volume (SPEC 13: "in a session, `run_code` with `packages`
//! installs into the session, kept for its life"). A running container cannot gain a mount,
//! so every session of a language that takes packages gets an empty volume of its own,
//! mounted read-only at the language's prefix from the start. A request for packages installs
//! the union of what the session holds and what it asks for, once, into the cache (or takes
//! that union from the cache), and copies it into the session's volume: the program keeps
//! its interpreter and sees the new files where it looked before.
//!
//! A session's packages only grow: an install that would change the version of a package the
//! session holds, or drop one, is refused (modules already imported cannot be swapped under a
//! running interpreter), and a failed install leaves the volume as it was: the copy into it
//! comes last, and once begun it is carried to its end.
//!
//! # Security
//! The program's container still mounts the volume read-only and keeps `network_mode=none`;
//! what is written into it comes from the install container through one container that is
//! created and never started: after a fresh install the one that fills the cache's volume
//! (it mounts the session's too), from the cache one that mounts the cached prefix read-only.
//! One session install so makes two containers, or one from the cache. The union is installed
//! whole into a prefix capped at `packages.prefix_mb`, so a session's prefix never grows
//! beyond it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{InstallEnd, InstallFailure, Obtained, Packages, Staged, Want, SESSION_TARGET};
use crate::contract::run::MAX_PACKAGES;
use crate::engine::guard::{Cleanup, ContainerGuard};
use crate::engine::posture::PACKAGES_VOLUME_PREFIX;
use crate::engine::ContainerEngine;
use crate::executor::factory::Volume;
use crate::executor::labels;
use crate::executor::stage::Bound;
use crate::registry::Language;
use crate::report::{InstalledPackage, PackagesReport, Status, Usage};

/// Tries of the copy into a session's volume, and how long each may take: its own limit, not
/// the run's, so that a run's end never leaves it half done.
const COPY_TRIES: u32 = 3;
const COPY_LIMIT: Duration = Duration::from_secs(60);
/// How long the volume's removal keeps trying while its container is still being removed.
const REMOVE_TRIES: u32 = 120;
const REMOVE_PAUSE: Duration = Duration::from_millis(250);

/// What the session's volume holds.
#[derive(Default)]
struct Held {
    /// The requirements installed, sorted.
    requirements: Vec<String>,
    installed: Vec<InstalledPackage>,
}

/// A session's packages volume and what it holds. Dropping it removes the volume (once no
/// container mounts it any more).
pub(crate) struct SessionPrefix {
    volume: String,
    target: String,
    env: BTreeMap<String, String>,
    engine: Arc<dyn ContainerEngine>,
    cleanup: Cleanup,
    held: tokio::sync::Mutex<Held>,
    removing: AtomicBool,
    removed: watch::Sender<bool>,
}

impl SessionPrefix {
    /// An empty volume for a session of `lang` (which must take packages), named after
    /// `name` (the session container's name) and labelled to be reaped after `lifetime`.
    pub async fn create(
        packages: &Packages,
        lang: &Language,
        name: &str,
        lifetime: Duration,
    ) -> Result<SessionPrefix, InstallEnd> {
        let Some(install) = &lang.install else {
            return Err(InstallFailure::NoInstallStep {
                language: lang.id.clone(),
            }
            .into());
        };
        let suffix = name.strip_prefix("codebox-").unwrap_or(name);
        let volume = format!(
            "{PACKAGES_VOLUME_PREFIX}{suffix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        // Labelled as the session's container is (`codebox.run=session`).
        let vlabels = labels(
            "session",
            &packages.instance,
            lifetime + Duration::from_secs(600),
        );
        packages
            .factory
            .engine()
            .create_volume(&volume, vlabels)
            .await
            .map_err(InstallFailure::Engine)?;
        let (removed, _) = watch::channel(false);
        Ok(SessionPrefix {
            volume,
            target: install.prefix.clone(),
            env: install.env.clone(),
            engine: packages.factory.engine().clone(),
            cleanup: packages.factory.cleanup().clone(),
            held: tokio::sync::Mutex::new(Held::default()),
            removing: AtomicBool::new(false),
            removed,
        })
    }

    pub fn volume(&self) -> &str {
        &self.volume
    }

    /// Where the program sees it.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the program's environment gains (`PYTHONPATH`, ...).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// Install `requested` into the session: the union with what it holds, from the cache or
    /// installed now, then copied into the session's volume. The report's `installed` is
    /// everything the session holds afterwards; `install_ms` includes the copy.
    pub(crate) async fn add(
        &self,
        packages: &Packages,
        run_id: &str,
        lang: &Language,
        image_id: &str,
        requested: &[String],
        bound: Bound<'_>,
    ) -> Result<PackagesReport, InstallEnd> {
        let began = Instant::now();
        let mut held = self.held.lock().await;
        let mut union: Vec<String> = held.requirements.clone();
        union.extend(requested.iter().cloned());
        union.sort();
        union.dedup();
        if union == held.requirements {
            return Ok(PackagesReport {
                requested: requested.to_vec(),
                installed: held.installed.clone(),
                cached: true,
                install_ms: 0,
            });
        }
        let refuse = |message: String| InstallEnd::Failed {
            status: Status::Failed,
            message,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            usage: Usage::default(),
            install_ms: 0,
        };
        if union.len() > MAX_PACKAGES {
            return Err(refuse(format!(
                "the session would hold {} requirements with these; at most {MAX_PACKAGES} (create a new session for more)",
                union.len()
            )));
        }
        let want = Want {
            run_id,
            lang,
            image_id,
            requirements: &union,
            bound,
        };
        let obtained = packages.obtain(want, Some(&self.volume)).await;
        let Obtained {
            prefix,
            report,
            staged,
        } = match obtained {
            Ok(p) => p,
            Err(mut end) => {
                // What the session holds took part: say so when a request names it again.
                if let InstallEnd::Failed { message, .. } = &mut end {
                    let clash: Vec<&str> = held
                        .requirements
                        .iter()
                        .filter(|h| {
                            requested.iter().any(|r| {
                                r != *h
                                    && super::requirement_name(r)
                                        .eq_ignore_ascii_case(super::requirement_name(h))
                            })
                        })
                        .map(|h| h.as_str())
                        .collect();
                    if !clash.is_empty() {
                        *message = format!(
                            "{message}; it was installed with what this session holds ({}), and a session's packages only grow: create a new session for other versions",
                            clash.join(", ")
                        );
                    }
                }
                return Err(end);
            }
        };
        if let Some(changed) = changed(&held.installed, &report.installed) {
            return Err(refuse(format!(
                "installing {} would {changed}, which this session already holds; a session's packages only grow (its interpreter may have imported them): create a new session for other versions",
                requested.join(", ")
            )));
        }
        let into = Volume {
            name: &self.volume,
            target: SESSION_TARGET,
        };
        let (copier, tar) = match staged {
            Some(Staged { copier, tar }) => (copier, tar),
            None => {
                // From the cache: one container that mounts the cached prefix read-only.
                let from = Volume {
                    name: &prefix.volume,
                    target: &prefix.target,
                };
                let copier = packages
                    .copier(run_id, image_id, &[into], Some(from), bound)
                    .await?;
                let tar = packages.download(&copier, &prefix.target, bound).await?;
                (copier, tar)
            }
        };
        let copy = SessionCopy {
            packages,
            run_id,
            image_id,
            into,
        };
        let copied = self.copy_whole(copy, copier, tar).await;
        drop(prefix);
        copied?;
        held.requirements = union;
        held.installed = report.installed.clone();
        Ok(PackagesReport {
            requested: requested.to_vec(),
            installed: report.installed,
            cached: report.cached,
            install_ms: began.elapsed().as_millis() as u64,
        })
    }

    /// Copy `tar` into the session's volume, all of it, through `copier` (a container that
    /// mounts it writable at [`SESSION_TARGET`]). A copy cannot be undone (no container
    /// that could delete files ever starts on the volume), so once begun it runs to its end:
    /// a stop meanwhile takes effect after it, and a copy cut short is made again through a
    /// new container (the same files; what the session holds only grows). Should every try
    /// fail, what the session holds stays recorded as before, so the next request for these
    /// packages copies again.
    async fn copy_whole(
        &self,
        copy: SessionCopy<'_>,
        copier: ContainerGuard,
        tar: Vec<u8>,
    ) -> Result<(), InstallEnd> {
        let never = tokio_util::sync::CancellationToken::new();
        let mut copier = Some(copier);
        let mut failed = None;
        for _ in 0..COPY_TRIES {
            let bound = Bound::new(&never, tokio::time::Instant::now() + COPY_LIMIT);
            let copied = match copier.take() {
                Some(c) => copy.upload(c, tar.clone(), bound).await,
                None => match copy.copier(bound).await {
                    Ok(c) => copy.upload(c, tar.clone(), bound).await,
                    Err(e) => Err(e),
                },
            };
            match copied {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(volume = %self.volume, error = ?e, "copying packages into a session failed; trying again");
                    failed = Some(e);
                }
            }
        }
        Err(failed.expect("tried at least once"))
    }

    /// Remove the volume once `container_gone` ends (its container's removal), in the
    /// background; idempotent.
    pub(crate) fn remove_after(
        &self,
        container_gone: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if self.removing.swap(true, Ordering::SeqCst) {
            return;
        }
        let engine = self.engine.clone();
        let volume = self.volume.clone();
        let removed = self.removed.clone();
        self.cleanup.spawn(async move {
            container_gone.await;
            for _ in 0..REMOVE_TRIES {
                if engine.remove_volume(&volume).await.is_ok() {
                    removed.send_replace(true);
                    return;
                }
                tokio::time::sleep(REMOVE_PAUSE).await;
            }
            tracing::warn!(%volume, "a session's packages volume could not be removed");
            removed.send_replace(true);
        });
    }

    /// Ends once the volume's removal has ended.
    pub fn removed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut removed = self.removed.subscribe();
        async move {
            let _ = removed.wait_for(|done| *done).await;
        }
    }
}

impl Drop for SessionPrefix {
    fn drop(&mut self) {
        // Its container may still be being removed: the removal tries again meanwhile.
        self.remove_after(async {});
    }
}

/// A copy into a session's volume: who copies, for which run, from which image, into which
/// volume.
#[derive(Clone, Copy)]
struct SessionCopy<'a> {
    packages: &'a Packages,
    run_id: &'a str,
    image_id: &'a str,
    into: Volume<'a>,
}

impl SessionCopy<'_> {
    /// A new container that mounts the session's volume writable, and nothing else.
    async fn copier(&self, bound: Bound<'_>) -> Result<ContainerGuard, InstallEnd> {
        let into = [self.into];
        (self.packages)
            .copier(self.run_id, self.image_id, &into, None, bound)
            .await
    }

    /// Upload `tar` through `copier`, then remove it.
    async fn upload(
        &self,
        copier: ContainerGuard,
        tar: Vec<u8>,
        bound: Bound<'_>,
    ) -> Result<(), InstallEnd> {
        let uploaded = self
            .packages
            .upload(&copier, self.into.target, tar, bound)
            .await;
        copier.remove_later();
        uploaded
    }
}

/// How `after` changes a package of `before` (its version, or its absence), if it does.
fn changed(before: &[InstalledPackage], after: &[InstalledPackage]) -> Option<String> {
    let norm = |n: &str| n.to_ascii_lowercase().replace(['_', '.'], "-");
    for b in before {
        match after.iter().find(|a| norm(&a.name) == norm(&b.name)) {
            Some(a) if a.version == b.version => {}
            Some(a) => return Some(format!("change {} {} to {}", b.name, b.version, a.version)),
            None => return Some(format!("drop {} {}", b.name, b.version)),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, version: &str) -> InstalledPackage {
        InstalledPackage {
            name: name.into(),
            version: version.into(),
        }
    }

    #[test]
    fn a_session_prefix_may_only_grow() {
        let before = [p("tiny_pkg", "1.0")];
        assert_eq!(
            changed(&before, &[p("Tiny-Pkg", "1.0"), p("other", "1")]),
            None
        );
        assert_eq!(
            changed(&before, &[p("tiny-pkg", "2.0")]).as_deref(),
            Some("change tiny_pkg 1.0 to 2.0")
        );
        assert_eq!(
            changed(&before, &[p("other", "1")]).as_deref(),
            Some("drop tiny_pkg 1.0")
        );
    }
}
