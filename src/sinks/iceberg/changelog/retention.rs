//! [`ChangelogRetention`]: `changelog_retention` on a changelog table, in its maintenance cycle
//! (`maintenance/cycle.rs`, before compaction): the data files of every day partition of
//! `_cdc_commit_ts` that ended before now − retention leave the table in one `delete` snapshot
//! (Iceberg-Java's `DeleteFiles`: whole data files removed, no delete file written, so the
//! changelog stays readable by every engine). Partitions are whole days, so a partition goes
//! when its last possible change is older than the retention, never half of it.
//!
//! The snapshot carries the changelog's checkpoint, counter included (`cdcd.changelog_seq`):
//! `_cdc_seq` goes on from the counter, not from the rows left, so it never repeats a value
//! the dropped rows had. It is committed under the table's slot lock, as any commit of the table
//! in this process; another engine's commit in between makes the publish a conflict, and the
//! next cycle decides again.
//!
//! A changelog that holds a delete file (cdcd writes none; another engine might) is left alone,
//! with a warning: dropping a data file would leave that delete file pointing at nothing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use iceberg::spec::{
    Literal, ManifestContentType, Operation, PrimitiveLiteral, Snapshot, Summary, TableMetadata,
    Transform,
};

use super::COMMIT_TS;
use crate::changelog::TableId;
use crate::checkpoint::LEASE_EPOCH_KEY;
use crate::sinks::iceberg::commit::manifest_list::{self, ListTarget};
use crate::sinks::iceberg::commit::summary::bytes_of;
use crate::sinks::iceberg::commit::{publish, Names};
use crate::sinks::iceberg::files::manifest::{self, LiveFile, ManifestTarget};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::maintenance::metadata_log;
use crate::sinks::iceberg::pipeline_checkpoint;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::tables::Tables;
use crate::sinks::SinkError;

const DAY_MS: i64 = 86_400_000;

/// What one retention commit dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub partitions: u64,
    pub files: u64,
    pub records: u64,
}

/// The retention of one changelog table; see the module doc.
pub(in crate::sinks::iceberg) struct ChangelogRetention<'a> {
    tables: &'a Tables,
    table: &'a TableId,
}

