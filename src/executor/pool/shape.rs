//! The shape of a container (image, limits, working directory): what the pool keeps ready
//! and a run takes.

use std::collections::BTreeMap;

use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::posture::Limits;
use crate::registry::{Language, Registry};

/// A packages volume and where the program sees it (read-only).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mount {
    pub volume: String,
    pub target: String,
}

/// What a container is, apart from its name, labels and uid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub image: String,
    pub memory_mb: u64,
    /// CPU quota in thousandths of a core.
    pub millicpus: u64,
    pub workspace_mb: u64,
    /// The installed packages prefix it mounts read-only (a cached prefix's volume).
    pub packages: Option<Mount>,
}

impl Shape {
    pub fn new(image: &str, limits: Limits, workspace_mb: u64) -> Shape {
        Shape {
            image: image.to_string(),
            memory_mb: limits.memory_mb,
            millicpus: (limits.cpus * 1000.0).round() as u64,
            workspace_mb,
            packages: None,
        }
    }

    /// The same shape mounting `packages`.
    pub fn with_packages(mut self, packages: Option<Mount>) -> Shape {
        self.packages = packages;
        self
    }

    pub fn limits(&self) -> Limits {
        Limits {
            memory_mb: self.memory_mb,
            cpus: self.millicpus as f64 / 1000.0,
        }
    }
}

/// The shape of a language's compile stage, for a compiled language.
fn compile_shape(lang: &Language) -> Option<Shape> {
    let c = lang.compile_limits;
    lang.is_compiled().then(|| {
        Shape::new(
            &lang.image.tag,
            Limits {
                memory_mb: c.memory_mb,
                cpus: c.cpus,
            },
            c.workspace_mb,
        )
    })
}

/// The size of a run's working directory for a memory limit: the operator's
/// `sandbox.workspace_mb`, at most half the memory.
pub fn run_workspace_mb(config: &Config, memory_mb: u64) -> u64 {
    config.sandbox.workspace_mb.min(memory_mb / 2).max(1)
}

/// The shapes `pool.sizes` asks for, from the registry and the default limits.
pub fn floors_for(registry: &Registry, config: &Config) -> BTreeMap<Shape, usize> {
    let mut floors = BTreeMap::new();
    for (id, &n) in &config.pool.sizes {
        let Some(lang) = registry.resolve(id) else {
            tracing::warn!(
                language = id,
                "setting `pool.sizes` names a language the registry does not have; ignored"
            );
            continue;
        };
        let run = Limits {
            memory_mb: config.limits.default_memory_mb,
            cpus: config.limits.default_cpus,
        };
        let run_shape = Shape::new(
            &lang.image.tag,
            run,
            run_workspace_mb(config, run.memory_mb),
        );
        *floors.entry(run_shape).or_default() += n;
        if let Some(shape) = compile_shape(lang) {
            *floors.entry(shape).or_default() += n;
        }
    }
    floors
}

/// The containers a run uses, by shape, and how many of each at once: its run stage's
/// (one per test case it runs at once), and its compile stage's. A run with packages
/// mounts a prefix known only once it is installed: the executor tells that shape's
/// demand itself ([`Pool::asked`](super::Pool::asked) with the prefix).
pub fn shapes_of(req: &ValidRequest, config: &Config, at_once: usize) -> Vec<(Shape, usize)> {
    let lang = &req.language;
    let limits = Limits {
        memory_mb: req.limits.memory_mb,
        cpus: req.limits.cpus,
    };
    let workspace = run_workspace_mb(config, limits.memory_mb);
    let mut shapes = Vec::new();
    if req.packages.is_empty() {
        shapes.push((Shape::new(&lang.image.tag, limits, workspace), at_once));
    }
    shapes.extend(compile_shape(lang).map(|s| (s, 1)));
    shapes
}
