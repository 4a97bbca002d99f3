//! The swap's commit (`ResyncSwap`, `swap.rs`): the lineage's current state becomes one new
//! `overwrite` snapshot on top of the live table's head, through whichever catalog the table
//! is in.
//!
//! Why a new snapshot rather than the lineage's own ones: a catalog applies a snapshot only
//! when its sequence number is above the table's `last-sequence-number`, and on v3 only when its
//! `first-row-id` is not below the table's `next-row-id` (Iceberg spec, "Sequence Numbers" and
//! "Row Lineage"; a REST server checks both when it applies `add-snapshot`). The lineage's
//! snapshots start again at 1 and at row id 0. One snapshot built on the live head keeps both
//! rules, so the swap is an ordinary commit: a REST catalog is sent `add-schema`,
//! `set-current-schema`, `add-snapshot`, `set-snapshot-ref`, `remove-snapshots` and
//! `set-properties` (`catalog/rest/updates.rs`), the filesystem and SQL catalogs get the next
//! metadata file. Like Iceberg-Java's REPLACE TABLE the table keeps its identity (uuid,
//! location, properties, metadata log) and its old snapshots leave the metadata; their files
//! become orphans for `cdcd cleanup`.
//!
//! What the new snapshot keeps of the lineage:
//! - its current manifests, unchanged and with their sequence numbers (a manifest carried into
//!   a later snapshot always keeps its own): the data sequence numbers the lineage's files
//!   inherit, and so which equality deletes apply to which data files (v2), stay the lineage's.
//!   Every later commit has a higher number than both lineages, so its deletes apply to all of
//!   them.
//! - v3 row ids: the new manifest list gives the lineage's data manifests new first row ids
//!   from the live table's `next-row-id` (the list writer assigns one to a data manifest that
//!   has none), so no row id of the replaced table is reused. Entries that a manifest merge of
//!   the lineage wrote with explicit first row ids keep the lineage's numbers.
//! - its checkpoint (the newest one on its snapshot chain) and totals, in the summary, with the
//!   lease epoch this daemon writes under.
//! - its current snapshot id, unless the live table has used it: the lineage's primary-key index
//!   covers that snapshot, so it serves the table from the swap on without a rebuild.
//! - its current schema, added to the live table (field ids as the lineage's files carry them;
//!   `last-column-id` never goes down).

use std::collections::HashMap;

use iceberg::spec::{
    ManifestFile, Operation, Snapshot, Summary, TableMetadata, TableMetadataBuilder,
};

use super::RESYNC_ID_PROPERTY;
use crate::changelog::TableId;
use crate::checkpoint::LEASE_EPOCH_KEY;
use crate::sinks::iceberg::commit::manifest_list::{write_manifest_list, ListTarget};
use crate::sinks::iceberg::commit::{publish, Names};
use crate::sinks::iceberg::files::manifest::load_manifests;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The lineage head's summary keys the swap keeps: the table's totals (Iceberg's `total-*`).
/// The others describe that snapshot's own changes, or are cdcd's, written afresh.
const TOTALS_PREFIX: &str = "total-";

/// The swap of resync `id`'s lineage into the live table of `table`.
pub(crate) struct Rebase<'a> {
    pub table: &'a TableId,
    pub pipeline: &'a str,
    pub id: &'a str,
    /// The live table as the catalog gave it: what the commit replaces.
    pub live: &'a Loaded,
    /// The lineage's newest metadata.
    pub lineage: &'a Loaded,
}

