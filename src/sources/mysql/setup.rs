//! Regular (non-replication) connections to MySQL/MariaDB: connecting (TLS when the URL asks),
//! learning the server's flavor and GTID mode, resolving table patterns, reading a table's columns
//! from `information_schema`, and the `cdcd check` preflight.
//!
//! This is one of the source's I/O edges; what it reads is handed to the pure `schema.rs`.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DriverError, OptsBuilder};

use crate::changelog::{KeyOrigin, TableId, TableKey};
use crate::config::MySqlConfig;
use crate::sources::SourceError;

use super::key;
use super::schema::{build_entry, matches_patterns, TableEntry};
use super::types::ColumnInfo;
use crate::tls::mysql::SslMode;

/// Which server and how it numbers transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// MariaDB: GTID lists, always on.
    MariaDb,
    /// MySQL with `gtid_mode=ON`.
    MySqlGtid,
    /// MySQL without GTIDs: `file:pos`.
    MySqlFile,
}

pub use crate::sources::CheckProblem;

/// A server error as a [`SourceError`] naming what was being done.
pub fn server_err(context: impl Into<String>) -> impl FnOnce(mysql_async::Error) -> SourceError {
    let context = context.into();
    move |e| SourceError::Server {
        context,
        detail: e.to_string(),
    }
}

/// ER_ACCESS_DENIED_ERROR: a wrong password, and also an account's unmet `REQUIRE SSL`/`X509`.
const ER_ACCESS_DENIED: u16 = 1045;

/// Connection options for `cfg` without TLS; `init` statements run on every new connection.
fn plain_opts(cfg: &MySqlConfig) -> OptsBuilder {
    OptsBuilder::default()
        .ip_or_hostname(cfg.host.clone())
        .tcp_port(cfg.port)
        .user(Some(cfg.user.clone()))
        .pass(cfg.password.clone())
        .db_name(Some(cfg.database.clone()))
        .prefer_socket(false)
        // UTC: the initial copy reads TIMESTAMP columns as UTC wall time.
        .init(vec!["SET time_zone = '+00:00', NAMES utf8mb4"])
}

/// Opens a connection (every one cdcd makes: catalog, copy, binlog), with TLS as `ssl-mode`
/// says. `preferred` falls back to plain only when the server's greeting lacks CLIENT_SSL,
/// which comes before any credential is sent.
pub async fn connect(cfg: &MySqlConfig) -> Result<Conn, SourceError> {
    let failed = |detail: String| SourceError::Connect {
        target: cfg.display_target(),
        detail,
    };
    let ssl = cfg.tls.ssl_opts().map_err(|e| failed(e.to_string()))?;
    let mut used_tls = ssl.is_some();
    let mut result = Conn::new(plain_opts(cfg).ssl_opts(ssl)).await;
    if cfg.tls.effective_mode() == SslMode::Preferred {
        if let Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer)) = result {
            used_tls = false;
            result = Conn::new(plain_opts(cfg)).await;
        }
    }
    result.map_err(|e| failed(connect_error(cfg, &e, used_tls)))
}

/// A failed connection in words the user can act on; never the password (mysql_async's
/// messages do not carry it, and the target is shown without it).
fn connect_error(cfg: &MySqlConfig, e: &mysql_async::Error, used_tls: bool) -> String {
    if let Some(tls) = cfg.tls.connect_error(&cfg.host, e) {
        return tls;
    }
    match e {
        mysql_async::Error::Server(s) if s.code == ER_ACCESS_DENIED => format!(
            "{} (user {:?}, password authentication as the account's plugin asks): {}",
            s.message,
            cfg.user,
            cfg.tls.access_denied_hint(used_tls)
        ),
        other => other.to_string(),
    }
}

/// The server's flavor.
pub async fn flavor(conn: &mut Conn) -> Result<Flavor, SourceError> {
    let version: Option<String> = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(server_err("reading the server version"))?;
    if version
        .unwrap_or_default()
        .to_ascii_lowercase()
        .contains("mariadb")
    {
        return Ok(Flavor::MariaDb);
    }
    let mode: Option<String> = conn
        .query_first("SELECT @@GLOBAL.gtid_mode")
        .await
        .map_err(server_err("reading gtid_mode"))?;
    Ok(match mode.as_deref() {
        Some("ON") => Flavor::MySqlGtid,
        _ => Flavor::MySqlFile,
    })
}

