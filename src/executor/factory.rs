//! The one container factory: every container codebox creates (a run's stages and test cases,
//! a session's, the pool's ready ones, the install step's and the ones that copy installed
//! packages) is made here, the same way: a sandbox uid leased for it alone, its plan, the
//! locked-down spec of what it is for, the posture check of that role, a guard that will
//! remove it, and only then the engine's create.
//!
//! # Security
//! [`Factory::make`] is the only place in the executor that builds a spec, asks the posture
//! check ([`posture::check_as`], by the role its [`Purpose`] gives) and makes a
//! [`ContainerGuard`]: no container is created without passing the check right before, none
//! without an owner that removes it on every path. Each container gets a name and a uid of its
//! own and is handed to exactly one caller (one run, one session or one install). A ready
//! container whose limits were changed after its create is checked again here
//! ([`Factory::check_ready`]) before it serves a run.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::egress::{with_program_egress, ProgramEgress};
use super::stage::{Bound, BoundError};
use crate::config::Config;
use crate::engine::guard::{Cleanup, ContainerGuard};
use crate::engine::posture::{self, Limits, Plan, PostureViolation, Role};
use crate::engine::uids::UidPool;
use crate::engine::{ContainerEngine, ContainerSpec, VolumeMount};

/// A packages volume and where a container sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Volume<'a> {
    pub name: &'a str,
    pub target: &'a str,
}

/// What a container is for: its spec and the role it is checked as follow from it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purpose<'a> {
    /// Programs run in it (a run's stage, a test case, a session, a ready container of the
    /// pool): no network, an installed prefix mounted read-only, the programs' egress when
    /// the operator set it. `relay`: its image's codebox-init has the egress relay;
    /// `image_name` names the image to rebuild when it has not.
    Program {
        prefix: Option<Volume<'a>>,
        relay: bool,
        image_name: &'a str,
    },
    /// An install: under `runtime`, its one way out the install's proxy listening in `egress`.
    Install { runtime: &'a str, egress: &'a Path },
    /// Copies installed prefixes through the engine's archive calls, never started: into the
    /// volumes of `into` (writable), out of `from` (read-only).
    Copy {
        into: &'a [Volume<'a>],
        from: Option<Volume<'a>>,
    },
}

impl<'a> Purpose<'a> {
    fn role(&self) -> Role<'a> {
        match *self {
            Purpose::Program { .. } => Role::Run,
            Purpose::Install { runtime, .. } => Role::Install { runtime },
            Purpose::Copy { .. } => Role::Copy,
        }
    }

    /// The create's name in a deadline's message.
    fn step(&self) -> &'static str {
        match self {
            Purpose::Program { .. } => "creating the container",
            Purpose::Install { .. } => "creating the install container",
            Purpose::Copy { .. } => "creating the container that copies the packages",
        }
    }
}

/// One container to make.
pub(crate) struct Order<'a> {
    /// Its name, unique.
    pub name: String,
    /// The id of the image it is created from.
    pub image: &'a str,
    pub limits: Limits,
    pub workspace_mb: u64,
    pub labels: BTreeMap<String, String>,
    pub purpose: Purpose<'a>,
}

/// A container created (not started): its one owner, and the spec it passed the check with.
pub(crate) struct Made {
    pub guard: ContainerGuard,
    pub spec: ContainerSpec,
}

/// Why a container was not made, one variant per step.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MakeError {
    /// The programs' egress could not be given to it (why, naming the image).
    #[error("{0}")]
    Egress(String),
    #[error(transparent)]
    Posture(#[from] PostureViolation),
    /// The engine's create failed, or a stop or the deadline came first.
    #[error(transparent)]
    Create(#[from] BoundError),
}

/// Makes every container of one executor. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Factory {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    uids: Arc<UidPool>,
    cleanup: Cleanup,
    /// Programs' own egress (`sandbox.egress_hosts`), when the operator set it.
    egress: Option<Arc<ProgramEgress>>,
}

