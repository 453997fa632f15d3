//! The shared backend: a PostgreSQL database that several codebox servers record into. The
//! synchronous `postgres` client runs on the history thread (it drives its own small runtime
//! there, never the server's), over TLS as the URL's `sslmode` asks (`pg_tls.rs`).

use std::collections::HashMap;
use std::error::Error;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use postgres::{Client, NoTls, Statement};

use super::db::{dollar_parameters, Database, DbError, Row, Value};

/// How long connecting may take, unless the URL says (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long sent data may stay unacknowledged before the connection counts as lost, unless
/// the URL says (`tcp_user_timeout`): a vanished database host fails the history's writes
/// instead of stalling them.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest statement; the history thread must never wait for ever.
const STATEMENT_TIMEOUT_MS: u32 = 30_000;
/// A transaction left open this long by its client is ended by PostgreSQL, its locks freed:
/// codebox's transactions take milliseconds, so only a server that was paused (SIGSTOP, a
/// frozen VM) in the middle of one leaves one open, and it must not hold up the lease judge
/// (its row locks, the judge's advisory lock) for the others. Under the shortest lease.
const IDLE_IN_TRANSACTION_MS: u32 = 1_000;
/// The advisory lock that serialises migrations between servers starting together.
const MIGRATION_LOCK: i64 = 0x0063_6f64_6562_6f78; // "codebox" in ASCII

pub struct Postgres {
    client: Client,
    statements: HashMap<String, Statement>,
}

fn err(e: postgres::Error) -> DbError {
    DbError::Postgres(e)
}

impl Postgres {
    /// Connect to `url` (already validated by the configuration), with the password from
    /// `password_file` if given.
    pub fn connect(url: &str, password_file: Option<&Path>) -> Result<Postgres, DbError> {
        let bad_url = |e: String| DbError::Schema(format!("history.url {e}"));
        let (url, tls) = crate::config::split_tls(url).map_err(bad_url)?;
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| DbError::Schema(format!("history.url is not a PostgreSQL URL: {e}")))?;
        config.ssl_mode(tls.client_mode());
        if let Some(path) = password_file {
            let text = std::fs::read_to_string(path).map_err(|source| DbError::PasswordFile {
                path: path.to_path_buf(),
                source,
            })?;
            config.password(text.lines().next().unwrap_or("").trim_end());
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("codebox");
        }
        config.notice_callback(|notice| {
            tracing::debug!(notice = %notice.message(), "PostgreSQL notice");
        });
        let mut client = if tls.mode == crate::config::SslMode::Disable {
            config.connect(NoTls)
        } else {
            config.connect(super::pg_tls::connector(&tls).map_err(bad_url)?)
        }
        .map_err(err)?;
        client
            .batch_execute(&format!(
                "SET statement_timeout = {STATEMENT_TIMEOUT_MS};
                 SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS};
                 SET TIME ZONE 'UTC'"
            ))
            .map_err(err)?;
        Ok(Postgres {
            client,
            statements: HashMap::new(),
        })
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, DbError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(&dollar_parameters(sql)).map_err(err)?;
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