impl<'a> ChangelogRetention<'a> {
    pub(in crate::sinks::iceberg) fn new(
        tables: &'a Tables,
        table: &'a TableId,
    ) -> ChangelogRetention<'a> {
        ChangelogRetention { tables, table }
    }

    /// `changelog_retention` of the table this changelog is of (`None`: not a changelog table
    /// this process knows, or no retention).
    fn retention(&self) -> Result<Option<Duration>, SinkError> {
        let tables = self.tables;
        let source = tables
            .changelogs
            .lock()
            .ok()
            .and_then(|c| c.get(self.table).cloned());
        match source {
            Some(source) => Ok(tables.settings.resolve(&source)?.changelog_retention),
            None => Ok(None),
        }
    }

    /// Drops the partitions past the retention, at `now_ms`; `Ok(None)` when there is none.
    pub(in crate::sinks::iceberg) async fn commit(&self) -> Result<Option<Dropped>, SinkError> {
        let Some(retention) = self.retention()? else {
            return Ok(None);
        };
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff_ms = chrono::Utc::now()
            .timestamp_millis()
            .saturating_sub(retention_ms);
        let (tables, table) = (self.tables, self.table);
        let slot = tables.slot(table);
        let mut guard = slot.lock().await;
        let Some(current) = tables.load(table).await? else {
            return Ok(None);
        };
        let meta = &current.metadata;
        if meta.current_snapshot().is_none() {
            return Ok(None);
        }
        if !guard.live.as_ref().is_some_and(|l| l.describes(meta)) {
            guard.live = Some(LiveState::load(&tables.warehouse, table, meta).await?);
        }
        let Some(live) = guard.live.take() else {
            return Ok(None);
        };
        let expired = expired(meta, &live.files.data, cutoff_ms);
        if expired.is_empty() {
            guard.live = Some(live);
            return Ok(None);
        }
        if !live.files.position_deletes.is_empty() || !live.files.equality_deletes.is_empty() {
            tracing::warn!(table = %table, "the changelog table holds delete files (not cdcd's): changelog_retention leaves it alone");
            guard.live = Some(live);
            return Ok(None);
        }
        // The live state is left out: the next commit reads it back from the table.
        let (next, dropped) = self.stage(&current, &live, &expired).await?;
        let after = tables.commit_metadata(table, &current, next).await?;
        metadata_log::delete_after_commit(
            &tables.warehouse,
            &current,
            &after,
            tables.catalog_for(table).names_previous(),
        );
        tracing::info!(
            table = %table,
            partitions = dropped.partitions,
            files = dropped.files,
            records = dropped.records,
            "changelog retention dropped old day partitions"
        );
        Ok(Some(dropped))
    }

    /// The metadata with the `delete` snapshot that removes `expired` (data files of `live`).
    async fn stage(
        &self,
        current: &Loaded,
        live: &LiveState,
        expired: &HashMap<&str, i32>,
    ) -> Result<(TableMetadata, Dropped), SinkError> {
        let (tables, table) = (self.tables, self.table);
        let meta = &current.metadata;
        let names = Names::new(meta);
        let touched: HashSet<&str> = live
            .files
            .data
            .iter()
            .filter(|f| expired.contains_key(f.file.file_path()))
            .map(|f| &*f.manifest)
            .collect();
        let mut manifests = Vec::with_capacity(live.manifests.len());
        let mut removed = Vec::new();
        for (i, m) in live.manifests.iter().enumerate() {
            if !touched.contains(m.manifest_path.as_str()) {
                if m.has_added_files() || m.has_existing_files() {
                    manifests.push(m.clone());
                }
                continue;
            }
            let spec = meta
                .partition_spec_by_id(m.partition_spec_id)
                .ok_or_else(|| SinkError::Data {
                    table: table.clone(),
                    detail: format!("partition spec {} is not in the table", m.partition_spec_id),
                })?;
            let target = ManifestTarget {
                version: meta.format_version(),
                schema: meta.current_schema().clone(),
                spec: spec.clone(),
                snapshot_id: names.snapshot_id,
                deletes: m.content == ManifestContentType::Deletes,
            };
            let (kept, gone) = manifest::rewrite_manifest(
                &tables.warehouse,
                names.rewritten_manifest(i),
                &target,
                m,
                |f| expired.contains_key(f.file_path()),
            )
            .await?;
            manifests.extend(kept);
            removed.extend(gone);
        }
        let parent = meta.current_snapshot();
        let list_path = names.manifest_list();
        let list = ListTarget {
            version: meta.format_version(),
            snapshot_id: names.snapshot_id,
            parent: parent.map(|s| s.snapshot_id()),
            sequence: names.sequence,
            first_row_id: meta.next_row_id(),
        };
        let (added_rows, _) =
            manifest_list::write_manifest_list(&tables.warehouse, &list_path, &list, manifests)
                .await?;
        let days: HashSet<i32> = expired.values().copied().collect();
        let dropped = Dropped {
            partitions: days.len() as u64,
            files: removed.len() as u64,
            records: removed.iter().map(|f| f.record_count()).sum(),
        };
        let summary = self.summary(meta, &removed)?;
        let builder = Snapshot::builder()
            .with_snapshot_id(names.snapshot_id)
            .with_parent_snapshot_id(parent.map(|s| s.snapshot_id()))
            .with_sequence_number(names.sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(summary)
            .with_schema_id(meta.current_schema_id());
        let snapshot = if meta.format_version() >= iceberg::spec::FormatVersion::V3 {
            builder
                .with_row_range(list.first_row_id, added_rows)
                .build()
        } else {
            builder.build()
        };
        Ok((publish::with_snapshot(table, current, snapshot)?, dropped))
    }

    /// The `delete` summary: the removed files' counts, the totals moved from the parent's, and
    /// the changelog's checkpoint (with its `_cdc_seq` counter) carried forward.
    fn summary(
        &self,
        meta: &TableMetadata,
        removed: &[iceberg::spec::DataFile],
    ) -> Result<Summary, SinkError> {
        let parent = meta.current_snapshot();
        let previous = |k: &str| -> u64 {
            parent
                .and_then(|s| s.summary().additional_properties.get(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let files = removed.len() as u64;
        let records: u64 = removed.iter().map(|f| f.record_count()).sum();
        let bytes: u64 = removed.iter().map(bytes_of).sum();
        let mut p: HashMap<String, String> = HashMap::new();
        let mut put = |k: &str, v: u64| {
            p.insert(k.to_owned(), v.to_string());
        };
        put("deleted-data-files", files);
        put("deleted-records", records);
        put("removed-files-size", bytes);
        put(
            "total-data-files",
            previous("total-data-files").saturating_sub(files),
        );
        put(
            "total-records",
            previous("total-records").saturating_sub(records),
        );
        put(
            "total-files-size",
            previous("total-files-size").saturating_sub(bytes),
        );
        for k in [
            "total-delete-files",
            "total-position-deletes",
            "total-equality-deletes",
        ] {
            put(k, previous(k));
        }
        if let Some(cp) = pipeline_checkpoint(&self.tables.pipeline, meta)? {
            p.extend(cp.to_properties());
            let epoch = self.tables.warehouse.lease_epoch();
            if epoch > 0 {
                p.insert(LEASE_EPOCH_KEY.to_owned(), epoch.to_string());
            }
        }
        Ok(Summary {
            operation: Operation::Delete,
            additional_properties: p,
        })
    }
}

/// The data files (path → day) of day partitions of `_cdc_commit_ts` that ended at or before
/// `cutoff_ms`. A file of a spec without that field is kept.
fn expired<'f>(
    meta: &TableMetadata,
    data: &'f [LiveFile],
    cutoff_ms: i64,
) -> HashMap<&'f str, i32> {
    let Some(source_id) = meta.current_schema().field_by_name(COMMIT_TS).map(|f| f.id) else {
        return HashMap::new();
    };
    // Per spec: the position of the day field in the partition tuple.
    let day_at = |spec_id: i32| {
        meta.partition_spec_by_id(spec_id)?
            .fields()
            .iter()
            .position(|f| f.source_id == source_id && f.transform == Transform::Day)
    };
    let mut out = HashMap::new();
    for f in data {
        let Some(at) = day_at(f.spec_id) else {
            continue;
        };
        let Some(Some(Literal::Primitive(PrimitiveLiteral::Int(day)))) =
            f.file.partition().fields().get(at)
        else {
            continue;
        };
        let ends_ms = (i64::from(*day) + 1).saturating_mul(DAY_MS);
        if ends_ms <= cutoff_ms {
            out.insert(f.file.file_path(), *day);
        }
    }
    out
}
