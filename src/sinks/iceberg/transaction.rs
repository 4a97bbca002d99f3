//! The multi-table commit ([`MultiTableCommit`]): several tables' commits of one flush made
//! visible together, staged table by table as one table's commit stages ([`Tables::stage`]),
//! then published in one REST catalog transaction (`catalog/rest.rs`, `commit_many`), so a source
//! transaction that touched several tables appears in all of them at once, or in none. Each table
//! keeps its own checkpoint.
//!
//! Locks: every table's slot is held from staging to the end of the publish, taken in table
//! order; maintenance holds one slot at a time, so no two holders wait on each other.
//! A conflict (another writer committed to one of the tables first) re-plans all of them, on the
//! same rule as one table's commit: only when every table is cdcd's last state plus other
//! writers' commits.
//!
//! A table under resync (`resync/`) is not part of the transaction: its commits go to its
//! lineage, a table of the filesystem catalog that the REST catalog does not know, and the one
//! its mode names swaps the lineage into the live table, exactly as without the endpoint
//! (`IcebergSink::commit_once`); the sink sorts the tables out (`IcebergSink::commit_together`,
//! mod.rs). Until the swap, readers see the live table, which takes no commit
//! meanwhile, so the transaction could not make the lineage's rows visible with the others'
//! anyway. Its commit runs after the other tables' transaction: until the swap lands the table is
//! behind the others, never ahead.

use std::sync::Arc;

use super::catalog::rest::RestCatalog;
use super::catalog::TableRef;
use super::commit::Staged;
use super::files::metadata::Loaded;
use super::tables::Tables;
use super::{maintenance, only_others_committed, COMMIT_ATTEMPTS};
use crate::sinks::{CommitStats, MaintenanceWanted, SinkError, TableCommit};

/// One flush's commits of several tables (none under resync), published in one REST catalog
/// transaction; see the module doc.
pub(super) struct MultiTableCommit<'a> {
    tables: &'a Tables,
    rest: &'a RestCatalog,
    /// Told of a table whose small files call for a maintenance cycle, as after any commit.
    wanted: &'a MaintenanceWanted,
}

impl<'a> MultiTableCommit<'a> {
    pub(super) fn new(
        tables: &'a Tables,
        rest: &'a RestCatalog,
        wanted: &'a MaintenanceWanted,
    ) -> MultiTableCommit<'a> {
        MultiTableCommit {
            tables,
            rest,
            wanted,
        }
    }

    /// Commits `commits` (no table under resync) in one catalog transaction, re-planned after a
    /// conflict at most [`COMMIT_ATTEMPTS`] times. The stats are in `commits`' order.
    pub(super) async fn commit(
        &self,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        let tables = self.tables;
        for attempt in 1.. {
            let before: Vec<Option<Arc<Loaded>>> = commits
                .iter()
                .map(|c| tables.cached(&c.schema.id))
                .collect();
            let conflict = match self.attempt(commits).await {
                Err(e @ SinkError::CommitConflict { .. }) => e,
                other => return other,
            };
            if attempt >= COMMIT_ATTEMPTS {
                return Err(conflict);
            }
            for (c, before) in commits.iter().zip(before) {
                let Some(before) = before else {
                    return Err(conflict);
                };
                let Some(now) = tables.load(&c.schema.id).await? else {
                    return Err(conflict);
                };
                if !only_others_committed(&tables.pipeline, &before.metadata, &now.metadata)? {
                    tracing::warn!(table = %c.schema.id, "the table moved other than by other engines' commits on top of cdcd's last one; stopping rather than guessing");
                    return Err(conflict);
                }
            }
            tracing::info!(
                tables = commits.len(),
                attempt,
                "another writer committed to one of the tables first; planning the transaction again on top of it"
            );
        }
        unreachable!("the loop returns")
    }

    /// One attempt: every table's slot locked in table order, each table staged, all published
    /// in one transaction, then each table's cache and index advanced.
    async fn attempt(&self, commits: &[TableCommit<'_>]) -> Result<Vec<CommitStats>, SinkError> {
        let tables = self.tables;
        let mut order: Vec<usize> = (0..commits.len()).collect();
        order.sort_by_key(|&i| commits[i].schema.id.to_string());
        let slots: Vec<_> = order
            .iter()
            .map(|&i| tables.slot(&commits[i].schema.id))
            .collect();
        let mut guards = Vec::with_capacity(slots.len());
        for slot in &slots {
            guards.push(slot.lock().await);
        }
        // The catalog knows only live tables: a lineage's commit named as its live table would
        // be refused, or worse, land there (see the module doc).
        if let Some(c) = commits
            .iter()
            .find(|c| tables.resync_id(&c.schema.id).is_some())
        {
            return Err(SinkError::Data {
                table: c.schema.id.clone(),
                detail: "a table under resync cannot join a catalog transaction; its commits go to its lineage".into(),
            });
        }
        let locations: Vec<String> = order
            .iter()
            .map(|&i| tables.table_location(&commits[i].schema.id))
            .collect();
        let mut staged = Vec::with_capacity(order.len());
        for ((guard, &i), location) in guards.iter_mut().zip(&order).zip(&locations) {
            let (delta, Staged { next, after }, cached) = tables.stage(guard, commits[i]).await?;
            staged.push((i, location, delta, next, after, cached));
        }
        let items: Vec<(TableRef<'_>, &Loaded, &iceberg::spec::TableMetadata)> = staged
            .iter()
            .map(|(i, location, delta, next, _, _)| {
                (
                    tables.table_ref(&commits[*i].schema.id, location),
                    delta.base_loaded().as_ref(),
                    next,
                )
            })
            .collect();
        let published = self.rest.commit_many(&tables.warehouse, &items).await;
        drop(items);
        let published = match published {
            Ok(p) => p,
            Err(e) => {
                for c in commits {
                    tables.remember(&c.schema.id, None);
                }
                return Err(e);
            }
        };
        let mut stats: Vec<Option<CommitStats>> = vec![None; commits.len()];
        let mut landed = Vec::with_capacity(commits.len());
        for ((i, _, delta, _, after, cached), published) in staged.into_iter().zip(published) {
            let table = &commits[i].schema.id;
            let published = Arc::new(published);
            landed.push((table, Arc::clone(&published)));
            maintenance::metadata_log::delete_after_commit(
                &tables.warehouse,
                delta.base_loaded(),
                &published,
                false,
            );
            tables.remember(table, Some(published));
            stats[i] = Some(delta.finish(after, cached));
        }
        // `landed` is in the order of the guards (both follow `order`).
        for (guard, (table, published)) in guards.iter().zip(landed) {
            maintenance::ask_if_due(self.wanted, table, &published.metadata, guard.live.as_ref());
        }
        stats
            .into_iter()
            .map(|s| {
                s.ok_or_else(|| SinkError::Corrupt {
                    path: "transaction".into(),
                    detail: "a table of the transaction has no result".into(),
                })
            })
            .collect()
    }
}