/// Base tables matching `patterns`, sorted.
pub async fn resolve_tables(
    conn: &mut Conn,
    patterns: &[String],
) -> Result<Vec<TableId>, SourceError> {
    let rows: Vec<(String, String)> = conn
        .query(
            "SELECT table_schema, table_name FROM information_schema.tables \
             WHERE table_type = 'BASE TABLE' \
             AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')",
        )
        .await
        .map_err(server_err("listing tables"))?;
    let mut tables: Vec<TableId> = rows
        .into_iter()
        .map(|(db, t)| TableId::new(db, t))
        .filter(|t| matches_patterns(patterns, t))
        .collect();
    tables.sort();
    Ok(tables)
}

/// Reads `table`'s columns and key: its primary key, else `wanted` (its `source.key_columns`
/// entry, checked by `key::resolve`). `None` when the table does not exist.
pub async fn load_table(
    conn: &mut Conn,
    table: &TableId,
    wanted: Option<&[String]>,
) -> Result<Option<TableEntry>, SourceError> {
    type Row = (
        String,
        String,
        String,
        Option<u64>,
        Option<u64>,
        Option<String>,
        String,
        Option<String>,
    );
    let ctx = || format!("reading the columns of {table}");
    let rows: Vec<Row> = conn
        .exec(
            "SELECT column_name, data_type, column_type, numeric_precision, numeric_scale, \
             character_set_name, is_nullable, column_default FROM information_schema.columns \
             WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            (&table.namespace, &table.name),
        )
        .await
        .map_err(server_err(ctx()))?;
    if rows.is_empty() {
        return Ok(None);
    }
    let key: Vec<String> = conn
        .exec(
            "SELECT column_name FROM information_schema.key_column_usage \
             WHERE table_schema = ? AND table_name = ? AND constraint_name = 'PRIMARY' \
             ORDER BY ordinal_position",
            (&table.namespace, &table.name),
        )
        .await
        .map_err(server_err(ctx()))?;
    // MariaDB's JSON is LONGTEXT with a json_valid() check; MySQL < 8.0.16 has no such view.
    let checks: Vec<String> = conn
        .exec(
            "SELECT check_clause FROM information_schema.check_constraints \
             WHERE constraint_schema = ? AND table_name = ?",
            (&table.namespace, &table.name),
        )
        .await
        .unwrap_or_default();
    // Declared SRIDs: MySQL 8's view (SRS_ID NULL when none), else MariaDB's (SRID 0 when none).
    let mut srids: Vec<(String, Option<u32>)> = Vec::new();
    for sql in [
        "SELECT column_name, srs_id FROM information_schema.st_geometry_columns \
         WHERE table_schema = ? AND table_name = ?",
        "SELECT g_geometry_column, srid FROM information_schema.geometry_columns \
         WHERE g_table_schema = ? AND g_table_name = ?",
    ] {
        srids = conn
            .exec(sql, (&table.namespace, &table.name))
            .await
            .unwrap_or_default();
        if !srids.is_empty() {
            break;
        }
    }
    let columns: Vec<ColumnInfo> = rows
        .into_iter()
        .map(
            |(name, data_type, column_type, p, s, charset, nullable, default)| {
                let json_check = checks
                    .iter()
                    .any(|c| c.contains(&format!("json_valid(`{name}`)")));
                let srid = srids
                    .iter()
                    .find(|(c, _)| *c == name)
                    .and_then(|(_, s)| s.filter(|s| *s != 0));
                ColumnInfo {
                    name,
                    data_type,
                    column_type,
                    numeric_precision: p,
                    numeric_scale: s,
                    charset,
                    nullable: nullable == "YES",
                    json_check,
                    default,
                    former_names: Vec::new(),
                    srid,
                }
            },
        )
        .collect();
    let nullable: Vec<(String, bool)> = columns
        .iter()
        .map(|c| (c.name.clone(), c.nullable))
        .collect();
    let resolved = key::resolve(table, &key, &nullable, wanted)
        .map_err(|p| SourceError::Config(p.to_string()))?;
    let mut entry = build_entry(table.clone(), &columns, &resolved.columns).map_err(|e| {
        SourceError::Table {
            table: table.clone(),
            detail: e.to_string(),
        }
    })?;
    entry.key_origin = resolved.origin;
    let charset: Option<String> = conn
        .exec_first(
            "SELECT c.character_set_name FROM information_schema.tables t \
             JOIN information_schema.collations c ON c.collation_name = t.table_collation \
             WHERE t.table_schema = ? AND t.table_name = ?",
            (&table.namespace, &table.name),
        )
        .await
        .map_err(server_err(ctx()))?;
    if let Some(charset) = charset {
        entry.charset = charset;
    }
    Ok(Some(entry))
}

