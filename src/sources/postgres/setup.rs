//! Checks and setup over a regular (non-replication) connection: server settings and privileges,
//! which tables `source.tables` captures, the publication, the slot's state, type and key lookups.
//!
//! Where it sits: `cdcd check` and `PostgresSource::prepare` run these before any replication
//! starts; `stream.rs` uses [`primary_key`] and [`lookup_types`] when a Relation message names a
//! table or type it has not seen. Everything here is catalog SQL through tokio-postgres; the
//! replication protocol itself lives in `replication.rs`.
//!
//! Why checks return a list: `cdcd check` prints every problem with its fix at once instead of
//! making the operator fix them one restart at a time.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use tokio_postgres::{Client, NoTls};

use super::relation::ColumnDef;
use super::replication::{quote_ident, session_options};
use super::types::TypeInfo;
use crate::changelog::{Lsn, TableId};
use crate::config::PostgresConfig;
use crate::sources::SourceError;

/// One failed check: what is wrong and how to fix it, printed as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckProblem {
    pub problem: String,
    pub fix: String,
}

impl CheckProblem {
    fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        CheckProblem {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for CheckProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem, self.fix)
    }
}

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
/// (so COPY and replication agree on value text), and spawns its connection task.
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
    let (client, connection) = pg.connect(NoTls).await.map_err(|e| SourceError::Connect {
        target: cfg.display_target(),
        detail: db_error(&e),
    })?;
    let target = cfg.display_target();
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

/// Every check `cdcd check` runs: resolving `source.tables` (patterns that match nothing, tables
/// without a primary key) and [`check_server`]. Returns the resolved tables and all problems.
pub async fn check(
    client: &Client,
    cfg: &PostgresConfig,
) -> Result<(Vec<TableId>, Vec<CheckProblem>), SourceError> {
    let (tables, mut problems) = resolve_report(client, &cfg.tables).await?;
    problems.extend(check_server(client, cfg, &tables).await?);
    Ok((tables, problems))
}

/// Resolves `schema.table` patterns (`*` matches any run of characters in either part) against
/// ordinary and partitioned tables outside system schemas. Partitions are left out: a partitioned
/// table is captured through its root (`publish_via_partition_root`). Errors on a pattern that
/// matches nothing or a matched table without a primary key.
pub async fn resolve_tables(
    client: &Client,
    patterns: &[String],
) -> Result<Vec<TableId>, SourceError> {
    let (tables, problems) = resolve_report(client, patterns).await?;
    match problems.into_iter().next() {
        None => Ok(tables),
        Some(p) => Err(SourceError::Config(p.to_string())),
    }
}

async fn resolve_report(
    client: &Client,
    patterns: &[String],
) -> Result<(Vec<TableId>, Vec<CheckProblem>), SourceError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text,
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
               AND n.nspname NOT IN ('pg_catalog', 'information_schema')
               AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%'
             ORDER BY 1, 2",
            &[],
        )
        .await
        .map_err(|e| server("listing tables", &e))?;
    let candidates: Vec<(TableId, bool)> = rows
        .iter()
        .map(|r| {
            (
                TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)),
                r.get(2),
            )
        })
        .collect();
    let mut problems = Vec::new();
    let mut matched = BTreeSet::new();
    let mut without_key = BTreeSet::new();
    for pattern in patterns {
        let Some((ps, pt)) = pattern.split_once('.') else {
            problems.push(CheckProblem::new(
                format!("source.tables: {pattern:?} is not schema.table"),
                "write it as \"schema.table\" (e.g. \"public.orders\" or \"public.*\")",
            ));
            continue;
        };
        let mut any = false;
        for (id, has_key) in &candidates {
            if glob_match(ps, &id.namespace) && glob_match(pt, &id.name) {
                any = true;
                if *has_key {
                    matched.insert(id.clone());
                } else {
                    without_key.insert(id.clone());
                }
            }
        }
        if !any {
            problems.push(CheckProblem::new(
                format!("source.tables: {pattern:?} matches no table"),
                "check the schema and table names, or remove the pattern",
            ));
        }
    }
    for id in without_key {
        problems.push(CheckProblem::new(
            format!("table {id} has no primary key"),
            "add a PRIMARY KEY or remove it from source.tables",
        ));
    }
    Ok((matched.into_iter().collect(), problems))
}

/// `*` matches any run of characters (possibly empty); everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative wildcard matching with backtracking to the last star.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if Some(&c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

