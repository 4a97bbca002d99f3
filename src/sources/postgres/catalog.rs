//! Catalog lookups for one table: its columns, type names and OIDs, and the planner's row
//! estimate (its key is `key.rs`'s).
//!
//! Where it sits: `assembler/mod.rs` asks for types when a Relation message names a type it has not
//! seen; the initial copy (`snapshot/`) plans its chunks from the key and the
//! estimate. Plain catalog SQL over a regular connection.

use std::collections::HashMap;

use tokio_postgres::Client;

use super::relation::ColumnDef;
use super::replication::quote_ident;
use super::setup::server;
use super::types::TypeInfo;
use crate::changelog::TableId;
use crate::sources::SourceError;

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

/// What a copy at a snapshot depends on: the table's replicated columns, and the storage of it
/// and its partitions (`pg_class` oid and `relfilenode` of each relation in its inheritance tree).
///
/// Read in a transaction at an exported snapshot it is the shape the snapshot sees; read by a
/// plain connection it is the shape now. A table-rewriting `ALTER TABLE`, `TRUNCATE`, `CLUSTER`
/// and `VACUUM FULL` give the table new storage, and a rewrite is not MVCC-safe (Postgres docs,
/// "MVCC Caveats"): its new heap's rows carry the rewriting transaction's xid, invisible to an
/// older snapshot, so a `COPY` at that snapshot returns no rows and no error. Two shapes that
/// differ mean a copy at the older snapshot cannot be trusted (`snapshot/parallel.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    pub columns: Vec<ColumnDef>,
    /// `(oid, relfilenode)` of the table and every partition under it, by oid.
    pub storage: Vec<(u32, u32)>,
}

/// The [`TableShape`] of `table` as `client`'s transaction sees it.
pub async fn table_shape(client: &Client, table: &TableId) -> Result<TableShape, SourceError> {
    let columns = table_columns(client, table).await?;
    // pg_inherits read as a table, not through `pg_partition_tree()`: the function reads the
    // catalog as of now, the query as of the transaction's snapshot.
    let rows = client
        .query(
            "WITH RECURSIVE tree(oid) AS (
               SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = $1 AND c.relname = $2
               UNION
               SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)
             SELECT c.oid, c.relfilenode FROM tree JOIN pg_class c ON c.oid = tree.oid
             ORDER BY c.oid",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("reading the storage of {table}"), &e))?;
    Ok(TableShape {
        columns,
        storage: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
    })
}

/// The `pg_class` oid of each of `tables` that exists now (the assembler's guard against a
/// captured table renamed or dropped and created again while streaming).
pub async fn table_oids(
    client: &Client,
    tables: &[TableId],
) -> Result<HashMap<u32, TableId>, SourceError> {
    let (namespaces, names): (Vec<&str>, Vec<&str>) = tables
        .iter()
        .map(|t| (t.namespace.as_str(), t.name.as_str()))
        .unzip();
    let rows = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN unnest($1::text[], $2::text[]) AS t(nsp, rel)
               ON t.nsp = n.nspname AND t.rel = c.relname",
            &[&namespaces, &names],
        )
        .await
        .map_err(|e| server("reading the captured tables' oids", &e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                TableId::new(r.get::<_, String>(1), r.get::<_, String>(2)),
            )
        })
        .collect())
}

/// The column numbers (`attnum`) of the live columns of relations `oids`, by relation and
/// column name, from the catalog now (`state.rs` says what they tell).
pub async fn column_attnums(
    client: &Client,
    oids: &[u32],
) -> Result<HashMap<u32, std::collections::BTreeMap<String, i16>>, SourceError> {
    let rows = client
        .query(
            "SELECT attrelid, attname::text, attnum FROM pg_attribute
             WHERE attrelid = ANY($1) AND attnum > 0 AND NOT attisdropped",
            &[&oids],
        )
        .await
        .map_err(|e| server("reading the captured tables' column numbers", &e))?;
    let mut out: HashMap<u32, std::collections::BTreeMap<String, i16>> = HashMap::new();
    for r in &rows {
        out.entry(r.get(0))
            .or_default()
            .insert(r.get::<_, String>(1), r.get(2));
    }
    Ok(out)
}

