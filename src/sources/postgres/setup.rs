//! Checks and setup over a regular (non-replication) connection: the connection itself, server
//! settings and privileges, and the slot's state. Which tables are captured and the publication
//! are in `publication.rs`; key, column and type lookups in `catalog.rs`.
//!
//! Where it sits: `cdcd check` and `PostgresSource::prepare` run these before any replication
//! starts. Everything here is catalog SQL through tokio-postgres; the replication protocol itself
//! lives in `replication.rs`.
//!
//! Why checks return a list: `cdcd check` prints every problem with its fix at once instead of
//! making the operator fix them one restart at a time.

use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use super::catalog::qualified;
use super::publication::resolve_report;
use super::replication::{quote_ident, session_options};
use crate::changelog::{Lsn, TableId, TableKey};
use crate::config::PostgresConfig;
use crate::sources::SourceError;
use crate::tls::postgres::stream::Connector;
use crate::tls::postgres::{requires_tls_hint, tls_refused, SslMode, TlsError};

pub use crate::sources::CheckProblem;

/// An existing replication slot, from `pg_replication_slots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Output plugin; `None` for a physical slot.
    pub plugin: Option<String>,
    pub database: Option<String>,
    /// Where a restart resumes; `None` until the slot has been consistent once.
    pub confirmed_flush: Option<Lsn>,
    /// A walsender is using it now.
    pub active: bool,
}

/// Opens a regular connection with the same session settings as the replication connection
/// (so COPY and replication agree on value text) and the source's TLS settings, and spawns its
/// connection task.
pub async fn connect(cfg: &PostgresConfig) -> Result<Client, SourceError> {
    let mut pg = tokio_postgres::Config::new();
    pg.host(&cfg.host)
        .port(cfg.port)
        .user(&cfg.user)
        .dbname(&cfg.database)
        .application_name("cdcd")
        .options(session_options());
    if let Some(p) = &cfg.password {
        pg.password(p);
    }
    let target = cfg.display_target();
    let failed = |e: tokio_postgres::Error| SourceError::Connect {
        target: target.clone(),
        detail: connect_detail(&e, cfg),
    };
    let tls_mode = match cfg.tls.mode {
        SslMode::Disable => None,
        // libpq's allow: plain first; a second connection in TLS if the server refuses it.
        SslMode::Allow => match connect_plain(&pg, &target).await {
            Ok(client) => return Ok(client),
            Err(e) if e.as_db_error().is_some() => Some(PgSslMode::Require),
            Err(e) => return Err(failed(e)),
        },
        SslMode::Prefer => Some(PgSslMode::Prefer),
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Some(PgSslMode::Require),
    };
    let Some(mode) = tls_mode else {
        return match connect_plain(&pg, &target).await {
            Ok(client) => Ok(client),
            Err(e) if e.code() == Some(&SqlState::INVALID_PASSWORD) => {
                Err(password_refused(cfg).await.unwrap_or_else(|| failed(e)))
            }
            Err(e) => Err(failed(e)),
        };
    };
    let connector = Connector::new(&cfg.tls).map_err(|e| SourceError::Connect {
        target: target.clone(),
        detail: e.to_string(),
    })?;
    pg.ssl_mode(mode);
    let (client, connection) = match pg.connect(connector).await {
        Ok(c) => c,
        Err(e) if e.code() == Some(&SqlState::INVALID_PASSWORD) => {
            return Err(password_refused(cfg).await.unwrap_or_else(|| failed(e)))
        }
        Err(e) => return Err(failed(e)),
    };
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(target = %target, error = %e, "postgres connection ended");
        }
    });
    Ok(client)
}

/// What a failed connection means for the user: the server's message with the TLS hint when
/// only `hostssl` lines would match, or the TLS failure itself (tokio-postgres's own text,
/// "error performing TLS handshake", leaves the reason in its source).
fn connect_detail(e: &tokio_postgres::Error, cfg: &PostgresConfig) -> String {
    if e.as_db_error().is_some() {
        let mut detail = db_error(e);
        if let Some(hint) = requires_tls_hint(&detail) {
            detail.push_str(&format!(": {hint}"));
        }
        return detail;
    }
    match std::error::Error::source(e) {
        Some(source) => match source.downcast_ref::<TlsError>() {
            Some(tls) => tls.to_string(),
            // tokio-postgres's words when the server answers the SSLRequest with N.
            None if source.to_string().contains("does not support TLS") => {
                tls_refused(&cfg.host, cfg.tls.mode).to_string()
            }
            None => format!("{e}: {source}"),
        },
        None => e.to_string(),
    }
}