impl Factory {
    /// A factory whose containers lease uids under `config.data_dir` and are removed through
    /// `cleanup`.
    pub(crate) fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        cleanup: Cleanup,
        egress: Option<Arc<ProgramEgress>>,
    ) -> Factory {
        Factory {
            uids: UidPool::new(&config.data_dir),
            engine,
            config,
            cleanup,
            egress,
        }
    }

    pub(crate) fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.engine
    }

    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub(crate) fn cleanup(&self) -> &Cleanup {
        &self.cleanup
    }

    /// Make one container (created, not started): lease its uid, build its spec for its
    /// purpose, check it, give it its guard, create it. With a `bound`, the create gives up
    /// at a stop or the deadline (the guard still removes what the engine makes).
    pub(crate) async fn make(
        &self,
        order: Order<'_>,
        bound: Option<Bound<'_>>,
    ) -> Result<Made, MakeError> {
        let lease = self.uids.lease();
        let plan = Plan {
            name: order.name,
            image: order.image.to_string(),
            uid: lease.uid,
            limits: order.limits,
            workspace_mb: order.workspace_mb,
            labels: order.labels,
        };
        let sandbox = &self.config.sandbox;
        let purpose = order.purpose;
        let spec = match purpose {
            Purpose::Program {
                prefix,
                relay,
                image_name,
            } => {
                let mut spec = posture::locked_down(&plan, sandbox);
                if let Some(p) = prefix {
                    posture::with_prefix(&mut spec, p.name, p.target);
                }
                if let Some(e) = &self.egress {
                    with_program_egress(&mut spec, e, relay, image_name)
                        .await
                        .map_err(MakeError::Egress)?;
                }
                spec
            }
            Purpose::Install { runtime, egress } => {
                posture::install(&plan, sandbox, runtime, egress)
            }
            Purpose::Copy { into, from } => {
                let mount = |v: &Volume<'_>, read_only| VolumeMount {
                    volume: v.name.to_string(),
                    target: v.target.to_string(),
                    read_only,
                };
                let volumes = (into.iter().map(|v| mount(v, false)))
                    .chain(from.iter().map(|v| mount(v, true)))
                    .collect();
                posture::copier(&plan, sandbox, volumes)
            }
        };
        self.check(&spec, purpose.role())?;
        let mut guard =
            ContainerGuard::new(self.engine.clone(), self.cleanup.clone(), plan.name, lease);
        match bound {
            Some(b) => b.call(purpose.step(), guard.create(&spec)).await?,
            None => guard.create(&spec).await.map_err(BoundError::Engine)?,
        };
        Ok(Made { guard, spec })
    }

    /// Check once more the spec of a ready container (a program's) before it serves a run:
    /// its limits may have been changed since it was made.
    pub(crate) fn check_ready(&self, spec: &ContainerSpec) -> Result<(), PostureViolation> {
        self.check(spec, Role::Run)
    }

    /// The posture check, the one call of it in the executor.
    fn check(&self, spec: &ContainerSpec, role: Role<'_>) -> Result<(), PostureViolation> {
        posture::check_as(spec, &self.config.sandbox, role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeEngine;
    use crate::engine::posture::PACKAGES_VOLUME_PREFIX;
    use std::os::unix::fs::PermissionsExt;

    const IMAGE: &str = "sha256:fake-python";

    struct Harness {
        fake: Arc<FakeEngine>,
        factory: Factory,
        cleanup: Cleanup,
        data: tempfile::TempDir,
    }

    fn harness() -> Harness {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: data.path().to_path_buf(),
            ..Config::default()
        };
        let fake = Arc::new(FakeEngine::new());
        let cleanup = Cleanup::default();
        let factory = Factory::new(fake.clone(), Arc::new(config), cleanup.clone(), None);
        Harness {
            fake,
            factory,
            cleanup,
            data,
        }
    }

    fn order<'a>(name: &str, purpose: Purpose<'a>) -> Order<'a> {
        Order {
            name: name.to_string(),
            image: IMAGE,
            limits: Limits {
                memory_mb: 128,
                cpus: 1.0,
            },
            workspace_mb: 16,
            labels: BTreeMap::new(),
            purpose,
        }
    }

    /// A directory as an install's proxy makes it (mode 0711, empty until it listens).
    fn egress_dir(h: &Harness, mode: u32) -> std::path::PathBuf {
        let dir = h.data.path().join("egress").join(format!("{mode:o}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    }

    #[tokio::test]
    async fn every_container_made_passed_the_posture_check_of_its_role() {
        let h = harness();
        let volume = format!("{PACKAGES_VOLUME_PREFIX}v");
        let prefix = Volume {
            name: &volume,
            target: "/opt/pkgs",
        };
        let session_volume = format!("{PACKAGES_VOLUME_PREFIX}session");
        let session = Volume {
            name: &session_volume,
            target: "/opt/session",
        };
        let egress = egress_dir(&h, 0o711);
        let runtime = h.factory.config.sandbox.runtime.clone();
        let purposes = [
            (
                "codebox-r-run",
                Purpose::Program {
                    prefix: None,
                    relay: true,
                    image_name: "python",
                },
            ),
            (
                "codebox-r-prefixed",
                Purpose::Program {
                    prefix: Some(prefix),
                    relay: true,
                    image_name: "python",
                },
            ),
            (
                "codebox-r-install",
                Purpose::Install {
                    runtime: &runtime,
                    egress: &egress,
                },
            ),
            (
                "codebox-r-fill",
                Purpose::Copy {
                    into: &[prefix],
                    from: None,
                },
            ),
            (
                "codebox-r-copy",
                Purpose::Copy {
                    into: &[session],
                    from: Some(prefix),
                },
            ),
            (
                "codebox-r-fill-both",
                Purpose::Copy {
                    into: &[prefix, session],
                    from: None,
                },
            ),
        ];
        let mut made = Vec::new();
        for (name, purpose) in purposes {
            made.push(h.factory.make(order(name, purpose), None).await.unwrap());
        }
        let sandbox = &h.factory.config.sandbox;
        let specs = h.fake.specs();
        assert_eq!(specs.len(), purposes.len());
        for ((name, purpose), spec) in purposes.iter().zip(&specs) {
            assert_eq!(&spec.name, name);
            posture::check_as(spec, sandbox, purpose.role())
                .unwrap_or_else(|v| panic!("{name} was created with {v}"));
        }
        let uids: std::collections::BTreeSet<&str> =
            specs.iter().map(|s| s.user.as_str()).collect();
        assert_eq!(
            uids.len(),
            specs.len(),
            "each container has a uid of its own"
        );
        for m in made {
            m.guard.remove_later();
        }
        assert!(h.cleanup.drain(std::time::Duration::from_secs(10)).await);
        assert!(h.fake.live_containers().is_empty());
    }

    #[tokio::test]
    async fn a_spec_that_fails_its_check_is_never_created() {
        let h = harness();
        let wrong = Volume {
            name: "someones-data",
            target: "/opt/pkgs",
        };
        let volume = format!("{PACKAGES_VOLUME_PREFIX}v");
        let prefix = Volume {
            name: &volume,
            target: "/opt/pkgs",
        };
        let open = egress_dir(&h, 0o755);
        let runtime = h.factory.config.sandbox.runtime.clone();
        let refused = [
            Purpose::Program {
                prefix: Some(wrong),
                relay: true,
                image_name: "python",
            },
            Purpose::Copy {
                into: &[wrong],
                from: None,
            },
            Purpose::Copy {
                into: &[],
                from: Some(prefix),
            },
            Purpose::Install {
                runtime: &runtime,
                egress: &open,
            },
        ];
        for purpose in refused {
            match h.factory.make(order("codebox-r-x", purpose), None).await {
                Err(MakeError::Posture(_)) => {}
                Err(e) => panic!("{purpose:?}: {e}"),
                Ok(_) => panic!("{purpose:?} was created"),
            }
        }
        assert!(h.fake.specs().is_empty(), "the engine was never asked");
    }

    #[tokio::test]
    async fn a_ready_container_whose_memory_fell_below_its_scratch_is_refused() {
        let h = harness();
        let program = Purpose::Program {
            prefix: None,
            relay: true,
            image_name: "python",
        };
        let made = h
            .factory
            .make(order("codebox-pool-a", program), None)
            .await
            .unwrap();
        assert!(h.factory.check_ready(&made.spec).is_ok());
        let mut shrunk = made.spec.clone();
        shrunk.memory_bytes = 1024 * 1024;
        shrunk.memory_swap_bytes = shrunk.memory_bytes;
        assert!(h.factory.check_ready(&shrunk).is_err());
        made.guard.remove_later();
        assert!(h.cleanup.drain(std::time::Duration::from_secs(10)).await);
    }
}
