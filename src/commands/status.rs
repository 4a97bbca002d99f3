//! `cdcd status`: per captured table, its key, committed position, snapshot, rows, files and a
//! pending resync, as a table or JSON.

use serde::Serialize;

use super::build::{build_sink, open_warehouse};
use super::{print_json, CommandError};
use crate::changelog::{KeyOrigin, TableKey};
use crate::checkpoint::resync::ResyncStore;
use crate::config::Config;

/// One table in `cdcd status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusRow {
    pub table: String,
    /// The key columns (empty: keyless).
    pub key: Vec<String>,
    /// Where the key came from: `primary_key`, `replica_identity_index`, `key_columns`, `none`
    /// (keyless, insert-only), `full_row` (keyless, updates and deletes applied as a multiset).
    pub key_origin: &'static str,
    /// The replica identity index, when `key_origin` is `replica_identity_index`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_index: Option<String>,
    pub location: Option<String>,
    pub position: Option<String>,
    pub snapshot_id: Option<i64>,
    pub rows: Option<u64>,
    /// Live data and delete files, their bytes, snapshots kept.
    pub live_files: Option<u64>,
    pub live_bytes: Option<u64>,
    pub snapshots: Option<u64>,
    /// The default partition spec and sort order (`spec 1: day(created_at)`,
    /// `order 0: unsorted`); Iceberg only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_spec: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_order: Option<String>,
    /// A pending `cdcd resync` of the table: `requested <id>`, or `online <id> since <position>`
    /// once a copy job began (the pipeline holds its acknowledgements there until it is done).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync: Option<String>,
}

/// Prints every captured table's row: a fixed-width table, or JSON.
pub async fn run(config: &Config, json: bool) -> Result<(), CommandError> {
    let rows = status(config).await?;
    if json {
        return print_json(&rows);
    }
    let dash = |v: Option<u64>| v.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
    println!(
        "{:<40} {:<32} {:<20} {:>20} {:>12} {:>8} {:>14} {:>9}",
        "TABLE", "KEY", "POSITION", "SNAPSHOT", "ROWS", "FILES", "BYTES", "SNAPSHOTS"
    );
    for r in rows {
        let key = match (r.key.is_empty(), &r.key_index) {
            (true, _) if r.key_origin == "full_row" => "full row (multiset)".to_owned(),
            (true, _) => "-".to_owned(),
            (false, Some(index)) => format!("({}) {index}", r.key.join(", ")),
            (false, None) => format!("({}) {}", r.key.join(", "), r.key_origin),
        };
        println!(
            "{:<40} {:<32} {:<20} {:>20} {:>12} {:>8} {:>14} {:>9}",
            r.table,
            key,
            r.position.as_deref().unwrap_or("-"),
            r.snapshot_id
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            dash(r.rows),
            dash(r.live_files),
            dash(r.live_bytes),
            dash(r.snapshots),
        );
        if let (Some(spec), Some(order)) = (&r.partition_spec, &r.sort_order) {
            println!("  partition {spec}; sort {order}");
        }
        if let Some(resync) = &r.resync {
            println!("  resync: {resync}");
        }
    }
    Ok(())
}

/// The committed state of every captured table.
pub async fn status(config: &Config) -> Result<Vec<StatusRow>, CommandError> {
    let sink = build_sink(config, None)?;
    let tables: Vec<TableKey> = crate::sources::build(&config.source).tables().await?;
    let resyncs = ResyncStore::new(&open_warehouse(config)?, &config.pipeline)
        .list()
        .await?;
    let mut rows = Vec::new();
    for key in tables {
        let table = &key.table;
        let status = sink.status(table).await.map_err(Box::new)?;
        let layout = status.as_ref().and_then(|s| s.layout.as_ref());
        rows.push(StatusRow {
            table: table.to_string(),
            key_origin: key.origin.label(),
            key_index: match &key.origin {
                KeyOrigin::IdentityIndex(index) => Some(index.clone()),
                _ => None,
            },
            key: key.columns,
            location: status.as_ref().map(|s| s.location.clone()),
            position: status
                .as_ref()
                .and_then(|s| s.checkpoint.as_ref())
                .map(|c| c.position.to_string()),
            snapshot_id: status.as_ref().map(|s| s.snapshot_id),
            rows: status.as_ref().and_then(|s| s.rows),
            live_files: status.as_ref().and_then(|s| s.files).map(|f| f.live_files),
            live_bytes: status.as_ref().and_then(|s| s.files).map(|f| f.live_bytes),
            snapshots: status.as_ref().and_then(|s| s.files).map(|f| f.snapshots),
            partition_spec: layout.map(|l| l.partition_spec.clone()),
            sort_order: layout.map(|l| l.sort_order.clone()),
            resync: resyncs
                .iter()
                .find(|r| r.table() == *table)
                .map(|r| match &r.held_at {
                    Some(at) => format!("online {} since {at}", r.id),
                    None => format!("requested {}", r.id),
                }),
        });
    }
    Ok(rows)
}