/// tokio-postgres does not say which password method the server asked for; cdcd's own start-up
/// exchange does, so a refused password is retried once through it for the message (user and
/// method, never the password). `None` if that attempt fails differently or succeeds.
async fn password_refused(cfg: &PostgresConfig) -> Option<SourceError> {
    match super::startup::open(cfg, super::startup::SessionKind::Plain, "").await {
        Err(e @ SourceError::Connect { .. }) if e.to_string().contains("method") => Some(e),
        _ => None,
    }
}

async fn connect_plain(
    pg: &tokio_postgres::Config,
    target: &str,
) -> Result<Client, tokio_postgres::Error> {
    let mut pg = pg.clone();
    pg.ssl_mode(PgSslMode::Disable);
    let (client, connection) = pg.connect(NoTls).await?;
    let target = target.to_owned();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(target = %target, error = %e, "postgres connection ended");
        }
    });
    Ok(client)
}

/// `server_version_num`, e.g. 150004.
pub async fn server_version(client: &Client) -> Result<u32, SourceError> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await
        .map_err(|e| server("reading server_version_num", &e))?;
    let v: i32 = row.get(0);
    Ok(u32::try_from(v).unwrap_or(0))
}

/// pgoutput protocol for a server version: 4 on PG ≥ 16 (parallel streaming), 3 on 15 (two-phase),
/// 2 on 14 (streaming), 1 below. Versions 2+ are used with `streaming 'on'`.
pub fn proto_version(server_version_num: u32) -> u32 {
    match server_version_num {
        v if v >= 160_000 => 4,
        v if v >= 150_000 => 3,
        v if v >= 140_000 => 2,
        _ => 1,
    }
}

/// Server settings and privileges: wal_level, free slots and walsenders, the REPLICATION
/// attribute, and SELECT on `tables`. Every failing check is one [`CheckProblem`].
pub async fn check_server(
    client: &Client,
    cfg: &PostgresConfig,
    tables: &[TableId],
) -> Result<Vec<CheckProblem>, SourceError> {
    let mut problems = Vec::new();
    let row = client
        .query_one(
            "SELECT current_setting('wal_level'),
                    current_setting('max_replication_slots')::int4,
                    (SELECT count(*)::int4 FROM pg_replication_slots),
                    current_setting('max_wal_senders')::int4,
                    (SELECT count(*)::int4 FROM pg_stat_replication),
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
                    r.rolsuper, r.rolreplication
             FROM pg_roles r WHERE r.rolname = current_user",
            &[&cfg.slot],
        )
        .await
        .map_err(|e| server("reading server settings", &e))?;
    let wal_level: String = row.get(0);
    let (max_slots, used_slots): (i32, i32) = (row.get(1), row.get(2));
    let (max_senders, used_senders): (i32, i32) = (row.get(3), row.get(4));
    let slot_exists: bool = row.get(5);
    let (superuser, replication): (bool, bool) = (row.get(6), row.get(7));
    if wal_level != "logical" {
        problems.push(CheckProblem::new(
            format!("wal_level is {wal_level}"),
            "set wal_level = logical in postgresql.conf and restart Postgres",
        ));
    }
    if !slot_exists && used_slots >= max_slots {
        problems.push(CheckProblem::new(
            format!("all {max_slots} replication slots are in use (max_replication_slots)"),
            "raise max_replication_slots in postgresql.conf and restart Postgres, or drop an unused slot with pg_drop_replication_slot('…')",
        ));
    }
    if used_senders >= max_senders {
        problems.push(CheckProblem::new(
            format!("all {max_senders} WAL senders are in use (max_wal_senders)"),
            "raise max_wal_senders in postgresql.conf and restart Postgres",
        ));
    }
    if !superuser && !replication {
        problems.push(CheckProblem::new(
            format!("user {} lacks the REPLICATION attribute", cfg.user),
            format!("run ALTER ROLE {} WITH REPLICATION", quote_ident(&cfg.user)),
        ));
    }
    for t in tables {
        let row = client
            .query_one(
                "SELECT has_table_privilege(format('%I.%I', $1::text, $2::text), 'SELECT')",
                &[&t.namespace, &t.name],
            )
            .await
            .map_err(|e| server(&format!("checking SELECT on {t}"), &e))?;
        if !row.get::<_, bool>(0) {
            problems.push(CheckProblem::new(
                format!("user {} cannot SELECT from {t}", cfg.user),
                format!(
                    "run GRANT SELECT ON {} TO {}",
                    qualified(t),
                    quote_ident(&cfg.user)
                ),
            ));
        }
    }
    Ok(problems)
}

