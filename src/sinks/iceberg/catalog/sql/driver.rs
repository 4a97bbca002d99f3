//! The two databases a SQL catalog lives in, behind one small interface: statements with `$n`
//! text parameters, answering rows of text columns or a count of affected rows.
//!
//! - Postgres through tokio-postgres: one connection, opened on first use and dropped after any
//!   error that is not the server's answer to a statement (a dropped connection, a timeout), so
//!   the next call reconnects. TLS as libpq would do it for the URI's `sslmode`, `sslrootcert`,
//!   `sslcert`/`sslkey` and `sslsni` (default `prefer`), through the connector the Postgres source
//!   uses too ([`crate::tls::postgres`]), so both verify alike and fail with the same words.
//! - SQLite through rusqlite (the library is bundled): a connection per call, on the blocking
//!   pool (rusqlite is synchronous), with a busy timeout so another process's write (pyiceberg,
//!   a second reader) makes it wait rather than fail.
//!
//! Every call is bounded by [`CALL_TIMEOUT`]: a commit must not hang on a dead server. A timed
//! out statement has an unknown outcome; `sql.rs` decides what that means.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres::types::ToSql;

use super::super::config::PostgresUri;
use crate::tls::postgres::stream::Connector;
use crate::tls::postgres::{requires_tls_hint, tls_refused, SslMode, TlsError};

/// How long one statement may take, connection included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long SQLite waits for another connection's lock before failing a statement.
const SQLITE_BUSY: Duration = Duration::from_secs(10);

/// A catalog database call failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", postgres_text(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// TLS could not be set up or was refused; the text names the host and the CA file.
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("no answer within {}s", CALL_TIMEOUT.as_secs())]
    Timeout,
    #[error("the SQLite call did not finish: {0}")]
    Blocking(String),
}

/// tokio-postgres says only "db error" for the server's errors; the server's message is its
/// source.
fn postgres_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let text = format!("{}: {}", db.code().code(), db.message());
            match requires_tls_hint(db.message()) {
                Some(hint) => format!("{text}: {hint}"),
                None => text,
            }
        }
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// Rows of text columns (NULL is `None`).
pub type Rows = Vec<Vec<Option<String>>>;

/// Where the catalog's tables are, and how to reach them.
pub enum Driver {
    Sqlite(PathBuf),
    Postgres(Postgres),
}

/// A Postgres catalog database: the URI (with its password; never shown) and the connection.
pub struct Postgres {
    uri: PostgresUri,
    client: tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
}

impl Postgres {
    pub fn new(uri: PostgresUri) -> Postgres {
        Postgres {
            uri,
            client: tokio::sync::Mutex::new(None),
        }
    }
}

impl Driver {
    /// Runs `sql` (one statement), returning the rows it affected.
    pub async fn execute(&self, sql: &'static str, params: &[&str]) -> Result<u64, DbError> {
        match self {
            Driver::Sqlite(path) => {
                let (path, params) = (path.clone(), owned(params));
                blocking(move || {
                    let conn = open_sqlite(&path)?;
                    let n = conn.execute(&sqlite_sql(sql), rusqlite::params_from_iter(params))?;
                    Ok(n as u64)
                })
                .await
            }
            Driver::Postgres(pg) => {
                let params = owned(params);
                pg.call(|client| async move { client.execute(sql, &pg_params(&params)).await })
                    .await
            }
        }
    }

    /// Runs `sql` (one query whose columns are all text).
    pub async fn query(&self, sql: &'static str, params: &[&str]) -> Result<Rows, DbError> {
        match self {
            Driver::Sqlite(path) => {
                let (path, params) = (path.clone(), owned(params));
                blocking(move || {
                    let conn = open_sqlite(&path)?;
                    let mut stmt = conn.prepare(&sqlite_sql(sql))?;
                    let width = stmt.column_count();
                    let rows = stmt.query_map(rusqlite::params_from_iter(params), |row| {
                        (0..width)
                            .map(|i| row.get::<_, Option<String>>(i))
                            .collect::<Result<Vec<_>, _>>()
                    })?;
                    Ok(rows.collect::<Result<Rows, _>>()?)
                })
                .await
            }
            Driver::Postgres(pg) => {
                let params = owned(params);
                pg.call(|client| async move {
                    let rows = client.query(sql, &pg_params(&params)).await?;
                    rows.iter()
                        .map(|row| {
                            (0..row.len())
                                .map(|i| row.try_get::<_, Option<String>>(i))
                                .collect::<Result<Vec<_>, _>>()
                        })
                        .collect::<Result<Rows, _>>()
                })
                .await
            }
        }
    }
}

