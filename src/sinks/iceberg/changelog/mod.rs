//! The changelog table: for a table with `changelog = true`, every change cdcd commits to it is
//! also appended to the Iceberg table `<namespace>.<table>_changelog`, as complete row images
//! with the change's kind, source position, commit time and transaction (`_cdc_op`,
//! `_cdc_position`, `_cdc_commit_ts`, `_cdc_tx`) and `_cdc_seq`, the order of the table's
//! changes. Append-only, partitioned by `day(_cdc_commit_ts)`, never a delete file: any engine
//! reads it, including those that mishandle deletes (Iceberg's own changelog scan refuses them).
//!
//! Where it sits: inside one table's commit (`IcebergSink::commit_once`), while the table's slot
//! is held, after the table's changes are planned and before its snapshot is published:
//! [`ChangelogWrite::prior`] reads the table's rows before the commit that complete the images
//! (as the commit reads rows to complete); then, beside the table's own stage on another thread
//! (`beside.rs`), `Pending::rows` builds the rows (`images.rs`) and [`ChangelogWrite::stage`]
//! writes the changelog's files. Both publish after both are staged:
//! `StagedChangelog::publish_with` publishes the changelog's snapshot and the table's in one
//! catalog transaction where the catalog offers one (REST `transactions/commit`); otherwise
//! `StagedChangelog::publish` commits the changelog with the table's checkpoint as its own
//! `cdcd.position`, and then the table's snapshot is published.
//!
//! Why the changelog first, with its own checkpoint, when the two are two catalog commits: a crash
//! between them leaves the changelog ahead of its table, never behind; the restart replays from
//! the table's checkpoint, and the changelog takes only the transactions its own checkpoint does
//! not cover, so nothing is missing and nothing is there twice. A reader that must never see the
//! changelog ahead reads it up to its table's `cdcd.position`.
//!
//! Retention (`changelog_retention`, `retention.rs`): the maintenance cycle of a changelog table
//! drops its day partitions older than the retention, whole data files in a `delete` snapshot.
//! `_cdc_seq` comes from a counter kept in the changelog's checkpoint (`cdcd.changelog_seq`), not
//! from the rows it holds, so it never repeats after a drop.
//!
//! A resync of the table does not touch the changelog's rows; the first changelog commit after the
//! swap (the table's `cdcd.resync-id` differs from the changelog's `cdcd.changelog_resync`) starts
//! with one `resync` row, a boundary a consumer reloads at (`write.rs`, `Marker`).
//!
//! Initial-copy rows are not changes: they carry no source transaction and are not in the
//! changelog; replaying the changelog onto the copy gives the table. The changelog evolves with
//! its table: its schema is the table's columns after the `_cdc_*` ones, so a column the table
//! gains is appended to both.

mod beside;
mod images;
mod retention;
mod write;

use arrow_schema::{DataType, TimeUnit};
use iceberg::spec::Transform;

use crate::changelog::{Column, TableId, TableSchema};
use crate::config::tables::{Configured, Origin, PartitionField, TableSettings};

pub(super) use beside::beside;
pub(super) use retention::ChangelogRetention;
pub(super) use write::{ChangelogWrite, Scratch};

/// `_cdc_op`: `insert`, `update_before`, `update_after`, `delete` (or `truncate`, `resync`).
pub(crate) const OP: &str = "_cdc_op";
/// `_cdc_position`: the position of the change's transaction, as `cdcd.position` writes it.
pub(crate) const POSITION: &str = "_cdc_position";
/// `_cdc_commit_ts`: the transaction's commit time at the source.
pub(crate) const COMMIT_TS: &str = "_cdc_commit_ts";
/// `_cdc_tx`: the transaction's id at the source.
pub(crate) const TX: &str = "_cdc_tx";
/// `_cdc_seq`: the change's place in the table's changes, from 1.
pub(crate) const SEQ: &str = "_cdc_seq";

/// `table`'s changelog table when `table` has the changelog on (`None` otherwise), made known
/// to `tables` as its changelog (for its settings and its retention).
pub(super) fn known_changelog(
    tables: &crate::sinks::iceberg::tables::Tables,
    table: &TableId,
) -> Result<Option<TableId>, crate::sinks::SinkError> {
    let is_changelog = tables
        .changelogs
        .lock()
        .is_ok_and(|known| known.contains_key(table));
    if is_changelog || !tables.settings.resolve(table)?.changelog {
        return Ok(None);
    }
    let id = changelog_id(table);
    if let Ok(mut known) = tables.changelogs.lock() {
        known.insert(id.clone(), table.clone());
    }
    Ok(Some(id))
}

/// The changelog for `cdcd check`: `changelog <ns>.<table>_changelog (retention 30d)`; `None`
/// when the table has none.
pub(super) fn describe(table: &TableId, settings: &TableSettings) -> Option<String> {
    if !settings.changelog {
        return None;
    }
    let id = changelog_id(table);
    Some(match settings.changelog_retention {
        Some(kept) if kept.as_secs() % 86_400 == 0 => {
            format!("changelog {id} (retention {}d)", kept.as_secs() / 86_400)
        }
        Some(kept) => format!("changelog {id} (retention {}h)", kept.as_secs() / 3_600),
        None => format!("changelog {id}"),
    })
}

/// The changelog table of `table`.
pub(crate) fn changelog_id(table: &TableId) -> TableId {
    TableId::new(table.namespace.clone(), format!("{}_changelog", table.name))
}

/// The changelog's schema for `schema`'s table: the `_cdc_*` columns, then the table's columns,
/// all nullable (a delete's image may lack them), without a key (append-only).
pub(crate) fn changelog_schema(schema: &TableSchema) -> TableSchema {
    let meta = |name: &str, data_type: DataType, source_type: &str| Column {
        name: name.to_owned(),
        data_type,
        nullable: false,
        source_type: source_type.to_owned(),
        initial_default: None,
        former_names: Vec::new(),
    };
    let mut columns = vec![
        meta(OP, DataType::Utf8, "text"),
        meta(POSITION, DataType::Utf8, "text"),
        meta(
            COMMIT_TS,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "timestamptz",
        ),
        meta(TX, DataType::Utf8, "text"),
        meta(SEQ, DataType::Int64, "bigint"),
    ];
    columns.extend(schema.columns.iter().map(|c| Column {
        nullable: true,
        initial_default: None,
        ..c.clone()
    }));
    TableSchema {
        id: changelog_id(&schema.id),
        columns,
        primary_key: Vec::new(),
    }
}

/// The settings a changelog table is created with: partitioned by day of `_cdc_commit_ts`, the
/// properties of its table's sections.
pub(crate) fn changelog_settings(table: &TableSettings) -> TableSettings {
    let origin = Origin {
        file: "cdcd".into(),
        key: "changelog".into(),
    };
    TableSettings {
        partition_by: Some(Configured {
            value: vec![PartitionField {
                column: COMMIT_TS.into(),
                transform: Transform::Day,
            }],
            origin,
        }),
        sort_by: None,
        properties: table.properties.clone(),
        buckets: None,
        changelog: false,
        changelog_retention: None,
        deletes: Default::default(),
        row_metadata: false,
        // JSON as text: the changelog is for every engine, and a variant needs a keyed table.
        json: Default::default(),
        json_columns: None,
        // Spatial as the source sends it, for the same reasons.
        spatial: Default::default(),
    }
}