async fn variable(conn: &mut Conn, name: &str) -> Result<Option<String>, SourceError> {
    let row: Option<(String, String)> = conn
        .query_first(format!("SHOW VARIABLES LIKE '{name}'"))
        .await
        .map_err(server_err(format!("reading {name}")))?;
    Ok(row.map(|(_, v)| v))
}

/// Server settings and privileges the binlog stream needs, one problem per line with its fix.
/// Session-level values count: `binlog_format` and `binlog_row_image` are per session, and a
/// session default that differs from the global one is what cdcd will see from new clients.
pub async fn check(
    conn: &mut Conn,
    cfg: &MySqlConfig,
) -> Result<(Vec<TableKey>, Vec<CheckProblem>), SourceError> {
    let mut problems = Vec::new();
    let row_image = check_binlog(conn, cfg, &mut problems).await?;
    check_grants(conn, cfg, &mut problems).await?;
    let keys = check_tables(conn, cfg, row_image.as_deref(), &mut problems).await?;
    Ok((keys, problems))
}

/// Records a problem and its fix in `problems`.
fn reporter(problems: &mut Vec<CheckProblem>) -> impl FnMut(String, &str) + '_ {
    move |problem: String, fix: &str| {
        problems.push(CheckProblem {
            problem,
            fix: fix.to_owned(),
        })
    }
}

/// The binary log's settings (`log_bin`, `binlog_format`, `binlog_row_image`, `server_id`,
/// `gtid_mode`); returns `binlog_row_image`.
async fn check_binlog(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    problems: &mut Vec<CheckProblem>,
) -> Result<Option<String>, SourceError> {
    let mut p = reporter(problems);
    match variable(conn, "log_bin").await?.as_deref() {
        Some("ON") => {}
        other => p(
            format!("log_bin is {}", other.unwrap_or("unset")),
            "enable the binary log: log_bin in the server's config, then restart",
        ),
    }
    let global_format: Option<String> = conn
        .query_first("SELECT @@GLOBAL.binlog_format")
        .await
        .map_err(server_err("reading binlog_format"))?;
    let session_format = variable(conn, "binlog_format").await?;
    for (scope, value) in [("global", global_format), ("session", session_format)] {
        match value.as_deref() {
            Some("ROW") | None => {}
            Some(other) => p(
                format!("{scope} binlog_format is {other}, not ROW"),
                "SET GLOBAL binlog_format = 'ROW' (and binlog_format=ROW in the server's config); writers must reconnect",
            ),
        }
    }
    let row_image = variable(conn, "binlog_row_image").await?;
    match row_image.as_deref() {
        Some("FULL") | Some("MINIMAL") | Some("NOBLOB") | None => {}
        Some(other) => p(
            format!("binlog_row_image is {other}"),
            "SET GLOBAL binlog_row_image = 'FULL' (MINIMAL and NOBLOB work too)",
        ),
    }
    let server_id: Option<u32> = conn
        .query_first("SELECT @@GLOBAL.server_id")
        .await
        .map_err(server_err("reading server_id"))?;
    match server_id {
        Some(0) | None => p(
            "the server's server_id is 0".into(),
            "set server_id to a non-zero value in the server's config",
        ),
        Some(id) if id == cfg.server_id => p(
            format!("source.server_id {id} is the server's own server_id"),
            "choose a source.server_id no server or replica uses",
        ),
        Some(_) => {}
    }
    let fl = flavor(conn).await?;
    if fl == Flavor::MySqlFile {
        if let Some(mode) = variable(conn, "gtid_mode").await? {
            p(
                format!("gtid_mode is {mode}: positions will be binlog file:offset"),
                "optional: enable gtid_mode=ON and enforce_gtid_consistency=ON for positions that survive a failover",
            );
        }
    }
    Ok(row_image)
}