/// The start of a statement that widens the 32-bit xid `$1` of a recent transaction (within 2^31
/// of the current snapshot's `xmax` either way) to a 64-bit txid with that `xmax`'s epoch: a
/// relation `t(snap, txid)`, `snap` the statement's own snapshot.
const RECENT_TXID: &str = "WITH s AS (SELECT txid_current_snapshot() AS snap),
     x AS (SELECT snap, txid_snapshot_xmax(snap) >> 32 AS epoch,
                  txid_snapshot_xmax(snap) & 4294967295 AS low FROM s),
     t AS (SELECT snap, GREATEST(epoch + CASE
                   WHEN $1::int8 - low > 2147483648 THEN -1
                   WHEN low - $1::int8 > 2147483648 THEN 1
                   ELSE 0 END, 0) * 4294967296 + $1::int8 AS txid FROM x)";

/// Waits until a new snapshot sees transaction `xid`, which has committed; every later read
/// then sees it too.
///
/// The walsender sends a transaction once its commit record is flushed, and the committing
/// backend becomes visible to new snapshots only after that: a catalog read in between would
/// find the catalog as it was before the transaction's DDL (`xid`: [`RECENT_TXID`]).
pub async fn await_visible(client: &Client, xid: u32) -> Result<(), SourceError> {
    const ATTEMPTS: u32 = 500;
    for _ in 0..ATTEMPTS {
        let seen: bool = client
            .query_one(
                &format!("{RECENT_TXID} SELECT txid_visible_in_snapshot(txid, snap) FROM t"),
                &[&i64::from(xid)],
            )
            .await
            .map_err(|e| server("waiting for a transaction to become visible", &e))?
            .get(0);
        if seen {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(SourceError::Server {
        context: "waiting for a transaction to become visible".into(),
        detail: format!(
            "transaction {xid} is in the replication stream as committed but no snapshot has seen it after 10 s; cdcd stopped before applying it"
        ),
    })
}

/// Where transaction `xid` stands (`txid_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XactStatus {
    Committed,
    Aborted,
    InProgress,
}

/// Whether transaction `xid` (a recent one: [`RECENT_TXID`]) has
/// committed, aborted, or is still in progress. A transaction too old for the commit log to
/// say is long finished; cdcd only asks about one it has just seen, so that counts as committed.
pub async fn xact_status(client: &Client, xid: u32) -> Result<XactStatus, SourceError> {
    let status: Option<String> = client
        .query_one(
            &format!("{RECENT_TXID} SELECT txid_status(txid) FROM t"),
            &[&i64::from(xid)],
        )
        .await
        .map_err(|e| server("reading a transaction's status", &e))?
        .get(0);
    Ok(match status.as_deref() {
        Some("aborted") => XactStatus::Aborted,
        Some("in progress") => XactStatus::InProgress,
        _ => XactStatus::Committed,
    })
}

/// Whether the relation with `oid` exists now and is named `table`.
pub async fn oid_is_named(client: &Client, oid: u32, table: &TableId) -> Result<bool, SourceError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                            WHERE c.oid = $1 AND n.nspname = $2 AND c.relname = $3)",
            &[&oid, &table.namespace, &table.name],
        )
        .await
        .map_err(|e| server("looking up a relation's oid", &e))?;
    Ok(row.get(0))
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

/// A table's size as the catalog has it (partitions and inheritance children included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSize {
    /// Estimated rows: `reltuples`, or ~100 bytes a row where the table was never analyzed.
    pub rows: u64,
    /// Heap pages now (`pg_relation_size` over the block size).
    pub pages: u64,
    /// Bytes on disk: heap and TOAST (`pg_table_size`).
    pub bytes: u64,
}

