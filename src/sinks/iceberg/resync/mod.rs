//! Resync (`cdcd resync --table T`): the table is copied again into a new lineage beside the
//! live one, and the complete lineage replaces the live table in one metadata commit.
//!
//! Where it sits: the pipeline marks a requested table ([`begin`]) before it
//! reads the checkpoints; from then on this sink sends everything about the table to its
//! lineage, a table of its own at `<table>/resync-<id>/` kept through the filesystem catalog
//! whatever `[sink.catalog]` says, with a primary-key index of its own. Who fills it is the
//! pipeline's business (`pipeline/resync.rs`): a copy at start (chunked, resumable, with an
//! upsert window, the live table frozen meanwhile), or a copy job beside the streaming pipeline,
//! through a second sink marked [`ResyncMode::CopyOnly`] while this one keeps committing the live
//! table. Readers read the live table until the swap.
//!
//! The swap ([`ResyncSwap`], `swap.rs`): the lineage's commit that its [`ResyncMode`] names (the end
//! of a copy at start; for an online copy, the first complete commit at or past the live
//! table's checkpoint, so readers never see the table go back) is followed, under the same slot
//! lock, by one commit of the live table through the configured catalog: one new snapshot on its
//! head holding the lineage's current state (its manifests, checkpoint and schema), with
//! `cdcd.resync-id = <id>` in the table's properties (`rebase.rs`). Like Iceberg-Java's REPLACE
//! TABLE: same table, new lineage; the old snapshots leave the metadata, and their files become
//! orphans that `cdcd cleanup` removes (the cleanup keeps a lineage under way: `cleanup.rs`). Data files stay where the lineage wrote them, under the
//! table's directory; later commits write to the table's own `data/` again.
//!
//! Partition specs: the lineage is created with the live table's specs and sort orders under the
//! same ids (`layout.rs`), because the manifests the swap carries name their spec by id; the
//! swap refuses, naming the table, a lineage whose specs differ from the live table's under those
//! ids rather than carry manifests a reader would read under another spec. Rewriting the
//! manifests under a matching spec would make the refused cases work too; it is not built: the
//! refusal is the correct stop, and the known way into it (a live table whose column ids the
//! fresh lineage does not share) wants the lineage to take the live ids instead.
//!
//! Why this is exactly once: the lineage is an ordinary cdcd table with its own checkpoint, so a
//! crash anywhere before the swap resumes the lineage's copy or stream like any table's (the
//! request stays until the swap, `checkpoint/resync.rs`). The swap itself is one catalog commit (a
//! create-if-absent metadata put, a catalog row update, a REST `update-table`): before it readers see the old table, after it the
//! new one, never a mix. A crash after it finds `cdcd.resync-id` in the live table's
//! properties: the resync is done ([`ResyncState::Done`]). Between the lineage's commit and the
//! swap nothing is lost either: the lineage is durable and complete, and the restart's
//! [`begin`] swaps before the pipeline reads the table's checkpoint. Rows
//! deleted at the source but still in the old table are in no copied range, so the new lineage
//! does not have them.
//!
//! What readers see after the swap is what they see of a table added to `source.tables` after
//! its copy: complete at the position streaming resumed from, with the upsert window
//! (`cdcd.upsert_until`) still replaying the changes the copy may already hold; the window's
//! bookkeeping moves with the lineage's checkpoint, so it closes on the live table as it would
//! have on the lineage.
//!
//! The swap is one ordinary commit on top of the live table's head, the same for every catalog
//! (`rebase.rs`), so a REST catalog takes it as it takes any commit.

use std::sync::Arc;

use object_store::ObjectStoreExt;

use super::tables::Tables;
use crate::changelog::TableId;
use crate::sinks::resync::Lineage;
pub use crate::sinks::resync::{lineage_location, RESYNC_ID_PROPERTY};
use crate::sinks::{ResyncMode, ResyncState, SinkError};
use crate::storage::Warehouse;

pub(super) mod layout;
mod rebase;
mod swap;

pub(super) use swap::ResyncSwap;

