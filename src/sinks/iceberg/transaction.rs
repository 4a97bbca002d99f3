//! Several tables' commits of one flush made visible together: staged table by table as
//! [`IcebergSink::commit_once`](super::IcebergSink) stages one, then published in one REST catalog
//! transaction (`catalog/rest.rs`, `commit_many`), so a source transaction that touched several
//! tables appears in all of them at once, or in none. Each table keeps its own checkpoint.
//!
//! Locks: every table's slot is held from staging to the end of the publish, taken in table
//! order; maintenance holds one slot at a time, so no two holders wait on each other.
//! A conflict (another writer committed to one of the tables first) re-plans all of them, on the
//! same rule as one table's commit: only when every table is cdcd's last state plus other
//! writers' commits.

use std::sync::Arc;

use super::catalog::rest::RestCatalog;
use super::catalog::TableRef;
use super::commit::{Input, Staged};
use super::metadata::Loaded;
use super::{maintenance, only_others_committed, IcebergSink, COMMIT_ATTEMPTS};
use crate::sinks::{CommitStats, SinkError, TableCommit};

impl IcebergSink {
    /// Commits `commits` in one catalog transaction (see the module doc), re-planned after a
    /// conflict at most [`COMMIT_ATTEMPTS`] times.
    pub(super) async fn commit_together(
        &self,
        rest: &RestCatalog,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        for attempt in 1.. {
            let before: Vec<Option<Arc<Loaded>>> =
                commits.iter().map(|c| self.cached(&c.schema.id)).collect();
            let conflict = match self.together_once(rest, commits).await {
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
                let Some(now) = self.load(&c.schema.id).await? else {
                    return Err(conflict);
                };
                if !only_others_committed(&self.pipeline, &before.metadata, &now.metadata)? {
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

    async fn together_once(
        &self,
        rest: &RestCatalog,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        let mut order: Vec<usize> = (0..commits.len()).collect();
        order.sort_by_key(|&i| commits[i].schema.id.to_string());
        let slots: Vec<_> = order
            .iter()
            .map(|&i| self.table_slot(&commits[i].schema.id))
            .collect();
        let mut guards = Vec::with_capacity(slots.len());
        for slot in &slots {
            guards.push(slot.lock().await);
        }
        let locations: Vec<String> = order
            .iter()
            .map(|&i| self.table_location(&commits[i].schema.id))
            .collect();
        let mut staged = Vec::with_capacity(order.len());
        for ((guard, &i), location) in guards.iter_mut().zip(&order).zip(&locations) {
            let c = &commits[i];
            let input = Input {
                schema: c.schema,
                changes: c.changes,
                checkpoint: c.checkpoint,
            };
            let (delta, Staged { next, after }, cached) = self.stage(guard, input).await?;
            staged.push((i, location, delta, next, after, cached));
        }
        let items: Vec<(TableRef<'_>, &Loaded, &iceberg::spec::TableMetadata)> = staged
            .iter()
            .map(|(i, location, delta, next, _, _)| {
                (
                    self.table_ref(&commits[*i].schema.id, location),
                    delta.base_loaded().as_ref(),
                    next,
                )
            })
            .collect();
        let published = rest.commit_many(&self.warehouse, &items).await;
        drop(items);
        let published = match published {
            Ok(p) => p,
            Err(e) => {
                for c in commits {
                    self.remember(&c.schema.id, None);
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
                &self.warehouse,
                delta.base_loaded(),
                &published,
                false,
            );
            self.remember(table, Some(published));
            stats[i] = Some(delta.finish(after, cached));
        }
        // `landed` is in the order of the guards (both follow `order`).
        for (guard, (table, published)) in guards.iter().zip(landed) {
            self.ask_maintenance_if_due(table, &published.metadata, guard.live.as_ref());
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