fn refs(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Database for Postgres {
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).map_err(err)
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let stmt = self.statement(sql)?;
        self.client.execute(&stmt, &refs(params)).map_err(err)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let stmt = self.statement(sql)?;
        let rows = self.client.query(&stmt, &refs(params)).map_err(err)?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.try_get::<_, Value>(i).map_err(err))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Row)
            })
            .collect()
    }

    fn begin_exclusive(&mut self) -> Result<(), DbError> {
        self.client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"
            ))
            .map_err(err)
    }

    fn schema_version(&mut self) -> Result<i64, DbError> {
        self.batch("CREATE TABLE IF NOT EXISTS codebox_schema (version BIGINT NOT NULL)")?;
        let rows = self.query("SELECT MAX(version) FROM codebox_schema", &[])?;
        Ok(rows.first().and_then(|r| r.int(0)).unwrap_or(0))
    }

    fn set_schema_version(&mut self, version: i64) -> Result<(), DbError> {
        self.batch("DELETE FROM codebox_schema")?;
        self.execute(
            "INSERT INTO codebox_schema (version) VALUES (?1)",
            &[Value::Int(version)],
        )?;
        Ok(())
    }

    fn now_ms(&mut self) -> Result<i64, DbError> {
        let rows = self.query(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            &[],
        )?;
        rows.first()
            .and_then(|r| r.int(0))
            .ok_or_else(|| DbError::Schema("PostgreSQL did not tell its time".into()))
    }

    fn is_broken(&self) -> bool {
        self.client.is_closed()
    }

    fn notify(&mut self, channel: &str, payload: &str) -> Result<(), DbError> {
        self.execute(
            "SELECT pg_notify(?1, ?2)",
            &[Value::Text(channel.into()), Value::Text(payload.into())],
        )
        .map(|_| ())
    }

    fn try_advisory_xact_lock(&mut self, key: i64) -> Result<bool, DbError> {
        let rows = self.query("SELECT pg_try_advisory_xact_lock(?1)", &[Value::Int(key)])?;
        Ok(rows.first().and_then(|r| r.int(0)) == Some(1))
    }
}

impl Postgres {
    /// Listen on `channels` from now on (this connection then waits in
    /// [`Postgres::notifications`]).
    pub(super) fn listen(&mut self, channels: &[&str]) -> Result<(), DbError> {
        let sql: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
        self.client.batch_execute(&sql).map_err(err)
    }

    /// The channels notified, waiting at most `timeout` for the first one.
    pub(super) fn notifications(&mut self, timeout: Duration) -> Result<Vec<String>, DbError> {
        use postgres::fallible_iterator::FallibleIterator;
        let mut n = self.client.notifications();
        let mut got = Vec::new();
        let first = n.timeout_iter(timeout).next().map_err(err)?;
        if let Some(first) = first {
            got.push(first.channel().to_string());
            let mut rest = n.iter();
            while let Some(more) = rest.next().map_err(err)? {
                got.push(more.channel().to_string());
            }
        }
        Ok(got)
    }
}

type BoxError = Box<dyn Error + Sync + Send>;

impl ToSql for Value {
    /// Whatever the column's type, as long as the value fits it.
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) if *ty == Type::INT8 => i.to_sql(ty, out),
            Value::Int(i) if *ty == Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
            Value::Int(i) if *ty == Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
            Value::Int(i) if *ty == Type::FLOAT8 => (*i as f64).to_sql(ty, out),
            Value::Int(i) if *ty == Type::BOOL => (*i != 0).to_sql(ty, out),
            Value::Real(f) if *ty == Type::FLOAT8 => f.to_sql(ty, out),
            Value::Real(f) if *ty == Type::FLOAT4 => (*f as f32).to_sql(ty, out),
            Value::Text(s) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            other => Err(format!("cannot store {other:?} in a column of type {ty}").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Value, BoxError> {
        Ok(if *ty == Type::INT8 {
            Value::Int(i64::from_sql(ty, raw)?)
        } else if *ty == Type::INT4 {
            Value::Int(i32::from_sql(ty, raw)?.into())
        } else if *ty == Type::INT2 {
            Value::Int(i16::from_sql(ty, raw)?.into())
        } else if *ty == Type::BOOL {
            Value::Int(bool::from_sql(ty, raw)?.into())
        } else if *ty == Type::FLOAT8 {
            Value::Real(f64::from_sql(ty, raw)?)
        } else if *ty == Type::FLOAT4 {
            Value::Real(f32::from_sql(ty, raw)?.into())
        } else if <String as FromSql>::accepts(ty) {
            Value::Text(String::from_sql(ty, raw)?)
        } else {
            return Err(format!("the history reads no column of type {ty}").into());
        })
    }

    fn from_sql_null(_: &Type) -> Result<Value, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}