/// [`crate::sinks::Sink::resync`]: `Done` when the live table already carries `id`,
/// else `table` is marked so its checkpoint and commits go to the lineage.
pub(super) async fn begin(
    tables: &Tables,
    table: &TableId,
    id: &str,
    mode: ResyncMode,
) -> Result<ResyncState, SinkError> {
    // Under the table's slot lock: a maintenance cycle or commit of the live table never
    // sees the switch halfway.
    let slot = tables.slot(table);
    let mut guard = slot.lock().await;
    let location = tables.table_location(table);
    let mut live = tables
        .catalog
        .load(&tables.warehouse, &tables.table_ref(table, &location))
        .await?
        .map(Arc::new);
    if live.is_none() && tables.resync_id(table).is_none() {
        // A table the catalog does not know but whose directory holds metadata (the pipeline
        // ran with the filesystem catalog before): registered first, as every start does, so
        // the swap replaces it rather than registering it over the lineage.
        live = tables.adopt(table).await?;
    }
    let live_checkpoint = match &live {
        Some(l) => super::pipeline_checkpoint(&tables.pipeline, &l.metadata)?,
        None => None,
    };
    let lineage = Lineage::new(
        id,
        mode,
        live_checkpoint.as_ref().map(|cp| cp.position.clone()),
    );
    if tables.resync_id(table).is_some_and(|ours| ours == id) {
        if let Ok(mut resyncs) = tables.resyncs.lock() {
            resyncs.insert(table.clone(), lineage);
        }
        return Ok(ResyncState::UnderWay {
            live: live_checkpoint,
        });
    }
    let done = live
        .as_ref()
        .and_then(|l| l.metadata.properties().get(RESYNC_ID_PROPERTY))
        .is_some_and(|done| done == id);
    if done {
        forget_lineage_metadata(&tables.warehouse, table, &lineage_location(&location, id)).await;
        return Ok(ResyncState::Done);
    }
    if let Ok(mut resyncs) = tables.resyncs.lock() {
        resyncs.insert(table.clone(), lineage.clone());
    }
    // The cached metadata is the live table's; the next load reads the lineage.
    tables.remember(table, None);
    // A lineage whose copy completed before a crash took the swap with it: swap now (when
    // its mode lets this position swap; else a later commit does).
    if let Some(loaded) = tables.load(table).await? {
        let swaps = super::pipeline_checkpoint(&tables.pipeline, &loaded.metadata)?
            .is_some_and(|cp| lineage.swaps_at(&cp.position));
        if swaps {
            ResyncSwap::new(tables, table, id, &loaded)
                .commit(&mut guard)
                .await?;
            return Ok(ResyncState::Done);
        }
    }
    tracing::info!(table = %table, lineage = %lineage_location(&location, id), "resync: the table's commits go to a new lineage until its copy is complete");
    Ok(ResyncState::UnderWay {
        live: live_checkpoint,
    })
}

/// Gives up resync `id`'s lineage (never swapped): without its metadata its directory is no
/// longer a table of its own, and its files are the live table's orphans.
pub(super) async fn abandon(tables: &Tables, table: &TableId, id: &str) {
    if let Ok(mut resyncs) = tables.resyncs.lock() {
        if resyncs.get(table).is_some_and(|l| l.id == id) {
            resyncs.remove(table);
        }
    }
    let location = tables.table_location(table);
    forget_lineage_metadata(&tables.warehouse, table, &lineage_location(&location, id)).await;
}

/// Removes the lineage's own metadata files after the swap, so its directory is no longer a
/// table of its own: the files the live table references there stay, the rest become the
/// live table's orphans. Best effort (a leftover only keeps a few small files).
pub(super) async fn forget_lineage_metadata(warehouse: &Warehouse, table: &TableId, lineage: &str) {
    use futures::TryStreamExt;
    let Ok(prefix) = warehouse.path(&format!("{lineage}/metadata")) else {
        return;
    };
    let listed: Result<Vec<object_store::ObjectMeta>, _> =
        warehouse.store().list(Some(&prefix)).try_collect().await;
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(table = %table, lineage, error = %e, "resync: cannot list the lineage's metadata to remove it; `cdcd cleanup` keeps its files");
            return;
        }
    };
    for o in listed {
        let name = o.location.filename().unwrap_or_default();
        if !(name.ends_with(".metadata.json") || name == "version-hint.text") {
            continue;
        }
        if let Err(e) = warehouse.store().delete(&o.location).await {
            tracing::warn!(table = %table, file = %o.location, error = %e, "resync: cannot remove a metadata file of the lineage");
        }
    }
}
