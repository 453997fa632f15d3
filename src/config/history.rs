//! The `[history]` section and its helpers: where the history lives, a URL with its
//! password hidden, and the check of a PostgreSQL URL.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{split_tls, CodePolicy};

section! {
    /// The run history database: an SQLite file (the default, embedded), or a PostgreSQL
    /// database that several codebox servers share.
    ///
    /// # Security
    /// The history holds every run's code (as `code` says) and, for the retention period, its
    /// output. A PostgreSQL password is never part of `url` (the configuration is printed by
    /// `codebox config` and named in log lines): put it in `password_file`. TLS follows the
    /// URL's `sslmode` (libpq's default `prefer` does not check the server's certificate):
    /// across a network you do not control, use `sslmode=verify-full&sslrootcert=<CA file>`.
    pub struct HistorySettings {
        /// The SQLite file; when unset, `history.sqlite3` in the data directory. Unused when
        /// `url` is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub path: Option<PathBuf> = None,
        /// A PostgreSQL database instead of the SQLite file, e.g.
        /// `postgres://codebox@db.internal/codebox`, or over a Unix socket
        /// `postgres://codebox@%2Frun%2Fpostgresql/codebox`. Every server given the same URL
        /// records into it and reads all runs from it. No password here: see `password_file`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub url: Option<String> = None,
        /// File holding the PostgreSQL password (its first line), when the server asks for one.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub password_file: Option<PathBuf> = None,
        /// How much code is stored with each run: `none`, `preview` (500 characters) or `full`.
        pub code: CodePolicy = CodePolicy::Preview,
    }
}

/// Where the run history lives, as resolved from the `[history]` settings.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryStore {
    /// An SQLite file (created with its folder when missing).
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres {
        /// `history.url` (validated: it parses, and holds no password).
        url: String,
        /// `history.password_file`.
        password_file: Option<PathBuf>,
    },
}

impl std::fmt::Display for HistoryStore {
    /// How logs and messages name the store: the file, or the URL (which holds no password).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistoryStore::Sqlite(path) => write!(f, "{}", path.display()),
            HistoryStore::Postgres { url, .. } => f.write_str(url),
        }
    }
}

/// `url` with the password of its user part (`user:password@`), if any, shown as `***`.
pub(super) fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

/// Check a `history.url`: a `postgres://` or `postgresql://` URL that the PostgreSQL client
/// parses (with libpq's `sslmode` and `sslrootcert`, whose CA file must exist when a mode
/// checks the server), holding no password.
pub(super) fn check_postgres_url(url: &str) -> Result<postgres::Config, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(
            "must be a PostgreSQL URL starting with postgres:// or postgresql://, e.g. postgres://codebox@db.internal/codebox".into(),
        );
    }
    let (rest, tls) = split_tls(url)?;
    let config: postgres::Config = rest
        .parse()
        .map_err(|e| format!("is not a PostgreSQL URL the client understands: {e}"))?;
    if config.get_password().is_some() {
        return Err("must not hold a password (the configuration is printed and logged); put it in history.password_file".into());
    }
    tls.check()?;
    if config.get_hosts().is_empty() {
        return Err(
            "names no host (give one after the @, or a socket folder such as %2Frun%2Fpostgresql)"
                .into(),
        );
    }
    Ok(config)
}