/// The user's privileges: REPLICATION SLAVE, SELECT, REPLICATION CLIENT (or BINLOG MONITOR).
async fn check_grants(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    problems: &mut Vec<CheckProblem>,
) -> Result<(), SourceError> {
    let mut p = reporter(problems);
    let grants: Vec<String> = conn
        .query("SHOW GRANTS")
        .await
        .map_err(server_err("reading grants"))?;
    let all = grants.join(" ").to_ascii_uppercase();
    let has = |g: &str| all.contains("ALL PRIVILEGES") || all.contains(g);
    for (needed, what) in [
        ("REPLICATION SLAVE", "REPLICATION SLAVE"),
        ("SELECT", "SELECT"),
    ] {
        if !has(needed) {
            p(
                format!("user {} lacks {what}", cfg.user),
                &format!("GRANT {what} ON *.* TO '{}'@'…'", cfg.user),
            );
        }
    }
    if !(has("REPLICATION CLIENT") || has("BINLOG MONITOR") || has("SUPER")) {
        p(
            format!(
                "user {} lacks REPLICATION CLIENT (MariaDB: BINLOG MONITOR)",
                cfg.user
            ),
            &format!(
                "GRANT REPLICATION CLIENT ON *.* TO '{}'@'…' (MariaDB: BINLOG MONITOR)",
                cfg.user
            ),
        );
    }
    Ok(())
}

/// The captured tables and their keys (a `source.key_columns` key needs the FULL row image).
async fn check_tables(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    row_image: Option<&str>,
    problems: &mut Vec<CheckProblem>,
) -> Result<Vec<TableKey>, SourceError> {
    let mut p = reporter(problems);
    let tables = resolve_tables(conn, &cfg.tables).await?;
    if tables.is_empty() {
        p(
            format!("source.tables {:?} match no table", cfg.tables),
            "check the db.table patterns and that the tables exist",
        );
    }
    for t in cfg.key_columns.keys().filter(|t| !tables.contains(*t)) {
        p(
            format!("source.key_columns names {t}, which source.tables does not capture"),
            &format!("add {t} to source.tables or remove it from source.key_columns"),
        );
    }
    let mut keys = Vec::new();
    for t in &tables {
        match table_key(conn, cfg, t).await {
            Ok(Some(Ok(k))) => {
                if k.origin == KeyOrigin::Override && !matches!(row_image, Some("FULL") | None) {
                    p(
                        format!(
                            "binlog_row_image is {}: the before images of {t}'s updates and deletes may leave out its source.key_columns",
                            row_image.unwrap_or_default()
                        ),
                        "SET GLOBAL binlog_row_image = 'FULL' (and binlog_row_image=FULL in the server's config); writers must reconnect",
                    );
                }
                keys.push(k);
            }
            Ok(Some(Err(problem))) => p(problem.problem, &problem.fix),
            Ok(None) => {}
            Err(e) => p(
                e.to_string(),
                "change the column type or remove the table from source.tables",
            ),
        }
    }
    Ok(keys)
}

/// The key of `table` (its primary key, else its `source.key_columns` entry), or what is wrong
/// with that entry; `None` when the table does not exist.
pub async fn table_key(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    table: &TableId,
) -> Result<Option<Result<TableKey, CheckProblem>>, SourceError> {
    let Some(entry) = load_table(conn, table, None).await? else {
        return Ok(None);
    };
    let primary_key: Vec<String> = entry
        .schema
        .key_names()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let columns: Vec<(String, bool)> = entry
        .schema
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.nullable))
        .collect();
    Ok(Some(key::resolve(
        table,
        &primary_key,
        &columns,
        cfg.key_columns.get(table).map(Vec::as_slice),
    )))
}