pub async fn table_size(client: &Client, table: &TableId) -> Result<TableSize, SourceError> {
    let row = client
        .query_one(
            "WITH RECURSIVE t AS (
                 SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2
                 UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.oid)
             SELECT COALESCE(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples
                                      ELSE pg_relation_size(c.oid) / 100 END), 0)::float8,
                    (COALESCE(sum(pg_relation_size(c.oid)), 0)
                     / current_setting('block_size')::int8)::int8,
                    COALESCE(sum(pg_table_size(c.oid)), 0)::int8
             FROM pg_class c JOIN t ON t.oid = c.oid WHERE c.relkind = 'r'",
            &[&table.namespace, &table.name],
        )
        .await
        .map_err(|e| server(&format!("estimating the rows of {table}"), &e))?;
    let rows: f64 = row.get(0);
    let pages: i64 = row.get(1);
    let bytes: i64 = row.get(2);
    Ok(TableSize {
        rows: if rows.is_finite() && rows > 0.0 {
            rows as u64
        } else {
            0
        },
        pages: u64::try_from(pages).unwrap_or(0),
        bytes: u64::try_from(bytes).unwrap_or(0),
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

/// What the catalog says about a column a Relation message adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddedColumn {
    /// No default: existing rows read NULL.
    NoDefault,
    /// The value existing rows read (`attmissingval`, PostgreSQL 11+ "fast default": a constant
    /// default stored once instead of rewriting the table), as the type's text; `None` for NULL.
    Missing(Option<String>),
    /// A default but no stored value for existing rows: a volatile default (`now()`, `random()`)
    /// rewrote the table, giving each row a value the stream never carries, or the table was
    /// rewritten since. Nothing tells cdcd what the rows hold.
    Rewritten,
}

/// What `columns` of relation `oid` hold for the rows that predate them, from the catalog now.
///
/// The columns come from a Relation message of a committed transaction, yet a new snapshot may
/// not see that transaction yet: the walsender decodes a commit once its WAL is flushed, and the
/// committing backend leaves the proc array (which makes it visible) only after that. Reading then
/// would find no column and call it "no default". So the read is repeated until every named
/// column is there; one that never shows up (dropped or renamed meanwhile) is an error, never a
/// guess.
pub async fn added_columns(
    client: &Client,
    oid: u32,
    columns: &[String],
) -> Result<Vec<(String, AddedColumn)>, SourceError> {
    const ATTEMPTS: u32 = 200;
    for _ in 0..ATTEMPTS {
        let rows = client
            .query(
                "SELECT attname::text, atthasdef, atthasmissing,
                        CASE WHEN atthasmissing THEN (attmissingval::text::text[])[1] END
                 FROM pg_attribute
                 WHERE attrelid = $1 AND attname = ANY($2) AND NOT attisdropped",
                &[&oid, &columns],
            )
            .await
            .map_err(|e| server("reading column defaults", &e))?;
        if rows.len() == columns.len() {
            return Ok(rows
                .iter()
                .map(|r| {
                    let (has_default, has_missing): (bool, bool) = (r.get(1), r.get(2));
                    let state = match (has_default, has_missing) {
                        (_, true) => AddedColumn::Missing(r.get(3)),
                        (true, false) => AddedColumn::Rewritten,
                        (false, false) => AddedColumn::NoDefault,
                    };
                    (r.get(0), state)
                })
                .collect());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(SourceError::Server {
        context: "reading column defaults".into(),
        detail: format!(
            "column(s) {} of relation {oid} are in the replication stream but not in the catalog after 10 s (dropped or renamed since?); cdcd cannot tell whether they were added with a DEFAULT, so it stopped before the change",
            columns.join(", ")
        ),
    })
}

/// The value rows that predate each column of relation `oid` read where the catalog stores one
/// (`attmissingval`: a column added with a constant default; PostgreSQL 11+), as the type's
/// text, by column name. Read from the catalog now, once per table and session
/// ([`Assembler::captured_relation`](super::assembler::Assembler::captured_relation)): unlike
/// [`added_columns`] nothing is waited for and nothing stops; a column without a stored value
/// is absent.
pub async fn stored_defaults(
    client: &Client,
    oid: u32,
) -> Result<std::collections::HashMap<String, String>, SourceError> {
    let rows = client
        .query(
            "SELECT attname::text, (attmissingval::text::text[])[1]
             FROM pg_attribute
             WHERE attrelid = $1 AND attnum > 0 AND atthasmissing AND NOT attisdropped",
            &[&oid],
        )
        .await
        .map_err(|e| server("reading column defaults", &e))?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.get::<_, String>(0), r.get::<_, Option<String>>(1)?)))
        .collect())
}

/// `"schema"."table"`.
pub fn qualified(t: &TableId) -> String {
    format!("{}.{}", quote_ident(&t.namespace), quote_ident(&t.name))
}