/// Creates the publication for `tables` if it is missing; if it exists, verifies it publishes
/// every table and every operation, and otherwise errors with the exact statement to run.
pub async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableId],
) -> Result<(), SourceError> {
    let pub_ident = quote_ident(publication);
    let Some(row) = read_publication(client, publication).await? else {
        if tables.is_empty() {
            return Err(SourceError::Config(format!(
                "publication {publication}: no tables to publish"
            )));
        }
        let list: Vec<String> = tables.iter().map(qualified).collect();
        // Partitions' changes are published as their root table's, which is what cdcd captures.
        let sql = format!(
            "CREATE PUBLICATION {pub_ident} FOR TABLE {} WITH (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)",
            list.join(", ")
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| server(&format!("creating publication {publication}"), &e))?;
        tracing::info!(publication, tables = tables.len(), "created publication");
        return Ok(());
    };
    let all_tables: bool = row.get(0);
    if !all_tables {
        add_missing_tables(client, publication, tables).await;
    }
    match publication_problem(client, publication, tables, &row).await? {
        None => Ok(()),
        Some(p) => Err(SourceError::Config(p.to_string())),
    }
}

/// A table added to `source.tables` joins the existing publication, so that it can be copied
/// alone and then streamed. Best effort: without ownership of the publication the ALTER fails and
/// [`publication_problem`] reports the statement to run.
async fn add_missing_tables(client: &Client, publication: &str, tables: &[TableId]) {
    let published: BTreeSet<TableId> = match client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
    {
        Ok(rows) => rows
            .iter()
            .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect(),
        Err(_) => return,
    };
    let missing: Vec<String> = tables
        .iter()
        .filter(|t| !published.contains(*t))
        .map(qualified)
        .collect();
    if missing.is_empty() {
        return;
    }
    let sql = format!(
        "ALTER PUBLICATION {} ADD TABLE {}",
        quote_ident(publication),
        missing.join(", ")
    );
    match client.batch_execute(&sql).await {
        Ok(()) => {
            tracing::info!(publication, tables = %missing.join(", "), "added tables to the publication")
        }
        Err(e) => {
            tracing::warn!(publication, error = %db_error(&e), "could not add tables to the publication")
        }
    }
}

/// For `cdcd check`: what is wrong with an existing publication (a missing one is created at
/// start, so it is no problem).
pub async fn check_publication(
    client: &Client,
    publication: &str,
    tables: &[TableId],
) -> Result<Option<CheckProblem>, SourceError> {
    match read_publication(client, publication).await? {
        None => Ok(None),
        Some(row) => publication_problem(client, publication, tables, &row).await,
    }
}

async fn read_publication(
    client: &Client,
    publication: &str,
) -> Result<Option<tokio_postgres::Row>, SourceError> {
    client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
             FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| server(&format!("reading publication {publication}"), &e))
}

/// Whether the existing publication (`row` from [`read_publication`]) publishes every table and
/// every operation the way cdcd reads them; if not, the statement that fixes it.
async fn publication_problem(
    client: &Client,
    publication: &str,
    tables: &[TableId],
    row: &tokio_postgres::Row,
) -> Result<Option<CheckProblem>, SourceError> {
    let pub_ident = quote_ident(publication);
    let all_tables: bool = row.get(0);
    let ops = [row.get::<_, bool>(1), row.get(2), row.get(3), row.get(4)];
    let via_root: bool = row.get(5);
    if ops.iter().any(|o| !o) {
        return Ok(Some(CheckProblem::new(
            format!("publication {publication} does not publish every operation"),
            format!("run ALTER PUBLICATION {pub_ident} SET (publish = 'insert, update, delete, truncate')"),
        )));
    }
    let published: BTreeSet<TableId> = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| server(&format!("reading tables of publication {publication}"), &e))?
        .iter()
        .map(|r| TableId::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let missing: Vec<String> = tables
        .iter()
        .filter(|t| !all_tables && !published.contains(*t))
        .map(qualified)
        .collect();
    if !missing.is_empty() {
        return Ok(Some(CheckProblem::new(
            format!(
                "publication {publication} does not publish {}",
                missing.join(", ")
            ),
            format!(
                "run ALTER PUBLICATION {pub_ident} ADD TABLE {}",
                missing.join(", ")
            ),
        )));
    }
    if !via_root {
        let partitioned = partitioned_tables(client, tables).await?;
        if let Some(t) = partitioned.first() {
            return Ok(Some(CheckProblem::new(
                format!("publication {publication} publishes partitioned table {t} per partition"),
                format!(
                    "run ALTER PUBLICATION {pub_ident} SET (publish_via_partition_root = true)"
                ),
            )));
        }
    }
    Ok(None)
}

