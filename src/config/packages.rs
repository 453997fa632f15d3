//! The `[packages]` settings (SPEC 13): which indexes an install step may reach, per
//! language, and what one install may take. Off by default: with no index set, a request
//! with `packages` is refused.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

section! {
    /// Python's package index (`pip install --index-url`).
    pub struct PythonIndex {
        /// The PEP 503 index pip installs from, e.g. `https://pypi.org/simple` or a mirror
        /// (`http://127.0.0.1:3141/simple` on the host's loopback works). Unset: Python
        /// takes no packages.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub index_url: Option<String> = None,
        /// More `host` or `host:port` the index redirects to for files (PyPI serves them
        /// from `files.pythonhosted.org`); port 443 when left out.
        pub also_hosts: Vec<String> = Vec::new(),
    }
}

section! {
    /// JavaScript's npm registry (`npm install --registry`).
    pub struct NpmRegistry {
        /// The registry npm installs from, e.g. `https://registry.npmjs.org` or a mirror.
        /// Unset: JavaScript takes no packages.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub registry_url: Option<String> = None,
        /// More `host` or `host:port` the registry sends tarballs from; port 443 when left out.
        pub also_hosts: Vec<String> = Vec::new(),
    }
}

section! {
    /// Packages on request: an install step in a container of its own whose only way out is
    /// codebox's egress proxy, admitting the configured indexes only.
    ///
    /// # Security
    /// Setting an index lets the packages it serves run their install scripts in an install
    /// container (the posture of every run, no network: its one way out is the proxy's Unix
    /// socket); programs stay without a network and see the installed prefix read-only. See
    /// SECURITY.md, "Packages on request".
    pub struct PackagesSettings {
        /// Installed prefixes kept for reuse, in MB in all (least recently used first out).
        pub cache_mb: u64 = 2048,
        /// Wall-clock limit of one install, in seconds.
        pub install_timeout_seconds: f64 = 120.0,
        /// Memory of the install container, in MB; the prefix being written (a tmpfs) counts
        /// against it.
        pub install_memory_mb: u64 = 1024,
        /// Most bytes one install may download through the proxy, in MB.
        pub max_download_mb: u64 = 256,
        /// Largest installed prefix, in MB (at most half of `install_memory_mb`).
        pub prefix_mb: u64 = 384,
        /// The OCI runtime of install containers (default: `sandbox.runtime`). Under gVisor
        /// the install reaches the proxy's Unix socket only when runsc is registered with
        /// `--host-uds=open` (`scripts/ensure-docker.sh --with-runsc` does it); with a runsc
        /// registered without it, set `runc` here.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub install_runtime: Option<String> = None,
        pub python: PythonIndex = PythonIndex::default(),
        pub javascript: NpmRegistry = NpmRegistry::default(),
    }
}

impl PackagesSettings {
    /// The index a language installs from and the other hosts it may reach, when the operator
    /// enabled it.
    pub(crate) fn index_for(&self, language: &str) -> Option<(&str, &[String])> {
        match language {
            "python" => self
                .python
                .index_url
                .as_deref()
                .map(|u| (u, self.python.also_hosts.as_slice())),
            "javascript" => self
                .javascript
                .registry_url
                .as_deref()
                .map(|u| (u, self.javascript.also_hosts.as_slice())),
            _ => None,
        }
    }

    /// The setting that names a language's index (for messages).
    pub(crate) fn setting_for(language: &str) -> Option<&'static str> {
        match language {
            "python" => Some("packages.python.index_url"),
            "javascript" => Some("packages.javascript.registry_url"),
            _ => None,
        }
    }

    pub(super) fn validate(&self, _config: &Config) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                setting: setting.to_string(),
                value,
                reason: reason.to_string(),
            })
        };
        if !(self.install_timeout_seconds.is_finite() && self.install_timeout_seconds >= 1.0) {
            return invalid(
                "packages.install_timeout_seconds",
                self.install_timeout_seconds.to_string(),
                "must be at least 1",
            );
        }
        if self.install_memory_mb < 64 {
            return invalid(
                "packages.install_memory_mb",
                self.install_memory_mb.to_string(),
                "must be at least 64",
            );
        }
        if self.prefix_mb == 0 || self.prefix_mb * 2 > self.install_memory_mb {
            return invalid(
                "packages.prefix_mb",
                self.prefix_mb.to_string(),
                "must be between 1 and half of packages.install_memory_mb (the prefix is written to memory)",
            );
        }
        if self.max_download_mb == 0 {
            return invalid("packages.max_download_mb", "0".into(), "must be positive");
        }
        for (setting, url, hosts) in [
            (
                "packages.python.index_url",
                &self.python.index_url,
                &self.python.also_hosts,
            ),
            (
                "packages.javascript.registry_url",
                &self.javascript.registry_url,
                &self.javascript.also_hosts,
            ),
        ] {
            if let Some(u) = url {
                if Allowed::from_url(u).is_none() {
                    return invalid(
                        setting,
                        u.clone(),
                        "must be an http:// or https:// URL with a host name or address",
                    );
                }
            }
            for h in hosts {
                if Allowed::from_host(h).is_none() {
                    return invalid(
                        &setting
                            .replace(".index_url", ".also_hosts")
                            .replace(".registry_url", ".also_hosts"),
                        h.clone(),
                        "must be `host` or `host:port`",
                    );
                }
            }
        }
        Ok(())
    }
}

/// One host and port the proxy admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// Lowercase, without brackets.
    pub host: String,
    pub port: u16,
}

impl Allowed {
    /// The host and port of an `http://` or `https://` URL (the scheme's port when none).
    pub(crate) fn from_url(url: &str) -> Option<Allowed> {
        let (scheme, rest) = url.split_once("://")?;
        let default = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let authority = rest.split(['/', '?', '#']).next()?;
        if authority.contains('@') {
            return None;
        }
        Allowed::parse(authority, default)
    }

    /// `host` or `host:port` (port 443 when left out).
    pub(crate) fn from_host(h: &str) -> Option<Allowed> {
        Allowed::parse(h, 443)
    }

    /// A `sandbox.egress_hosts` entry: `host:port`, or `host` for HTTPS and HTTP (443, 80).
    pub(crate) fn from_egress_host(h: &str) -> Vec<Allowed> {
        match Allowed::parse(h, 0) {
            Some(a) if a.port == 0 => [443, 80]
                .into_iter()
                .map(|port| Allowed {
                    host: a.host.clone(),
                    port,
                })
                .collect(),
            Some(a) => vec![a],
            None => Vec::new(),
        }
    }

    fn parse(authority: &str, default: u16) -> Option<Allowed> {
        let (host, port) = split_host_port(authority, default)?;
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        ok.then(|| Allowed {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// `host:port`, `[v6]:port` or a bare host.
pub fn split_host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_string(), p.parse().ok()?)),
        Some(_) => None,
        None => Some((authority.to_string(), default)),
    }
}