/// Every check `cdcd check` runs: resolving `source.tables` and their keys (patterns that match
/// nothing, tables without a usable key, `source.key_columns`) and [`check_server`]. Returns the
/// keys of the tables that can be replicated and all problems.
pub async fn check(
    client: &Client,
    cfg: &PostgresConfig,
) -> Result<(Vec<TableKey>, Vec<CheckProblem>), SourceError> {
    let (keys, mut problems) = resolve_report(client, &cfg.tables, &cfg.key_columns).await?;
    let tables: Vec<TableId> = keys.iter().map(|k| k.table.clone()).collect();
    problems.extend(check_server(client, cfg, &tables).await?);
    Ok((keys, problems))
}

/// The replication slot `slot`, if it exists.
pub async fn slot_exists(client: &Client, slot: &str) -> Result<Option<SlotInfo>, SourceError> {
    let row = client
        .query_opt(
            "SELECT plugin::text, database::text, confirmed_flush_lsn::text, active
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| server(&format!("reading replication slot {slot}"), &e))?;
    let Some(row) = row else { return Ok(None) };
    let confirmed: Option<String> = row.get(2);
    let confirmed_flush = match confirmed {
        Some(text) => Some(text.parse::<Lsn>().map_err(|e| SourceError::Server {
            context: format!("replication slot {slot}"),
            detail: e.to_string(),
        })?),
        None => None,
    };
    Ok(Some(SlotInfo {
        plugin: row.get(0),
        database: row.get(1),
        confirmed_flush,
        active: row.get(3),
    }))
}

/// Errors unless `info` is a pgoutput slot of `database`: another slot by the same name must not
/// be taken over.
pub fn verify_slot(slot: &str, info: &SlotInfo, database: &str) -> Result<(), SourceError> {
    if info.plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::Config(format!(
            "replication slot {slot} exists with plugin {}: set source.slot to another name or drop it with SELECT pg_drop_replication_slot('{slot}')",
            info.plugin.as_deref().unwrap_or("(physical)")
        )));
    }
    if info.database.as_deref() != Some(database) {
        return Err(SourceError::Config(format!(
            "replication slot {slot} belongs to database {}: set source.slot to another name",
            info.database.as_deref().unwrap_or("(none)")
        )));
    }
    Ok(())
}

pub(super) fn server(context: &str, e: &tokio_postgres::Error) -> SourceError {
    SourceError::Server {
        context: context.to_owned(),
        detail: db_error(e),
    }
}

/// The server's message when there is one (tokio-postgres' Display says only "db error").
pub(super) fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.hint() {
            Some(h) => format!("{} (hint: {h})", db.message()),
            None => db.message().to_owned(),
        },
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_by_version() {
        assert_eq!(proto_version(170_002), 4);
        assert_eq!(proto_version(160_000), 4);
        assert_eq!(proto_version(150_018), 3);
        assert_eq!(proto_version(140_011), 2);
        assert_eq!(proto_version(130_000), 1);
    }

    #[test]
    fn slot_of_another_plugin_or_database_is_refused() {
        let mut info = SlotInfo {
            plugin: Some("pgoutput".into()),
            database: Some("cdc".into()),
            confirmed_flush: None,
            active: false,
        };
        assert!(verify_slot("s", &info, "cdc").is_ok());
        assert!(verify_slot("s", &info, "other").is_err());
        info.plugin = Some("wal2json".into());
        let e = verify_slot("s", &info, "cdc").unwrap_err().to_string();
        assert!(e.contains("wal2json") && e.contains("s"), "{e}");
    }

    #[test]
    fn problems_print_as_one_line() {
        let p = CheckProblem::new("wal_level is replica", "set wal_level = logical");
        assert_eq!(
            p.to_string(),
            "wal_level is replica: set wal_level = logical"
        );
    }
}
