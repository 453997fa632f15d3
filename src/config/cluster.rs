//! The `[cluster]` settings: how servers that share one PostgreSQL history reach each other
//! (SPEC section 15).

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

/// The shortest lease: a heartbeat every third of it, at least once a second.
pub const MIN_LEASE_SECONDS: u64 = 3;

section! {
    /// Several servers as one: servers sharing a PostgreSQL history (`history.url`) forward a
    /// call about a run or session another one holds to that server, and take over what a
    /// server that stopped answering left.
    ///
    /// # Security
    /// A request carrying the secret of `secret_file` (header `x-codebox-cluster`) is taken
    /// as coming from another server of the cluster: it needs no bearer token and skips the
    /// Host check. Keep the file readable only by codebox, the same on every server, and the
    /// servers' own addresses (`advertise_url`) on a network clients cannot reach, or behind
    /// the same firewall as the database.
    pub struct ClusterSettings {
        /// How the other servers reach this one, e.g. `http://10.0.0.2:8765` (its `/v1` and
        /// `/mcp` routes). Required with `--transport http` when `history.url` is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub advertise_url: Option<String> = None,
        /// File holding the secret the servers present to each other (its first line, at
        /// least 16 characters); the same file on every server. Required with
        /// `--transport http` when `history.url` is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub secret_file: Option<PathBuf> = None,
        /// A server that has not renewed its lease for this long, in seconds, is taken as
        /// gone: its runs end `sandbox_error`, its sessions end. Each server renews its own
        /// every third of it.
        pub lease_seconds: u64 = 10,
    }
}

impl ClusterSettings {
    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    pub(super) fn validate(&self, _config: &Config) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: String, reason: &str| ConfigError::Invalid {
            setting: setting.to_string(),
            value,
            reason: reason.to_string(),
        };
        if self.lease_seconds < MIN_LEASE_SECONDS || self.lease_seconds > 3600 {
            return Err(invalid(
                "cluster.lease_seconds",
                self.lease_seconds.to_string(),
                &format!("must be between {MIN_LEASE_SECONDS} and 3600"),
            ));
        }
        if let Some(url) = &self.advertise_url {
            check_advertise_url(url)
                .map_err(|why| invalid("cluster.advertise_url", format!("{url:?}"), &why))?;
        }
        Ok(())
    }
}

/// An advertise URL: `http://host:port` with nothing after it but an optional `/`.
pub fn check_advertise_url(url: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err("must start with http:// (e.g. http://10.0.0.2:8765): servers talk to each other over plain HTTP on their own network".into());
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err("must be http://HOST:PORT with no path, e.g. http://10.0.0.2:8765".into());
    }
    let a = axum::http::uri::Authority::try_from(authority)
        .map_err(|e| format!("names no host and port: {e}"))?;
    match a.port_u16() {
        Some(p) if p != 0 => Ok(()),
        _ => Err(
            "must name the port the server listens on (not 0), e.g. http://10.0.0.2:8765".into(),
        ),
    }
}