async fn partitioned_tables(
    client: &Client,
    tables: &[TableId],
) -> Result<Vec<TableId>, SourceError> {
    let mut out = Vec::new();
    for t in tables {
        let row = client
            .query_opt(
                "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p'",
                &[&t.namespace, &t.name],
            )
            .await
            .map_err(|e| server(&format!("reading {t}"), &e))?;
        if row.is_some() {
            out.push(t.clone());
        }
    }
    Ok(out)
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

/// Key column names of `table`'s primary key, in key order (empty: no primary key). Needed because
/// Relation messages flag key columns only under REPLICA IDENTITY DEFAULT.
pub async fn primary_key(client: &Client, table: &TableId) -> Result<Vec<String>, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text
             FROM pg_index i
             JOIN pg_class c ON c.oid = i.indrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
             WHERE i.indisprimary AND n.nspname = $1 AND c.relname = $2
             ORDER BY k.ord",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("reading the primary key of {table}"), &e))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The replicated columns of `table` in order, as pgoutput sends them: dropped and generated
/// columns are left out (pgoutput before Postgres 18 does not send generated columns, and COPY
/// without a column list leaves them out too).
pub async fn table_columns(
    client: &Client,
    table: &TableId,
) -> Result<Vec<ColumnDef>, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod
             FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2
               AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
             ORDER BY a.attnum",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("reading the columns of {table}"), &e))?;
    Ok(rows
        .iter()
        .map(|r| ColumnDef {
            name: r.get(0),
            type_oid: r.get(1),
            type_modifier: r.get(2),
            key_flag: false,
        })
        .collect())
}

/// `format_type` of each of `columns` of `table` (e.g. `integer`, `character varying(10)`), in
/// the order given: the casts a key range's text bounds need.
pub async fn column_type_names(
    client: &Client,
    table: &TableId,
    columns: &[String],
) -> Result<Vec<String>, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
             FROM pg_attribute a
             JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("reading the column types of {table}"), &e))?;
    let types: HashMap<String, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    columns
        .iter()
        .map(|c| {
            types.get(c).cloned().ok_or_else(|| SourceError::Table {
                table: table.clone(),
                detail: format!("key column {c} not found in the catalog"),
            })
        })
        .collect()
}

/// The planner's row estimate for `table` (`pg_class.reltuples`; for a table never vacuumed or
/// analyzed, where that is -1, its size at an assumed 100 bytes a row). Partitioned tables sum
/// their partitions.
pub async fn estimated_rows(client: &Client, table: &TableId) -> Result<u64, SourceError> {
    let row = client
        .query_one(
            "WITH RECURSIVE t AS (
                 SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2
                 UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.oid)
             SELECT COALESCE(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples
                                      ELSE pg_relation_size(c.oid) / 100 END), 0)::float8
             FROM pg_class c JOIN t ON t.oid = c.oid WHERE c.relkind = 'r'",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("estimating the rows of {table}"), &e))?;
    let rows: f64 = row.get(0);
    Ok(if rows.is_finite() && rows > 0.0 {
        rows as u64
    } else {
        0
    })
}

/// `pg_type` rows for `oids` (types the built-in mapping does not know: domains, enums, arrays of
/// those, extension types).
pub async fn lookup_types(
    client: &Client,
    oids: &[u32],
) -> Result<HashMap<u32, TypeInfo>, SourceError> {
    if oids.is_empty() {
        return Ok(HashMap::new());
    }
    let oids: Vec<u32> = oids.to_vec();
    let rows = client
        .query(
            "SELECT t.oid, n.nspname::text, t.typname::text, t.typtype::text, t.typelem, t.typbasetype
             FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE t.oid = ANY($1)",
            &[&oids],
        )
        .await
        .map_err(|e| server("reading type definitions", &e))?;
    let nonzero = |v: u32| (v != 0).then_some(v);
    Ok(rows
        .iter()
        .map(|r| {
            let oid: u32 = r.get(0);
            let typtype: String = r.get(3);
            let info = TypeInfo {
                oid,
                namespace: r.get(1),
                name: r.get(2),
                typtype: typtype.bytes().next().unwrap_or(b'b'),
                element: nonzero(r.get(4)),
                base: nonzero(r.get(5)),
            };
            (oid, info)
        })
        .collect())
}

/// `"schema"."table"`.
pub fn qualified(t: &TableId) -> String {
    format!("{}.{}", quote_ident(&t.namespace), quote_ident(&t.name))
}

fn server(context: &str, e: &tokio_postgres::Error) -> SourceError {
    SourceError::Server {
        context: context.to_owned(),
        detail: db_error(e),
    }
}

/// The server's message when there is one (tokio-postgres' Display says only "db error").
fn db_error(e: &tokio_postgres::Error) -> String {
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
    fn globs() {
        assert!(glob_match("*", "orders"));
        assert!(glob_match("*", ""));
        assert!(glob_match("ord*", "orders"));
        assert!(glob_match("*ers", "orders"));
        assert!(glob_match("o*d*s", "orders"));
        assert!(glob_match("orders", "orders"));
        assert!(!glob_match("orders", "orders2"));
        assert!(!glob_match("ord*x", "orders"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
    }

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