impl Rebase<'_> {
    fn corrupt(&self, detail: impl std::fmt::Display) -> SinkError {
        SinkError::Data {
            table: self.table.clone(),
            detail: format!("resync: building the swap from the lineage: {detail}"),
        }
    }

    /// Writes the new snapshot's manifest list under the live table and returns the live
    /// table's next metadata.
    pub async fn metadata(&self, warehouse: &Warehouse) -> Result<TableMetadata, SinkError> {
        let lineage = &self.lineage.metadata;
        let Some(head) = lineage.current_snapshot() else {
            return Err(self.corrupt("the lineage has no snapshot"));
        };
        let Some(checkpoint) = super::super::pipeline_checkpoint(self.pipeline, lineage)? else {
            return Err(self.corrupt("the lineage holds no checkpoint of this pipeline"));
        };
        let base = self.with_lineage_schema()?;
        let meta = &base.metadata;
        let mut names = Names::new(meta);
        if meta.snapshot_by_id(head.snapshot_id()).is_none() {
            names.snapshot_id = head.snapshot_id();
        }
        let manifests: Vec<ManifestFile> =
            load_manifests(warehouse, head.manifest_list(), lineage.format_version())
                .await?
                .into_iter()
                .map(fresh_row_ids)
                .collect();
        for m in &manifests {
            self.same_spec(meta, m.partition_spec_id)?;
        }
        self.same_spec(meta, lineage.default_partition_spec_id())?;
        let list_path = names.manifest_list();
        // v3 row ids: the lineage's rows may store ids below its own `next-row-id` (explicit
        // `first_row_id`s of carried entries, `_row_id` columns of compaction outputs), so the
        // ids its manifests inherit start at or past it, and at or past the live table's. The
        // snapshot's range covers the gap (`added-rows` is an upper bound, spec "Row Lineage").
        let first_row_id = meta.next_row_id().max(lineage.next_row_id());
        let gap = first_row_id - meta.next_row_id();
        let target = ListTarget {
            version: meta.format_version(),
            snapshot_id: names.snapshot_id,
            parent: meta.current_snapshot().map(|s| s.snapshot_id()),
            sequence: names.sequence,
            first_row_id,
        };
        let (added_rows, _) =
            write_manifest_list(warehouse, &list_path, &target, manifests).await?;
        let mut properties: HashMap<String, String> = head
            .summary()
            .additional_properties
            .iter()
            .filter(|(k, _)| k.starts_with(TOTALS_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        properties.extend(checkpoint.to_properties());
        // As every commit does: the lease this daemon writes under (`sinks/mod.rs`, fencing).
        let epoch = warehouse.lease_epoch();
        if epoch > 0 {
            properties.insert(LEASE_EPOCH_KEY.to_owned(), epoch.to_string());
        }
        let snapshot = Snapshot::builder()
            .with_snapshot_id(names.snapshot_id)
            .with_parent_snapshot_id(target.parent)
            .with_sequence_number(names.sequence)
            .with_timestamp_ms(
                chrono::Utc::now()
                    .timestamp_millis()
                    .max(meta.last_updated_ms()),
            )
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation: Operation::Overwrite,
                additional_properties: properties,
            })
            .with_schema_id(meta.current_schema_id());
        let snapshot = match meta.format_version() {
            iceberg::spec::FormatVersion::V3 => snapshot
                .with_row_range(meta.next_row_id(), gap + added_rows)
                .build(),
            _ => snapshot.build(),
        };
        let replaced: Vec<i64> = meta.snapshots().map(|s| s.snapshot_id()).collect();
        let mut table_properties = meta.properties().clone();
        table_properties.insert(RESYNC_ID_PROPERTY.to_owned(), self.id.to_owned());
        TableMetadataBuilder::new_from_metadata(meta.clone(), Some(self.live.file.clone()))
            .set_default_partition_spec(lineage.default_partition_spec_id())
            .and_then(|b| b.add_sort_order(lineage.default_sort_order().as_ref().clone()))
            .and_then(|b| b.set_default_sort_order(TableMetadataBuilder::LAST_ADDED as i64))
            .and_then(|b| b.set_branch_snapshot(snapshot, "main"))
            .map(|b| b.remove_snapshots(&replaced))
            .and_then(|b| b.set_properties(table_properties))
            .and_then(|b| b.build())
            .map(|r| r.metadata)
            .map_err(|e| self.corrupt(e))
    }

    /// Refuses the swap unless the live table's spec `spec_id` (`live`: with the lineage's schema
    /// as current) is the lineage's: same fields, field ids, names, transforms and source field
    /// ids (both bound to the lineage's schema now). The lineage was created with the live
    /// table's specs (`layout.rs`); they differ only when a spec's column left the schema or
    /// another engine changed the live table's specs meanwhile, and then readers would take the
    /// lineage's partition tuples for another spec's.
    fn same_spec(&self, live: &TableMetadata, spec_id: i32) -> Result<(), SinkError> {
        let words = |m: &TableMetadata| {
            m.partition_spec_by_id(spec_id).map(|s| {
                s.fields()
                    .iter()
                    .map(|f| (f.source_id, f.field_id, f.name.clone(), f.transform))
                    .collect::<Vec<_>>()
            })
        };
        let ours = words(&self.lineage.metadata);
        if ours.is_some() && ours == words(live) {
            return Ok(());
        }
        Err(SinkError::Data {
            table: self.table.clone(),
            detail: format!(
                "resync: the lineage's partition spec {spec_id} ({ours:?}) is not the live table's \
                 spec {spec_id} ({:?}); the swap is refused, since readers would read the \
                 lineage's files with the wrong spec. The live table's specs changed after the \
                 resync began, or a partition column left the schema: stop cdcd, delete the \
                 lineage's directory `resync-{id}` under the table's and start again (the resync \
                 copies the table again under the live table's current specs)",
                words(live),
                id = self.id,
            ),
        })
    }

    /// The live table with the lineage's format version (when newer) and its current schema
    /// as the current one; not yet published (it goes out with the snapshot).
    fn with_lineage_schema(&self) -> Result<Loaded, SinkError> {
        let (live, lineage) = (&self.live.metadata, &self.lineage.metadata);
        let mut meta = live.clone();
        if lineage.format_version() > live.format_version() {
            meta = TableMetadataBuilder::new_from_metadata(meta, None)
                .upgrade_format_version(lineage.format_version())
                .and_then(|b| b.build())
                .map(|r| r.metadata)
                .map_err(|e| self.corrupt(e))?;
        }
        let upgraded = Loaded {
            version: self.live.version,
            metadata: meta,
            file: self.live.file.clone(),
        };
        publish::with_schema(
            self.table,
            &upgraded,
            lineage.current_schema().as_ref().clone(),
        )
    }
}

/// `manifest` without its first row id when it lists data files, so the new list assigns it
/// ids from the live table's `next-row-id`.
fn fresh_row_ids(mut manifest: ManifestFile) -> ManifestFile {
    if manifest.content == iceberg::spec::ManifestContentType::Data {
        manifest.first_row_id = None;
    }
    manifest
}
