//! The `[docker]` section: how the daemon is reached, with the docker CLI's variables as
//! fallbacks.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The docker CLI's own variables, which apply to a `docker` setting left unset by the file,
/// the `CODEBOX_*` variables and the flags: (setting, variable).
pub(super) const DOCKER_ENV: [(&str, &str); 3] = [
    ("docker.host", "DOCKER_HOST"),
    ("docker.tls_verify", "DOCKER_TLS_VERIFY"),
    ("docker.cert_path", "DOCKER_CERT_PATH"),
];

/// The daemon's address when neither `docker.host` nor `DOCKER_HOST` says otherwise.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

section! {
    /// The Docker daemon every command talks to: the local socket, or another machine over
    /// TLS. Everything reaches the daemon through the Engine API (code, files and outputs on
    /// the containers' attached streams, image build contexts as uploads), so the daemon
    /// needs no access to codebox's files. Each setting the file, the `CODEBOX_*` variables
    /// and the flags leave unset takes the docker CLI's variable: `DOCKER_HOST`,
    /// `DOCKER_TLS_VERIFY` (any non-empty value turns it on, as for the docker CLI) and
    /// `DOCKER_CERT_PATH`.
    ///
    /// # Security
    /// Whoever talks to the daemon controls the machine it runs on. Reach a daemon on another
    /// machine only with `tls_verify` on: codebox then trusts no certificate authority but
    /// `ca.pem` (as the docker CLI does) and presents `cert.pem` and `key.pem`, so the daemon
    /// (started with `--tlsverify`) knows it is codebox. A `tcp://` address without TLS is
    /// plain HTTP: anyone on the path can read the code and take over the daemon.
    pub struct DockerSettings {
        /// The daemon's address: `unix:///path/to/docker.sock` or `tcp://HOST:PORT` (2376
        /// is the usual TLS port). When unset: `DOCKER_HOST`, else
        /// `unix:///var/run/docker.sock`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub host: Option<String> = None,
        /// Talk TLS to a `tcp://` daemon and verify its certificate against `ca.pem` in
        /// `cert_path`, presenting `cert.pem` and `key.pem` from there as the client
        /// certificate. When unset: on if `DOCKER_TLS_VERIFY` is set. Ignored for a
        /// `unix://` socket.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls_verify: Option<bool> = None,
        /// The folder holding `ca.pem`, `cert.pem` and `key.pem`. When unset:
        /// `DOCKER_CERT_PATH`, else `~/.docker`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cert_path: Option<PathBuf> = None,
        /// The network of the `RUN` steps of `codebox images build` (the daemon's default
        /// bridge when unset). `host` lets a daemon started without a bridge
        /// (`--bridge=none`) reach the Debian mirror while building.
        ///
        /// # Security
        /// Only codebox's own Dockerfiles run with it, never a program: sandbox containers
        /// always have `network_mode=none`, and the posture check refuses anything else.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub build_network: Option<String> = None,
    }
}

impl DockerSettings {
    /// The daemon's address.
    pub fn address(&self) -> &str {
        self.host.as_deref().unwrap_or(DEFAULT_DOCKER_HOST)
    }

    /// Whether the daemon is reached over TLS (a `tcp://` address with `tls_verify` on).
    pub(crate) fn uses_tls(&self) -> bool {
        self.tls_verify == Some(true) && self.address().starts_with("tcp://")
    }

    /// The folder of `ca.pem`, `cert.pem` and `key.pem`: `cert_path`, else `~/.docker`.
    pub(crate) fn cert_dir(&self) -> PathBuf {
        self.cert_path.clone().unwrap_or_else(|| {
            directories::BaseDirs::new()
                .map(|d| d.home_dir().join(".docker"))
                .unwrap_or_else(|| PathBuf::from(".docker"))
        })
    }

    /// These settings, each unset one taken from the docker CLI's variable (`env` is
    /// injected so tests need no real environment).
    pub fn or_docker_env(mut self, env: impl Fn(&str) -> Option<String>) -> DockerSettings {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        if self.host.is_none() {
            self.host = var("DOCKER_HOST");
        }
        if self.tls_verify.is_none() {
            self.tls_verify = var("DOCKER_TLS_VERIFY").map(|_| true);
        }
        if self.cert_path.is_none() {
            self.cert_path = var("DOCKER_CERT_PATH").map(PathBuf::from);
        }
        self
    }

    /// The variables that give the docker CLI the same daemon (for `codebox bench`'s
    /// baseline, which runs `docker run`).
    pub(crate) fn cli_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("DOCKER_HOST", self.address().to_string())];
        if self.uses_tls() {
            env.push(("DOCKER_TLS_VERIFY", "1".to_string()));
            env.push(("DOCKER_CERT_PATH", self.cert_dir().display().to_string()));
        }
        env
    }
}