impl Postgres {
    /// Runs `f` on the connection (opened when there is none), bounded by [`CALL_TIMEOUT`]; the
    /// connection is dropped after an error that is not the server's answer.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(Arc<tokio_postgres::Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let mut guard = self.client.lock().await;
        let result = tokio::time::timeout(CALL_TIMEOUT, async {
            let client = match guard.as_ref() {
                Some(c) if !c.is_closed() => Arc::clone(c),
                _ => {
                    let c = Arc::new(self.connect().await?);
                    *guard = Some(Arc::clone(&c));
                    c
                }
            };
            f(client).await.map_err(DbError::from)
        })
        .await
        .map_err(|_| DbError::Timeout)
        .and_then(std::convert::identity);
        if let Err(e) = &result {
            let answered = matches!(e, DbError::Postgres(pg) if pg.as_db_error().is_some());
            if !answered {
                *guard = None;
            }
        }
        result
    }

    /// Opens a connection the way libpq would for the URI's `sslmode`.
    async fn connect(&self) -> Result<tokio_postgres::Client, DbError> {
        let mut config = self.uri.config()?;
        let tls = &self.uri.tls;
        let tls_mode = match tls.mode {
            SslMode::Disable => None,
            // libpq's allow: plain first; a second connection in TLS if the server refuses it.
            SslMode::Allow => match connect_plain(&config).await {
                Ok(client) => return Ok(client),
                Err(e) if e.as_db_error().is_some() => Some(PgSslMode::Require),
                Err(e) => return Err(e.into()),
            },
            SslMode::Prefer => Some(PgSslMode::Prefer),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Some(PgSslMode::Require),
        };
        let Some(mode) = tls_mode else {
            return Ok(connect_plain(&config).await?);
        };
        let connector = Connector::new(tls)?;
        config.ssl_mode(mode);
        let (client, connection) = config.connect(connector).await.map_err(|e| {
            // tokio-postgres's words when the server answers the SSLRequest with N.
            let refused = std::error::Error::source(&e)
                .is_some_and(|s| s.to_string().contains("does not support TLS"));
            if refused {
                DbError::Tls(tls_refused(&first_host(&config), tls.mode))
            } else {
                DbError::Postgres(e)
            }
        })?;
        spawn_connection(connection);
        Ok(client)
    }
}

async fn connect_plain(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = config.clone();
    config.ssl_mode(PgSslMode::Disable);
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    spawn_connection(connection);
    Ok(client)
}

/// Drives a connection until it closes (the client then reports it closed, and the next call
/// reconnects).
fn spawn_connection<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "SQL catalog connection closed");
        }
    });
}

/// The host a refusal names (the first one: tokio-postgres tries them in order).
fn first_host(config: &tokio_postgres::Config) -> String {
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    }
}

fn owned(params: &[&str]) -> Vec<String> {
    params.iter().map(|p| (*p).to_owned()).collect()
}

fn pg_params(params: &[String]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// The statements are written with Postgres's `$n`; SQLite's numbered form is `?n`.
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn open_sqlite(path: &Path) -> Result<rusqlite::Connection, rusqlite::Error> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(SQLITE_BUSY)?;
    Ok(conn)
}

/// Runs a SQLite call on the blocking pool, bounded by [`CALL_TIMEOUT`].
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DbError> + Send + 'static,
) -> Result<T, DbError> {
    match tokio::time::timeout(CALL_TIMEOUT, tokio::task::spawn_blocking(f)).await {
        Err(_) => Err(DbError::Timeout),
        Ok(Err(join)) => Err(DbError::Blocking(join.to_string())),
        Ok(Ok(r)) => r,
    }
}
