//! The store seam: one [`Database`] trait that both backends implement, so the history's
//! schema, migrations, queries and row mapping are written once (in `schema.rs` and
//! `store.rs`) and run unchanged on SQLite and on PostgreSQL.
//!
//! SQL is written once, in the subset both dialects accept, with SQLite's numbered
//! parameters (`?1`, `?2`); the PostgreSQL backend rewrites them to `$1`, `$2`. Values cross
//! the seam as [`Value`]s (whole numbers, reals, text, null), which each backend converts to
//! its driver's types: booleans are stored as 0 or 1, times as Unix milliseconds.

/// A value bound to, or read from, an SQL statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(v.into())
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// The parameters of one statement: `values![a, b, c]`.
macro_rules! values {
    ($($v:expr),* $(,)?) => { &[$($crate::history::db::Value::from($v)),*][..] };
}
pub(crate) use values;

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row(pub Vec<Value>);

impl Row {
    fn at(&self, i: usize) -> &Value {
        self.0.get(i).unwrap_or(&Value::Null)
    }

    /// Column `i` as a whole number (a real is truncated; text or null is `None`).
    pub fn int(&self, i: usize) -> Option<i64> {
        match self.at(i) {
            Value::Int(v) => Some(*v),
            Value::Real(v) => Some(*v as i64),
            _ => None,
        }
    }

    /// Column `i` as a number.
    pub fn real(&self, i: usize) -> Option<f64> {
        match self.at(i) {
            Value::Int(v) => Some(*v as f64),
            Value::Real(v) => Some(*v),
            _ => None,
        }
    }

    /// Column `i` as text.
    pub fn text(&self, i: usize) -> Option<String> {
        match self.at(i) {
            Value::Text(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// A database operation that failed, naming the backend's own error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    #[error("SQLite: {0}")]
    Sqlite(#[source] rusqlite::Error),
    #[error("PostgreSQL: {0}")]
    Postgres(#[source] postgres::Error),
    #[error("cannot create the folder of {path}: {source}")]
    CreateFolder {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the PostgreSQL password from {path}: {source}")]
    PasswordFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Schema(String),
}

/// A connection to the history database: what the history needs from SQLite or PostgreSQL.
/// Every method blocks; only the history thread calls them.
pub(crate) trait Database: Send {
    /// Run statements without parameters (`BEGIN`, a migration).
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;
    /// Run one statement; returns the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError>;
    /// Run one query; returns its rows.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError>;
    /// Start a transaction that no other codebox process can run at the same time (the
    /// migrations): SQLite's `BEGIN IMMEDIATE`, PostgreSQL's `BEGIN` plus an advisory lock.
    fn begin_exclusive(&mut self) -> Result<(), DbError>;
    /// The schema version (0 for an empty database). Inside [`Database::begin_exclusive`].
    fn schema_version(&mut self) -> Result<i64, DbError>;
    /// Record the schema version. Inside [`Database::begin_exclusive`].
    fn set_schema_version(&mut self, version: i64) -> Result<(), DbError>;
    /// The database's clock, in Unix milliseconds: heartbeats are written and judged by one
    /// clock, whatever the clocks of the servers' hosts say.
    fn now_ms(&mut self) -> Result<i64, DbError>;
    /// Whether the connection is gone for good (the history thread then reconnects).
    fn is_broken(&self) -> bool;
    /// Tell the servers listening on `channel` (PostgreSQL's `NOTIFY`, sent at commit);
    /// nothing for SQLite, which one server alone uses.
    fn notify(&mut self, _channel: &str, _payload: &str) -> Result<(), DbError> {
        Ok(())
    }
    /// Take the transaction-scoped advisory lock `key` if nobody holds it (PostgreSQL's
    /// `pg_try_advisory_xact_lock`): `false` when another server holds it. SQLite has one
    /// writer, so always `true`.
    fn try_advisory_xact_lock(&mut self, _key: i64) -> Result<bool, DbError> {
        Ok(true)
    }
}

/// Run `f` inside [`Database::begin_exclusive`]: committed if it succeeds, rolled back if not.
pub(crate) fn exclusive<T>(
    db: &mut dyn Database,
    f: impl FnOnce(&mut dyn Database) -> Result<T, DbError>,
) -> Result<T, DbError> {
    db.begin_exclusive()?;
    match f(db) {
        Ok(v) => {
            db.batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            let _ = db.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Run `f` inside a plain transaction.
pub fn transaction<T>(
    db: &mut dyn Database,
    f: impl FnOnce(&mut dyn Database) -> Result<T, DbError>,
) -> Result<T, DbError> {
    db.batch("BEGIN")?;
    match f(db) {
        Ok(v) => {
            db.batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            let _ = db.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// SQLite's numbered parameters (`?1`) as PostgreSQL's (`$1`); quoted text is left alone.
pub(super) fn dollar_parameters(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quoted {
            Some(q) => {
                if c == q {
                    quoted = None;
                }
                out.push(c);
            }
            None if c == '\'' || c == '"' => {
                quoted = Some(c);
                out.push(c);
            }
            None if c == '?' && chars.peek().is_some_and(|d| d.is_ascii_digit()) => {
                out.push('$');
            }
            None => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_become_dollar_parameters_outside_quotes() {
        assert_eq!(
            dollar_parameters("SELECT '?1', \"a?2\" FROM t WHERE a = ?1 AND b = ?12 OR c IS ?"),
            "SELECT '?1', \"a?2\" FROM t WHERE a = $1 AND b = $12 OR c IS ?"
        );
    }

    #[test]
    fn rows_convert_between_number_kinds_and_treat_null_as_none() {
        let r = Row(vec![
            Value::Int(3),
            Value::Real(2.5),
            Value::Null,
            Value::from("x"),
        ]);
        assert_eq!((r.int(0), r.real(0)), (Some(3), Some(3.0)));
        assert_eq!((r.int(1), r.real(1)), (Some(2), Some(2.5)));
        assert_eq!((r.int(2), r.text(2)), (None, None));
        assert_eq!((r.text(3), r.int(3)), (Some("x".into()), None));
        assert_eq!(r.int(9), None, "a column past the end is null");
        assert_eq!(Value::from(true), Value::Int(1));
        assert_eq!(Value::from(None::<&str>), Value::Null);
    }
}
