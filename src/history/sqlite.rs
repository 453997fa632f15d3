//! The embedded backend: an SQLite file (bundled rusqlite), in WAL mode so that several
//! codebox processes on one host can share it.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::Connection;

use super::db::{Database, DbError, Row, Value};

/// How long a write waits for another process's transaction before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Sqlite {
    conn: Connection,
}

fn err(e: rusqlite::Error) -> DbError {
    DbError::Sqlite(e)
}

impl Sqlite {
    /// Open (or create, with its folder) the database file.
    pub fn open(path: &Path) -> Result<Sqlite, DbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| DbError::CreateFolder {
                path: path.to_path_buf(),
                source,
            })?;
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        Ok(Sqlite { conn })
    }

    /// A private database in memory (tests).
    #[cfg(test)]
    pub(super) fn in_memory() -> Result<Sqlite, DbError> {
        Ok(Sqlite {
            conn: Connection::open_in_memory().map_err(err)?,
        })
    }

    /// The connection itself, for tests that look at SQLite's own catalogue.
    #[cfg(test)]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

fn to_sqlite(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Int(i) => SqlValue::Integer(*i),
        Value::Real(f) => SqlValue::Real(*f),
        Value::Text(s) => SqlValue::Text(s.clone()),
    }
}

fn from_sqlite(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) | ValueRef::Blob(t) => Value::Text(String::from_utf8_lossy(t).into()),
    }
}

impl Database for Sqlite {
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.execute_batch(sql).map_err(err)
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(err)?;
        let n = stmt
            .execute(rusqlite::params_from_iter(params.iter().map(to_sqlite)))
            .map_err(err)?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(err)?;
        let columns = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter().map(to_sqlite)))
            .map_err(err)?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(err)? {
            let mut row = Vec::with_capacity(columns);
            for i in 0..columns {
                row.push(from_sqlite(r.get_ref(i).map_err(err)?));
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn begin_exclusive(&mut self) -> Result<(), DbError> {
        self.batch("BEGIN IMMEDIATE")
    }

    fn schema_version(&mut self) -> Result<i64, DbError> {
        self.conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)
    }

    fn set_schema_version(&mut self, version: i64) -> Result<(), DbError> {
        self.conn
            .pragma_update(None, "user_version", version)
            .map_err(err)
    }

    fn now_ms(&mut self) -> Result<i64, DbError> {
        // One host, one clock.
        Ok(super::now_ms())
    }

    fn is_broken(&self) -> bool {
        false
    }
}
