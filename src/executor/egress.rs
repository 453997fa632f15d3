//! Programs' own egress (`sandbox.egress_hosts`, SPEC 13): one egress proxy per executor,
//! admitting HTTP(S) to those hosts only, started the first time a container needs it. Every
//! container that runs a request's code (compile, run and session stages, the pool's ready
//! containers too) keeps `network_mode=none` and gets the proxy's socket directory read-only,
//! with codebox-init's relay on its loopback and `HTTP(S)_PROXY` pointing there
//! (`crate::engine::posture::with_egress`).

use std::path::{Path, PathBuf};

use tokio::sync::OnceCell;

use crate::config::{Allowed, Config};
use crate::executor::packages::proxy::{Policy, Proxy};

/// Loopback names a program reaches in its own container, not through the proxy, unless an
/// `egress_hosts` entry names one (then the host's is meant).
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The programs' proxy of one executor.
pub(crate) struct ProgramEgress {
    dir: PathBuf,
    policy: Policy,
    proxy: OnceCell<Proxy>,
}

impl ProgramEgress {
    /// `None` unless the operator set `sandbox.egress_hosts`.
    pub fn new(config: &Config, instance: &str) -> Option<ProgramEgress> {
        let hosts = &config.sandbox.egress_hosts;
        if hosts.is_empty() {
            return None;
        }
        let allowed: Vec<Allowed> = hosts
            .iter()
            .flat_map(|h| Allowed::from_egress_host(h))
            .collect();
        // Short: a Unix socket path takes at most 107 bytes.
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let short = &instance[..instance.len().min(12)];
        Some(ProgramEgress {
            dir: config
                .data_dir
                .join("egress")
                .join(format!("programs-{short}-{id}")),
            policy: Policy { allowed },
            proxy: OnceCell::new(),
        })
    }

    /// The directory of the proxy's socket, the proxy started if it is not yet.
    pub async fn dir(&self) -> Result<&Path, String> {
        self.proxy
            .get_or_try_init(|| Proxy::start(&self.dir, self.policy.clone(), u64::MAX))
            .await
            .map(|p| p.dir())
            .map_err(|e| {
                format!(
                    "the programs' egress proxy (sandbox.egress_hosts) could not listen in {}: {e}",
                    self.dir.display()
                )
            })
    }

    /// `NO_PROXY` for programs: the loopback names no entry names.
    pub(crate) fn no_proxy(&self) -> String {
        LOOPBACK_NAMES
            .iter()
            .filter(|n| !self.policy.allowed.iter().any(|a| a.host == **n))
            .copied()
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Give a program's container its way out through the programs' egress proxy; an image whose
/// codebox-init has no relay (`relay`) is refused, naming the rebuild.
pub(crate) async fn with_program_egress(
    spec: &mut crate::engine::ContainerSpec,
    egress: &ProgramEgress,
    relay: bool,
    image_name: &str,
) -> Result<(), String> {
    if !relay {
        return Err(format!(
            "sandbox.egress_hosts is set, but image {image_name} was built before codebox-init had its egress relay: rebuild it with `codebox images build {image_name}`"
        ));
    }
    let dir = egress.dir().await?;
    crate::engine::posture::with_egress(spec, dir, Some(&egress.no_proxy()));
    Ok(())
}
