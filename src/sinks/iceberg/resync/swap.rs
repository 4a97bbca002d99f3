//! The resync swap ([`ResyncSwap`]): a complete lineage replaces the live table in one commit of
//! the live table through the configured catalog (`rebase.rs` builds its metadata), under the
//! table's slot lock, right after the lineage's commit the resync's mode names (the module doc of
//! `resync/mod.rs` says which and why this is exactly once).

use std::sync::Arc;

use super::rebase::Rebase;
use super::{forget_lineage_metadata, lineage_location, RESYNC_ID_PROPERTY};
use crate::changelog::TableId;
use crate::sinks::iceberg::catalog::TableRef;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::tables::{TableSlot, Tables};
use crate::sinks::SinkError;

/// How often the swap's commit is tried when another writer commits to the live table first.
const SWAP_ATTEMPTS: u32 = 5;

/// Replaces the live `table` with resync `id`'s lineage, whose newest metadata is `lineage`.
pub(in crate::sinks::iceberg) struct ResyncSwap<'a> {
    tables: &'a Tables,
    table: &'a TableId,
    id: &'a str,
    lineage: &'a Loaded,
}

impl<'a> ResyncSwap<'a> {
    pub(in crate::sinks::iceberg) fn new(
        tables: &'a Tables,
        table: &'a TableId,
        id: &'a str,
        lineage: &'a Loaded,
    ) -> ResyncSwap<'a> {
        ResyncSwap {
            tables,
            table,
            id,
            lineage,
        }
    }

    /// Replaces the live table with the lineage. Called with the table's slot lock held (`_held`:
    /// the swap is one of the table's commits), right after the lineage's commit. Another
    /// writer's commit to the live table meanwhile is replaced too (REPLACE TABLE semantics),
    /// after reloading it. Never answers `CommitConflict`: the lineage's commit is durable, so
    /// the caller must not plan it again; a failure stops the pipeline and the restart swaps.
    pub(in crate::sinks::iceberg) async fn commit(
        &self,
        _held: &mut TableSlot,
    ) -> Result<(), SinkError> {
        let (tables, table, id, lineage) = (self.tables, self.table, self.id, self.lineage);
        let location = tables.table_location(table);
        let t = tables.table_ref(table, &location);
        for attempt in 1..=SWAP_ATTEMPTS {
            let live = tables.catalog.load(&tables.warehouse, &t).await?;
            // The index of the table being replaced: nothing reads it after the swap.
            let replaced_index = live.as_ref().map(|l| {
                let id = l.metadata.properties().get(RESYNC_ID_PROPERTY);
                tables.index_location_of(table, id.map(String::as_str))
            });
            let live = match live {
                Some(live) => live,
                None => match self.create_live(&t).await {
                    Ok(created) => created,
                    Err(SinkError::CommitConflict { .. }) => continue,
                    Err(e) => return Err(e),
                },
            };
            let next = Rebase {
                table,
                pipeline: &tables.pipeline,
                id,
                live: &live,
                lineage,
            }
            .metadata(&tables.warehouse)
            .await?;
            let committed = tables
                .catalog
                .commit(&tables.warehouse, &t, &live, next)
                .await;
            match committed {
                Ok(swapped) => {
                    let version = swapped.version;
                    if let Ok(mut resyncs) = tables.resyncs.lock() {
                        resyncs.remove(table);
                    }
                    tables.remember(table, Some(Arc::new(swapped)));
                    tracing::info!(table = %table, version, snapshot = ?lineage.metadata.current_snapshot_id(), "resync: the new lineage replaced the live table");
                    let lineage = lineage_location(&location, id);
                    forget_lineage_metadata(&tables.warehouse, table, &lineage).await;
                    if let Some(index) = replaced_index {
                        self.forget_index(index);
                    }
                    return Ok(());
                }
                Err(SinkError::CommitConflict { .. }) if attempt < SWAP_ATTEMPTS => {
                    tracing::info!(table = %table, attempt, "resync: another writer committed to the live table first; replacing it again");
                }
                Err(SinkError::CommitConflict { version, .. }) => {
                    return Err(SinkError::Data {
                        table: table.clone(),
                        detail: format!("resync: other writers kept committing to the live table (version {version}); the lineage is complete and durable, the next start replaces the table with it"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(SinkError::Data {
            table: table.clone(),
            detail: "resync: the swap was not attempted".to_owned(),
        })
    }

    /// An empty live table for the lineage to replace, when the catalog has none (the table was
    /// dropped, or never created): the lineage's schema, properties and format version. The
    /// swap is then the table's first snapshot, as with a live table.
    async fn create_live(&self, t: &TableRef<'_>) -> Result<Loaded, SinkError> {
        let meta = &self.lineage.metadata;
        let empty = publish::new_table(
            t.id,
            t.location,
            meta.current_schema().as_ref().clone(),
            meta.format_version(),
            meta.properties().clone(),
        )?;
        self.tables
            .catalog
            .create(&self.tables.warehouse, t, empty)
            .await
    }

    /// Deletes the replaced table's primary-key index at `index`, in the background (it may be
    /// many files and the swap holds the table's lock). Best effort: a leftover is never read
    /// again (an index covering a snapshot the table does not have is rebuilt).
    fn forget_index(&self, index: String) {
        use futures::{StreamExt, TryStreamExt};
        let warehouse = self.tables.warehouse.clone();
        let table = self.table.clone();
        tokio::spawn(async move {
            let Ok(prefix) = warehouse.path(&index) else {
                return;
            };
            let store = warehouse.store();
            let listed = store.list(Some(&prefix)).map_ok(|o| o.location).boxed();
            let deleted: Vec<_> = store.delete_stream(listed).collect().await;
            let failed = deleted.iter().filter(|d| d.is_err()).count();
            if failed > 0 {
                tracing::warn!(table = %table, index, failed, "resync: some files of the replaced table's index were not deleted; they are never read again");
            }
        });
    }
}
