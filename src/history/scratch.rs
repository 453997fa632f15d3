//! A schema of its own in a PostgreSQL history, for measurements (`codebox bench
//! --shared-queue`): the history's tables are made afresh there, so that what a measurement
//! writes never mixes with the real rows, and no live server claims it; the schema goes, with
//! everything in it, when the [`Scratch`] is removed or dropped.
//!
//! The connections of a store from [`Scratch::store`] find the tables through their
//! `search_path` (PostgreSQL's `options` URL parameter). Notifications are per database: live
//! servers on it are woken by the measurement's (they look, and find nothing new).

use std::path::PathBuf;

use super::db::{Database, DbError};
use super::pg::Postgres;
use crate::config::HistoryStore;

/// Why a scratch schema could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error("the history is the SQLite file {0}, not PostgreSQL: set history.url (e.g. --set history.url=postgres://codebox@db.internal/codebox)")]
    NotPostgres(PathBuf),
    #[error("cannot connect to the history {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: DbError,
    },
    #[error("cannot create the schema {schema} in {url} (its user needs the CREATE privilege on the database): {source}")]
    Create {
        schema: String,
        url: String,
        #[source]
        source: DbError,
    },
    #[error("cannot drop the schema {schema} in {url} (drop it by hand: DROP SCHEMA {schema} CASCADE): {source}")]
    Drop {
        schema: String,
        url: String,
        #[source]
        source: DbError,
    },
}

/// A schema made in the history's database, dropped with its contents on
/// [`Scratch::remove`] or, failing that, on drop.
#[derive(Debug)]
pub struct Scratch {
    url: String,
    password_file: Option<PathBuf>,
    schema: String,
    /// Not dropped yet.
    live: bool,
}

impl Scratch {
    /// Create schema `schema` (a plain lower-case identifier) in the database of `store`.
    /// Blocks for a round trip or two (on a thread of its own: the synchronous client
    /// cannot run inside an async runtime).
    pub fn create(store: &HistoryStore, schema: &str) -> Result<Scratch, ScratchError> {
        let (url, password_file) = match store {
            HistoryStore::Postgres { url, password_file } => (url, password_file),
            HistoryStore::Sqlite(path) => return Err(ScratchError::NotPostgres(path.clone())),
        };
        let sql = format!("CREATE SCHEMA {schema}");
        on_own_thread(url, password_file, &sql).map_err(|e| match e {
            Failed::Connect(source) => ScratchError::Connect {
                url: url.clone(),
                source,
            },
            Failed::Run(source) => ScratchError::Create {
                schema: schema.to_string(),
                url: url.clone(),
                source,
            },
        })?;
        Ok(Scratch {
            url: url.clone(),
            password_file: password_file.clone(),
            schema: schema.to_string(),
            live: true,
        })
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The history store whose connections work in this schema.
    pub fn store(&self) -> HistoryStore {
        HistoryStore::Postgres {
            url: with_search_path(&self.url, &self.schema),
            password_file: self.password_file.clone(),
        }
    }

    /// Drop the schema and everything in it.
    pub fn remove(mut self) -> Result<(), ScratchError> {
        self.drop_schema()
    }

    fn drop_schema(&mut self) -> Result<(), ScratchError> {
        if !std::mem::take(&mut self.live) {
            return Ok(());
        }
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        on_own_thread(&self.url, &self.password_file, &sql).map_err(|e| ScratchError::Drop {
            schema: self.schema.clone(),
            url: self.url.clone(),
            source: match e {
                Failed::Connect(e) | Failed::Run(e) => e,
            },
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = self.drop_schema() {
            tracing::warn!(error = %e, "a measurement's schema is left");
        }
    }
}

enum Failed {
    Connect(DbError),
    Run(DbError),
}

/// Run `sql` on a connection of its own, on a thread of its own.
fn on_own_thread(url: &str, password_file: &Option<PathBuf>, sql: &str) -> Result<(), Failed> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut db =
                Postgres::connect(url, password_file.as_deref()).map_err(Failed::Connect)?;
            db.batch(sql).map_err(Failed::Run)
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// `url` whose connections put `schema` first in their `search_path` (added to any `options`
/// the URL already has).
fn with_search_path(url: &str, schema: &str) -> String {
    let option = format!("-c%20search_path%3D{schema}");
    let Some((base, query)) = url.split_once('?') else {
        return format!("{url}?options={option}");
    };
    let mut found = false;
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.strip_prefix("options=") {
            Some(existing) => {
                found = true;
                format!("options={existing}%20{option}")
            }
            None => p.to_string(),
        })
        .collect();
    if !found {
        pairs.push(format!("options={option}"));
    }
    format!("{base}?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_path_is_added_to_the_urls_options() {
        let base = "postgres://codebox@db.internal/codebox";
        assert_eq!(
            with_search_path(base, "s1"),
            format!("{base}?options=-c%20search_path%3Ds1")
        );
        assert_eq!(
            with_search_path(&format!("{base}?sslmode=require"), "s1"),
            format!("{base}?sslmode=require&options=-c%20search_path%3Ds1")
        );
        assert_eq!(
            with_search_path(&format!("{base}?options=-c%20work_mem%3D8MB&x=1"), "s1"),
            format!("{base}?options=-c%20work_mem%3D8MB%20-c%20search_path%3Ds1&x=1")
        );
        // What the client makes of it.
        let config: postgres::Config = with_search_path(base, "s1").parse().unwrap();
        assert_eq!(config.get_options(), Some("-c search_path=s1"));
    }

    #[test]
    fn a_scratch_schema_needs_postgresql() {
        let store = HistoryStore::Sqlite(PathBuf::from("/tmp/h.sqlite3"));
        let err = Scratch::create(&store, "s1").unwrap_err();
        assert!(matches!(err, ScratchError::NotPostgres(_)), "{err}");
        assert!(err.to_string().contains("history.url"), "{err}");
    }
}
